"""A command's stderr holds lakegate's log lines, not the libraries' own INFO
lines (python-qpid-proton's "Connecting to Url(...)", py4j's gateway calls):
issue 40. Their warnings still show; at DEBUG their INFO lines come back."""

from __future__ import annotations

import subprocess
import sys

from bridge.logs import THIRD_PARTY_LOGGERS

_SCRIPT = """
import logging, sys
from bridge.cli import setup_logging
from bridge.config import load_config
setup_logging(load_config(None, ["log_level=" + sys.argv[1]], env={}))
for name in ("proton", "proton._reactor", "py4j.java_gateway", "urllib3.connectionpool", "bridge.demo"):
    logging.getLogger(name).info("info from %s", name)
logging.getLogger("proton").warning("warning from proton")
"""


def _stderr(level: str) -> str:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, level], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    return out.stderr


def test_at_info_a_command_logs_its_own_info_lines_and_only_the_libraries_warnings():
    err = _stderr("INFO")
    assert "INFO bridge.demo: info from bridge.demo" in err
    assert "WARNING proton: warning from proton" in err
    for name in ("proton", "proton._reactor", "py4j.java_gateway", "urllib3.connectionpool"):
        assert f"info from {name}" not in err, err


def test_at_debug_the_libraries_info_lines_come_back_but_not_py4js():
    err = _stderr("DEBUG")
    assert "INFO proton: info from proton" in err and "INFO proton._reactor: info from proton._reactor" in err
    assert "info from urllib3.connectionpool" in err
    assert "info from py4j" not in err


def test_proton_and_py4j_are_among_the_quieted():
    assert {"proton", "py4j", "urllib3"} <= set(THIRD_PARTY_LOGGERS)
