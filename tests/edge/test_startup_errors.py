"""Start-up failures print one line naming what is wrong (issue 21, item 13).

A busy port (a distribution's Mosquitto on 1883), a capture log another
process writes, a TLS or password file that cannot be read: one line on
stderr, exit code 1, no traceback, for every command that starts the edge
(``lakegate edge``, ``lakegate run``) or writes the log (``lakegate tap``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.capture import CaptureLog
from tests.conftest import child_env

pytestmark = [pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def _lakegate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


def _one_line(r: subprocess.CompletedProcess) -> str:
    """The one stderr line that is not an ordinary log record; fails on tracebacks or more lines."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and not _LOG_RECORD.match(x)]
    assert len(lines) == 1, r.stderr
    assert r.returncode == 1, (r.returncode, r.stderr)
    return lines[0]


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("command", ["edge", "run"])
def test_busy_port_is_one_line_naming_the_address_and_exit_1(command, busy_port, tmp_path):
    r = _lakegate(tmp_path, command, "--set", f"data_dir={tmp_path / 'data'}", "--set", f"edge.port={busy_port}",
                  "--set", "amqp.url=")
    line = _one_line(r)
    assert line.startswith(f"lakegate: cannot listen on 127.0.0.1:{busy_port}: address already in use"), line
    assert "--set edge.port=N" in line
    assert not (tmp_path / "data" / "run.pid").exists()


@pytest.mark.parametrize("command", [["edge", "--port", "0"], ["run", "--set", "edge.port=0"],
                                     ["tap", "--broker", "mqtt://127.0.0.1:1"]], ids=lambda c: c[0])
def test_capture_log_locked_by_another_writer_is_one_line_and_exit_1(command, tmp_path):
    data = tmp_path / "data"
    held = CaptureLog.open(data / "capture")
    try:
        r = _lakegate(tmp_path, *command, "--set", f"data_dir={data}", "--set", "amqp.url=")
    finally:
        held.close()
    line = _one_line(r)
    assert re.match(rf"lakegate: (tap: )?capture log {re.escape(str(data / 'capture'))} is in use by another "
                    rf"writer \(pid {os.getpid()}\)", line), line


def test_missing_password_and_tls_files_are_one_line_naming_the_key(busy_port, tmp_path):
    # (the TLS port is one already taken: the files are read before it, and nothing could bind it anyway)
    data = f"data_dir={tmp_path / 'data'}"
    line = _one_line(_lakegate(tmp_path, "edge", "--port", "0", "--set", data, "--set", "edge.password_file=users.pw"))
    assert line == f"lakegate: edge.password_file {tmp_path / 'users.pw'}: No such file or directory"
    line = _one_line(_lakegate(tmp_path, "edge", "--port", "0", "--set", data, 
                               "--set", f"edge.tls_port={busy_port}", "--set", "edge.tls_cert_file=cert.pem"))
    assert line == f"lakegate: edge.tls_cert_file {tmp_path / 'cert.pem'}: No such file or directory"
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    line = _one_line(_lakegate(tmp_path, "edge", "--port", "0", "--set", data, "--set", f"edge.tls_port={busy_port}",
                               "--set", "edge.tls_cert_file=junk.pem"))
    assert line.startswith(f"lakegate: edge.tls_cert_file {tmp_path / 'junk.pem'}: not a usable certificate"), line


@pytest.mark.spark
@pytest.mark.slow
def test_process_without_a_capture_log_is_one_line_and_exit_1(tmp_path):
    r = _lakegate(tmp_path, "process", "--once", "--set", f"data_dir={tmp_path / 'data'}", "--set", "amqp.url=",
                  "--set", "spark.master=local[1]")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [x for x in r.stderr.splitlines() if " ERROR " in x]
    assert len(errors) == 1 and errors[0].endswith(
        f"ERROR bridge.job.pipeline: job cannot start: SourceOptionError: lakegate source: option path: "
        f"no capture log at {tmp_path / 'data' / 'capture'} (meta.json is missing)"), r.stderr[-3000:]
