import os
import stat

import pytest

from bridge.javacheck import JavaMissing, require_java


def _fake_java(tmp_path, version_line: str):
    """A stand-in `java` executable that prints a given version banner."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_missing_java_is_one_line_saying_what_to_install(tmp_path):
    with pytest.raises(JavaMissing) as err:
        require_java(env={"PATH": str(tmp_path)})
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("lakegate: Spark needs Java 17+ but found none (no java on PATH)")
    assert "openjdk-17" in msg


def test_java_8_is_too_old(tmp_path):
    bin_dir = _fake_java(tmp_path, 'openjdk version "1.8.0_392"')
    with pytest.raises(JavaMissing, match=r"is Java 8; install Java 17 or newer"):
        require_java(env={"PATH": str(bin_dir)})


def test_java_11_is_too_old_via_java_home(tmp_path):
    bin_dir = _fake_java(tmp_path, 'openjdk version "11.0.21" 2023-10-17')
    with pytest.raises(JavaMissing, match=r"is Java 11;"):
        require_java(env={"JAVA_HOME": str(bin_dir.parent), "PATH": ""})


def test_java_home_without_java(tmp_path):
    with pytest.raises(JavaMissing, match=r"JAVA_HOME=.* has no bin/java"):
        require_java(env={"JAVA_HOME": str(tmp_path), "PATH": os.environ["PATH"]})


def test_the_real_java_is_17_or_newer():
    assert require_java() >= 17


def test_cli_reports_missing_java_in_one_line(tmp_path):
    import subprocess
    import sys

    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    code = "from bridge.config import Config; from bridge.spark.session import build_session; build_session(Config())"
    out = subprocess.run([sys.executable, "-c", f"import sys\ntry:\n    {code}\nexcept Exception as e:\n    print(type(e).__name__, e, file=sys.stderr); sys.exit(2)"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("JavaMissing lakegate: Spark needs Java 17+")
