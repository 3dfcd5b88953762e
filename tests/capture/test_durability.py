"""A record whose append was reported durable is present after SIGKILL of the writer."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.capture import LogReader
from tests.capture.util import frame, headers, key, open_log

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


def _run_and_kill(path, want: int, deadline_s: float = 60) -> list[tuple[int, int, int]]:
    """Start the child, read its durable reports until ``want`` of them, SIGKILL it."""
    child = subprocess.Popen([sys.executable, "-m", "tests.capture.writer_child", str(path)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buf = b""
    reported = 0
    deadline = time.monotonic() + deadline_s
    try:
        while reported < want:
            left = deadline - time.monotonic()
            assert left > 0, f"child reported only {reported} durable records in {deadline_s}s"
            r, _, _ = select.select([child.stdout], [], [], left)
            if not r:
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            assert chunk, f"child exited early: {child.stderr.read().decode(errors='replace')[-2000:]}"
            buf += chunk
            reported = buf.count(b"\n") - 1  # minus "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        rest, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    buf += rest
    lines = buf.split(b"\n")
    assert lines[0] == b"ready"
    complete = lines[1:-1]  # the last piece may be a line cut by the kill
    return [tuple(int(x) for x in ln.split()) for ln in complete]


@pytest.mark.timeout(180)
def test_records_reported_durable_survive_sigkill(tmp_path):
    expected: dict[tuple[int, int], int] = {}  # (partition, offset) -> record index i
    for _ in range(2):  # kill twice: a log recovered after a kill must survive the next one
        reports = _run_and_kill(tmp_path, want=3000)
        assert len(reports) >= 3000
        for i, p, off in reports:
            assert (p, off) not in expected, "an offset was reported twice"
            expected[(p, off)] = i
        with open_log(tmp_path) as log:  # recovers: torn tails truncated, nothing corrupt
            next_offsets = log.next_offsets()
        reader = LogReader(tmp_path)
        for p in range(reader.partitions):
            wanted = {off: i for (q, off), i in expected.items() if q == p}
            if not wanted:
                continue
            assert max(wanted) < next_offsets[p]
            got = {r.offset: r for r in reader.records(p, 0, next_offsets[p])}
            for off, i in wanted.items():
                r = got[off]
                assert (r.key, r.value, list(r.stored_headers)) == (key(i), frame(i), headers(i)), (p, off)
    assert len(expected) >= 6000
