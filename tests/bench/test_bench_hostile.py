"""``lakegate bench hostile --quick --runs 1`` with two scenarios, smaller
still: both servers measured in one run, the printed tables have their
shape (one latency row per scenario with p50/p99 per server, the ratios
and the target verdict; one RSS row per scenario and server), the JSON has
every number, and the exit code says whether the edge had findings."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from bridge.cli import main

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                       reason="mosquitto is not installed (scripts/services up installs it)"),
]

SMALL = ["--quick", "--runs", "1", "--scenarios", "slow-readers,fuzz",
         "--size", "slow_subscribers=6", "--size", "slow_seconds=2", "--size", "fuzz_packets=150"]
NUM = r"(\d+\.\d+|-)"


def test_bench_hostile_prints_one_row_per_scenario_and_server(tmp_path, capsys):
    code = main(["bench", "hostile", *SMALL, "--set", f"data_dir={tmp_path}"])
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("hostile scenarios: the good client's PUBLISH->PUBACK latency (QoS 1, 64 B, "
                               "50 msg/s), median of 1 run(s) (quick sizes); target p99 < 50 ms"), text
    assert lines[1].split() == ["scenario", "edge", "p50", "edge", "p99", "mosquitto", "p50", "mosquitto",
                                "p99", "ratio", "p50", "ratio", "p99", "target"], text
    for i, name in enumerate(("slow-readers", "fuzz")):
        m = re.fullmatch(rf"{name}\s+" + r"\s+".join([NUM] * 6) + r"\s+(met|MISSED)", lines[2 + i])
        assert m, lines[2 + i]
        edge_p50, edge_p99, mosq_p50, mosq_p99 = (float(v) for v in m.groups()[:4])
        assert 0 < edge_p50 <= edge_p99 and 0 < mosq_p50 <= mosq_p99
        assert m.group(7) == ("met" if edge_p99 < 50 else "MISSED")
    assert lines[4] == ""
    assert lines[5].split()[:6] == ["scenario", "server", "RSS", "start", "peak", "end"]
    rows = [ln.split() for ln in lines[6:10]]
    assert [(r[0], r[1]) for r in rows] == [("slow-readers", "edge"), ("slow-readers", "mosquitto"),
                                            ("fuzz", "edge"), ("fuzz", "mosquitto")], text
    for r in rows:
        assert all(float(v) > 0 for v in r[2:5]) and r[5] in ("yes", "NO") and r[6] in ("yes", "NO")
    edge_findings = [ln for ln in lines[10:] if re.match(r"  \S+ / edge: ", ln)]
    assert code == (1 if edge_findings else 0), text


def test_bench_hostile_json(tmp_path, capsys):
    code = main(["bench", "hostile", "--json", *SMALL, "--only", "edge", "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 1 and out["quick"] and out["target_p99_ms"] == 50.0
    assert out["sizes"]["fuzz_packets"] == 150 and out["sizes"]["slow_subscribers"] == 6
    assert set(out["scenarios"]) == {"slow-readers", "fuzz"}
    for name, e in out["scenarios"].items():
        assert set(e) == {"edge"}, e.keys()  # --only edge: no Mosquitto, no ratio
        edge = e["edge"]
        run = edge["runs"][0]
        good = run["good"]
        assert good["samples"] >= 100 and good["sent"] >= good["acked"] > 0  # >= 3 s at 50/s
        assert edge["p50_ms"] == good["p50_ms"] and edge["p99_ms"] == good["p99_ms"]
        assert run["rss_start_mb"] > 0 and run["rss_peak_mb"] >= run["rss_start_mb"]
        assert run["alive"] is edge["alive"] and isinstance(run["accepting"], bool)
        assert isinstance(run["scenario"]["failures"], list)
    assert out["scenarios"]["fuzz"]["edge"]["runs"][0]["scenario"]["packets"] == 150
    assert code == (1 if any(out["scenarios"][n]["edge"]["findings"] for n in out["scenarios"]) else 0)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_bench_hostile_under_lakegate_run_kills_and_waits_for_the_run_s_edge(tmp_path, capsys):
    """``--only run``: the scenarios against ``lakegate run`` (started, its
    first batch committed, then measured); ``sigkill`` kills the run's edge
    process and the run starts it again itself; RSS is the edge process's."""
    code = main(["bench", "hostile", "--json", "--quick", "--runs", "1", "--only", "run",
                 "--scenarios", "sigkill,fuzz", "--size", "kill_queued=50", "--size", "fuzz_packets=150",
                 "--set", f"data_dir={tmp_path}", "--set", "amqp.url="])
    out = json.loads(capsys.readouterr().out)
    for name in ("sigkill", "fuzz"):
        e = out["scenarios"][name]
        assert set(e) == {"run"}, e.keys()
        run = e["run"]["runs"][0]
        assert run["good"]["samples"] >= 50 and run["alive"] and run["accepting"], run  # >= 3 s less a restart
        assert 0 < run["rss_start_mb"] < 1000  # the edge process, not the run with its Spark driver
    assert out["scenarios"]["sigkill"]["run"]["runs"][0]["restarts"] == 1
    assert code == (1 if any(out["scenarios"][n]["run"]["findings"] for n in out["scenarios"]) else 0)
