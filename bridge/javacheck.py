"""Java prerequisite check for Spark (Java 17 or newer).

Spark 4 runs on Java 17+. The check runs before a local Spark session starts so
that a missing or old Java gives one line saying what to install, not a Py4J
stack trace.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["JavaMissing", "MIN_JAVA", "find_java", "java_major", "require_java"]

MIN_JAVA = 17
INSTALL_HINT = "install Java 17 or newer (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) and put it on PATH or set JAVA_HOME"


class JavaMissing(RuntimeError):
    """Java is missing or too old; the message is one line saying what to install."""


def find_java(env: dict[str, str] | None = None) -> str | None:
    """The java executable Spark would use: $JAVA_HOME/bin/java, else java on PATH."""
    env = dict(os.environ) if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        cand = Path(home) / "bin" / "java"
        return str(cand) if cand.exists() else None
    return shutil.which("java", path=env.get("PATH"))


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(java: str) -> int | None:
    """The major version `java -version` reports (1.8 -> 8), or None if unreadable."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _VERSION.search(out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2):
        major = int(m.group(2))
    return major


def require_java(env: dict[str, str] | None = None, minimum: int = MIN_JAVA) -> int:
    """Return the Java major version, or raise JavaMissing with a one-line message."""
    env = dict(os.environ) if env is None else env
    java = find_java(env)
    if java is None:
        where = f"JAVA_HOME={env['JAVA_HOME']} has no bin/java" if env.get("JAVA_HOME") else "no java on PATH"
        raise JavaMissing(f"lakegate: Spark needs Java {minimum}+ but found none ({where}); {INSTALL_HINT}")
    major = java_major(java)
    if major is None:
        raise JavaMissing(f"lakegate: Spark needs Java {minimum}+ but '{java} -version' did not run; {INSTALL_HINT}")
    if major < minimum:
        raise JavaMissing(f"lakegate: Spark needs Java {minimum}+ but {java} is Java {major}; {INSTALL_HINT}")
    return major
