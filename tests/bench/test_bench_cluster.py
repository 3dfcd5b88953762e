"""``lakegate bench cluster`` at a tiny size, against the Kafka of
scripts/services: it starts 1 and 2 edges and a Mosquitto, measures each
part, reports the targets, and every measured figure comes from messages
that arrived (no run without deliveries passes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_cluster_measures_one_and_two_edges_next_to_mosquitto(kafka):
    out = subprocess.run(
        [sys.executable, "-m", "bridge", "bench", "cluster", "--json", "--edges", "1,2", "--runs", "1",
         "--messages", "3000", "--acked-messages", "1500", "--seconds", "1.5", "--latency-seconds", "2",
         "--latency-rate", "200", "--subscribers", "4", "--connections", "2", "--kafka-servers", kafka],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert set(r["sizes"]) == {"1", "2"} and r["mosquitto"] is not None
    for name, s in [*r["sizes"].items(), ("mosquitto", r["mosquitto"])]:
        assert s["publish_qos0"]["msgs_per_s"] > 0 and s["publish_qos0"]["complete"], (name, s["publish_qos0"])
        assert s["publish_qos1"]["msgs_per_s"] > 0 and s["publish_qos1"]["complete"], (name, s["publish_qos1"])
        f = s["fanout_qos1"]
        assert f["delivered"] == f["expected"] > 0 and f["duplicates"] == 0, (name, f)
        assert s["latency"]["p99_ms"] is not None and s["latency"]["messages"] > 0, (name, s["latency"])
        assert "generator" in f["cpu_s"]
    assert set(r["sizes"]["2"]["fanout_qos1"]["cpu_s"]) >= {"edge0", "edge1", "generator"}
    assert r["targets"]["fanout_2_over_1"]["target"] == 1.6
    assert r["targets"]["cross_edge_p99_ms_2"]["target"] == 25.0
