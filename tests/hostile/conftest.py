"""The hostile scenarios of issue 38 at small, bounded size against a real
``lakegate edge`` (a subprocess: its RSS and its death are its own), with
the same scenario code as ``lakegate bench hostile``
(:mod:`bridge.bench.hostile`). Each test prints one line of numbers."""

from __future__ import annotations

import json

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


@pytest.fixture
def hostile(tmp_path):
    """A function: (scenario, sizes, *edge settings) -> its result, on a
    fresh edge that is stopped after the test."""
    servers: list[Server] = []

    def run(name: str, sizes, *settings: str) -> dict:
        server = Server("edge", tmp_path / name, edge_overrides=list(settings))
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
