"""The hostile scenarios of issue 38 at small, bounded size against a real
``lakegate edge`` (a subprocess: its RSS and its death are its own), with
the same scenario code as ``lakegate bench hostile``
(:mod:`bridge.bench.hostile`). Each test prints one line of numbers."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from bridge.bench.hostile import Server, run_scenario

#: The good client's PUBACK p99 bound in these tests. The issue's target is
#: 50 ms (TARGET_P99_MS, what ``lakegate bench hostile`` reports against);
#: here the edge, the scenario's load generator, the good client and
#: whatever else CI runs share two cores, and a scheduling hiccup of the
#: edge's process alone costs tens of milliseconds, so a test asserts a
#: bound five times looser: a stall of the kind the issue describes (2.4 s,
#: 17.5 s) still fails it by far, noise does not.
P99_BOUND_MS = 250.0

#: Where the edge under test keeps its data (capture log, session snapshot)
#: and its log: a tmpfs when the machine has one. The edge answers a PUBLISH
#: only once its record is fsynced (``edge.ack_after = "capture"``), so on a
#: disk every PUBACK also waits for the disk's cache flush: on a shared
#: virtual disk that alone stalled for 0.3-3.2 s at times (measured during
#: the churn test: the edge's ``fdatasync`` blocked in the kernel, another
#: process's ``fdatasync`` on another file blocked at the same instant, no
#: write completed on the device meanwhile; the edge's event loop never
#: spent more than 16 ms of CPU on one turn). That is the disk's latency, not
#: the stall of the edge these tests are about; ``lakegate bench hostile``
#: reports the good client's latency on the real disk.
TMPFS = Path("/dev/shm")


def _on_tmpfs(path: Path) -> bool:
    """``path`` is a writable directory with a tmpfs mounted on it."""
    try:
        with open("/proc/self/mounts") as fh:
            mounted = any(f[1] == str(path) and f[2] == "tmpfs" for f in (line.split() for line in fh))
    except OSError:
        return False
    return mounted and os.access(path, os.W_OK)


@pytest.fixture
def hostile(tmp_path):
    """A function: (scenario, sizes, *edge settings) -> its result, on a
    fresh edge (its data on :data:`TMPFS` when there is one) that is
    stopped after the test."""
    servers: list[Server] = []
    base = Path(tempfile.mkdtemp(prefix="lakegate-hostile-", dir=TMPFS)) if _on_tmpfs(TMPFS) else tmp_path

    def run(name: str, sizes, *settings: str) -> dict:
        server = Server("edge", base / name, edge_overrides=list(settings))
        servers.append(server)
        result = run_scenario(name, server, sizes, "t")
        good = result["good"]
        summary = {"scenario": name, "good_p50_ms": good.get("p50_ms"), "good_p99_ms": good.get("p99_ms"),
                   "good_max_ms": good.get("max_ms"), "samples": good.get("samples"),
                   "good_reconnects": good.get("reconnects"), "witness": good.get("witness"),
                   "rss_mb": [result["rss_start_mb"], result["rss_peak_mb"], result["rss_end_mb"]],
                   "alive": result["alive"], "accepting": result["accepting"],
                   "detail": {k: v for k, v in result["scenario"].items() if k != "failures"},
                   "findings": result["findings"]}
        print(json.dumps(summary))
        result["log"] = server.log_text()
        return result

    yield run
    for s in servers:
        s.stop()
    if base != tmp_path:
        shutil.rmtree(base, ignore_errors=True)


def check_common(result: dict, rss_growth_mb: float) -> None:
    """What every hostile test asserts: no finding of the scenario (lost
    messages without a logged cause, unanswered packets, ...); the good
    client's PUBLISHes all acknowledged, their p99 under the bound, each
    one at its persistent subscriber; the edge's RSS grew by less than
    ``rss_growth_mb`` (peak over start); the edge alive and accepting."""
    good = result["good"]
    assert "error" not in good, good
    problems = list(result["findings"])
    if good["p99_ms"] is None or good["p99_ms"] >= P99_BOUND_MS:
        problems.append(f"the good client's PUBACK p99 is {good['p99_ms']} ms (bound {P99_BOUND_MS:g} ms, "
                        f"max {good['max_ms']} ms, {good['samples']} samples)")
    growth = (result["rss_peak_mb"] or 0) - (result["rss_start_mb"] or 0)
    if growth >= rss_growth_mb:
        problems.append(f"the edge's RSS grew by {growth:.1f} MB (bound {rss_growth_mb:g} MB)")
    tail = result.get("log", "").splitlines()[-20:]
    if problems and tail:  # the edge's own log (WARNING and up: ids and counts, never payloads)
        problems.append("edge log tail:\n" + "\n".join(tail))
    assert not problems, "\n".join(problems)
