"""No log record prints more than MAX_LINE_CHARS (issue 38, item 5): a line
built from what a client sent stays small [LG-log-line-bound]."""

from __future__ import annotations

import logging
import subprocess
import sys

from bridge.logs import MAX_LINE_CHARS, BoundedFormatter


def _record(msg: str, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("bridge.edge", logging.INFO, __file__, 1, msg, None, exc_info)


def test_lg_log_line_bound_a_huge_record_is_cut_keeping_its_start_and_end():
    line = BoundedFormatter().format(_record("start " + "x" * 30_000_000 + " end"))
    assert len(line) <= MAX_LINE_CHARS
    assert " start x" in line and line.endswith("x end") and "LG-log-line-bound" in line
    assert "characters cut" in line


def test_lg_log_line_bound_a_short_record_is_unchanged():
    f = BoundedFormatter()
    assert f.format(_record("open c1 client=a")).endswith("bridge.edge: open c1 client=a")


def test_lg_log_line_bound_a_traceback_keeps_its_last_frames():
    try:
        raise ValueError("the cause " + "y" * 40_000)
    except ValueError:
        line = BoundedFormatter().format(_record("failed", sys.exc_info()))
    assert len(line) <= MAX_LINE_CHARS and "failed" in line


def test_lg_log_line_bound_the_commands_log_through_it():
    code = ("import logging, sys; from bridge.config import load_config; "
            "from bridge.cli import setup_logging; setup_logging(load_config(None, [], env={})); "
            "logging.getLogger('bridge.edge').warning('z' * 100000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (line,) = out.stderr.splitlines()
    assert len(line) <= MAX_LINE_CHARS and "LG-log-line-bound" in line
