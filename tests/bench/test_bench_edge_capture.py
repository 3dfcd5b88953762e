"""``lakegate bench edge --capture local,kafka`` end to end at tiny size: the
edge on the local log and on the real one-node Kafka (a topic of the bench's
own, deleted after), next to Mosquitto, in one run. Checks the output's
shape -- every measurement, ratio and target present, every acknowledged
frame in its log, the bench's topic gone -- never the figures."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bridge.cli import main

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                       reason="mosquitto is not installed (scripts/services up installs it)"),
]

TINY = ["--connections", "2", "--messages", "2000", "--acked-messages", "600", "--window", "50",
        "--repeat", "1", "--latency-rate", "200", "--latency-seconds", "0.5", "--timeout", "30"]
QOS = ("qos0", "qos1", "qos2")


def _bench_topics(servers):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers})
    return {t for t in admin.list_topics(timeout=10).topics if t.startswith("lg-bench-edge-")}


def test_bench_edge_capture_local_and_kafka_json(kafka, tmp_path, capsys):
    before = _bench_topics(kafka)
    code = main(["bench", "edge", "--json", "--capture", "local,kafka", "--kafka-servers", kafka, *TINY,
                 "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    caps = out["captures"]
    assert list(caps) == ["local", "kafka"]
    for name, c in caps.items():
        assert "error" not in c, (name, c)
        for q in QOS:
            assert c[q]["complete"] and c[q]["msgs_per_s"] > 0, (name, q, c[q])
        assert 0 < c["qos1"]["puback_latency_ms"]["p50"] <= c["qos1"]["puback_latency_ms"]["p99"]
        lat = c["latency"]
        assert lat["complete"] and lat["acknowledged"] == lat["messages"] == 100, lat
        assert 0 < lat["puback_latency_ms"]["p50"] <= lat["puback_latency_ms"]["p99"] <= lat["puback_latency_ms"]["max"]
        cap = c["capture"]
        assert cap["all_acknowledged_captured"] and cap["publish"] == 2000 + 600 + 600 + 100, (name, cap)
        assert cap["pubrel"] == 600
        assert set(c["ratio_to_mosquitto"]) == set(QOS) and all(v > 0 for v in c["ratio_to_mosquitto"].values())
    assert caps["local"]["ratio_to_local"] is None
    assert set(caps["kafka"]["ratio_to_local"]) == set(QOS)
    assert "Kafka" in caps["kafka"]["description"] and "1 node" in caps["kafka"]["description"]
    assert out["mosquitto"]["latency"]["complete"]
    t = out["targets"]
    assert set(t) == {"kafka_qos1_ratio_to_local", "kafka_puback_p99_ms_at_rate"}
    assert all(isinstance(v["met"], bool) and v["value"] is not None for v in t.values()), t
    # the fields of a local-only run, for the first capture log
    assert out["edge"]["qos1"] == caps["local"]["qos1"] and out["edge_capture"] == caps["local"]["capture"]
    assert out["ratio_edge_to_mosquitto"] == caps["local"]["ratio_to_mosquitto"]
    assert _bench_topics(kafka) <= before  # the bench deleted its topic


def test_bench_edge_capture_text_names_each_capture_and_the_targets(kafka, tmp_path, capsys):
    code = main(["bench", "edge", "--capture", "local,kafka", "--kafka-servers", kafka, *TINY,
                 "--set", f"data_dir={tmp_path}"])
    text = capsys.readouterr().out
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("edge vs mosquitto: 2 connections")
    assert any(line.startswith("  edge on local") for line in lines)
    assert any(line.startswith("  edge on kafka") and "1 node" in line for line in lines)
    header = next(line for line in lines if line.startswith("msg/s"))
    assert header.split() == ["msg/s", "local", "kafka", "mosquitto"]
    for q in QOS:
        row = next(line for line in lines if line.startswith(q + " "))
        assert len(row.split()) == 4, row
    assert "(QoS 1 at a fixed 200 msg/s for 0.5 s)" in text
    assert any(line.startswith("ratio to local") and line.split()[-1] == "kafka" for line in lines)
    assert any(line.startswith("ratio to mosquitto") and line.split()[-2:] == ["local", "kafka"] for line in lines)
    assert "targets (issue 42, the edge on the one-node Kafka):" in text
    targets = [line for line in lines if line.strip().startswith(("QoS 1 msg/s, ratio", "PUBACK p99 (ms)"))]
    assert len(targets) == 2 and all(line.rstrip().endswith(("met", "MISSED")) for line in targets), targets


def test_bench_edge_capture_refuses_an_unknown_log(capsys):
    assert main(["bench", "edge", "--capture", "local,nfs"]) == 2
    assert "unknown capture log 'nfs'" in capsys.readouterr().err
