"""``lakegate bench subscribe --json`` end to end at tiny size: both servers
measured in one run, every point complete (every message reached every
subscriber once), every number of the JSON present and sane."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bridge.cli import main

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                       reason="mosquitto is not installed (scripts/services up installs it)"),
]

TINY = ["--subscribers", "2,5", "--seconds", "0.3", "--repeat", "1", "--window", "200",
        "--latency-rate", "200", "--latency-seconds", "1", "--sessions", "40",
        "--session-subscriptions", "3", "--timeout", "20"]


def test_bench_subscribe_json(tmp_path, capsys):
    code = main(["bench", "subscribe", "--json", *TINY, "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    for server in ("edge", "mosquitto"):
        for q in ("qos0", "qos1"):
            for n in ("2", "5"):
                point = out["fanout"][server][q][n]
                assert point["complete"] and "error" not in point, (server, q, n, point)
                assert point["delivered"] == point["expected"] == point["published"] * int(n) > 0
                assert point["duplicates"] == point["gaps"] == 0
                assert point["delivered_per_s"] > 0 and point["runs"] == [point["delivered_per_s"]]
                assert point["generator_cpu_s"] >= 0 and point["server_cpu_s"] >= 0
        lat = out["latency"][server]
        assert lat["complete"] and lat["delivered"] == lat["expected"], lat
        assert lat["samples"][0] > 0 and 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["runs_max_ms"][0]
        mem = out["memory"][server]
        assert mem["complete"] and mem["sessions"] == 40 and mem["refused"] == 0, mem
        assert mem["rss_mb"] > 0 and mem["rss_before_mb"] > 0
    ratios = out["ratio_edge_to_mosquitto"]
    assert set(ratios) == {"qos0", "qos1"} and all(
        ratios[q][n] > 0 for q in ratios for n in ("2", "5"))
    assert set(out["targets_met"]) == {"fanout_ratio", "latency_p99", "edge_memory"}


def test_bench_subscribe_text_names_each_measurement(tmp_path, capsys):
    code = main(["bench", "subscribe", "--only", "mosquitto", "--phases", "latency,memory", *TINY,
                 "--set", f"data_dir={tmp_path}"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "(b) publish-to-subscriber latency, QoS 1, 200 msg/s" in text
    assert "(c) memory, 40 idle persistent sessions x 3 subscriptions" in text
    assert "mosquitto  RSS" in text and "(a) fan-out" not in text
