import os
import stat

import pytest

from bridge.javacheck import JavaMissing, require_java
from tests.conftest import child_env


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


@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["run", "process"])
@pytest.mark.parametrize("where", ["path", "java_home"])
def test_cli_reports_missing_java_in_one_line_and_starts_nothing(tmp_path, command, where):
    """The real command line, with no java to find: exit 2, one line on stderr
    saying which Java to install, and (``lakegate run``) no edge, no run.pid."""
    import subprocess
    import sys
    from pathlib import Path

    empty = tmp_path / "nojava"
    empty.mkdir()
    data = tmp_path / "data"
    env = {k: v for k, v in child_env().items() if k != "JAVA_HOME"}
    env["PATH"] = str(empty)
    if where == "java_home":
        env["JAVA_HOME"] = str(empty)
    out = subprocess.run([sys.executable, "-m", "bridge", command, "--set", f"data_dir={data}",
                          "--set", "edge.port=0", "--set", "amqp.url="],
                         capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    why = f"JAVA_HOME={empty} has no bin/java" if where == "java_home" else "no java on PATH"
    assert lines[0].startswith(f"lakegate: Spark needs Java 17+ but found none ({why}); install Java 17 or newer")
    assert "openjdk-17-jre-headless" in lines[0]
    assert out.stdout == ""  # nothing started, nothing announced
    assert not (data / "run.pid").exists()
    assert not (data / "capture").exists()  # the edge never opened its capture log
