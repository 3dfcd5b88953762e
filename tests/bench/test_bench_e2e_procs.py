"""``bench e2e``'s lakegate process: an incarnation that exited is reported
with the end of its log, where the bench would otherwise fail later on a
refused connection (a CI run once did: "Connect call failed" after the
kill test, the run's log gone with the bench's temporary directory)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from bridge.bench.e2e_procs import Lakegate


def test_an_exited_run_is_reported_with_its_log_tail(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "the reason it stopped\n")
    lg = Lakegate(argparse.Namespace(), tmp_path / "data", log)
    lg.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    lg.proc.wait(30)
    with pytest.raises(RuntimeError) as err:
        lg.check_alive("after the kill test")
    text = str(err.value)
    assert text.startswith("lakegate run exited with code 3 after the kill test: ")
    assert text.endswith("line 29 | the reason it stopped") and "line 10 |" not in text


def test_a_running_run_passes(tmp_path):
    lg = Lakegate(argparse.Namespace(), tmp_path / "data", tmp_path / "run.log")
    lg.check_alive("before it started")  # no process yet: nothing to report
    lg.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        lg.check_alive("while running")
    finally:
        lg.proc.kill()
        lg.proc.wait(30)
