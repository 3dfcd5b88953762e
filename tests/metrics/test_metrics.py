"""/metrics and /healthz (bridge.metrics): scraped over HTTP from a real
``lakegate run`` and parsed with prometheus_client's text parser, values
checked against known traffic; /healthz fails (503) when the capture log
cannot be written."""

from __future__ import annotations

import argparse
import errno
import json
import socket
import types
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.bench.e2e_procs import Lakegate
from bridge.capture import partition as partition_mod
from bridge.capture.writer import CaptureLog, CaptureWriteError
from bridge.config import load_config
from bridge.metrics.wiring import metrics_server
from tests.amqp.peer import free_port as _free_port
from tests.waiting import wait_for


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def _health(port: int) -> tuple[int, dict]:
    try:
        r = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10)
        return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_metrics_of_a_real_run_count_known_traffic_and_healthz_is_ok(tmp_path):
    import paho.mqtt.client as mqtt

    port = _free_port()
    lg = Lakegate(argparse.Namespace(overrides=[], config=None), tmp_path / "data", tmp_path / "run.log")
    lg.start(["amqp.url=", f"metrics.port={port}"], timeout=120)
    try:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="metrics-test", protocol=mqtt.MQTTv5)
        c.connect("127.0.0.1", lg.port)
        c.loop_start()
        for i in range(20):
            c.publish(f"metrics/{i}", b"x" * 10, qos=1).wait_for_publish(30)
        m = _scrape(port)
        assert m['lakegate_edge_connections{protocol=5}'] == 1
        assert m['lakegate_edge_connections{protocol=3.1.1}'] == 0
        assert m["lakegate_capture_appends_total"] >= 21  # CONNECT and the 20 PUBLISHes, each acked once durable
        assert m["lakegate_capture_writable"] == 1 and m["lakegate_capture_disk_bytes"] > 0
        c.loop_stop()
        c.disconnect()
        assert wait_for(lambda: _scrape(port).get("lakegate_job_rows_total{table=messages}", 0) >= 20,
                        timeout=90), lg.tail()
        # a frame that breaks a rule: PUBLISH with QoS 3 [MQTT-3.3.1-4] after a valid 3.1.1 CONNECT
        with socket.create_connection(("127.0.0.1", lg.port), timeout=10) as raw:
            raw.sendall(bytes([0x10, 13, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, 1]) + b"r")
            assert raw.recv(4) == bytes([0x20, 2, 0, 0])
            raw.sendall(bytes([0x36, 0x03, 0, 1, 0x61]))
            assert raw.recv(16) == b""  # closed
        assert wait_for(lambda: _scrape(port).get("lakegate_edge_rejected_frames_total{rule=MQTT-3.3.1-4}") == 1,
                        timeout=20)
        m = _scrape(port)
        assert m["lakegate_job_rows_total{table=messages}"] == 20
        assert m["lakegate_edge_packets_received_total{type=PUBLISH}"] == 20  # decoded ones: the rejected frame is counted by rule
        assert m["lakegate_edge_packets_received_total{type=CONNECT}"] == 2
        assert m["lakegate_edge_packets_received_total{type=DISCONNECT}"] == 1
        assert m["lakegate_edge_packets_sent_total{type=PUBACK}"] == 20
        assert m["lakegate_edge_packets_sent_total{type=CONNACK}"] == 2
        assert m["lakegate_edge_ack_latency_seconds_count{qos=1}"] == 20
        assert m["lakegate_edge_ack_latency_seconds_bucket{le=+Inf,qos=1}"] == 20
        assert 0 < m["lakegate_edge_ack_latency_seconds_sum{qos=1}"] < 20
        assert m["lakegate_edge_ack_latency_seconds_count{qos=2}"] == 0
        assert m["lakegate_capture_fsync_seconds_count"] >= 1
        assert m["lakegate_edge_received_bytes_total"] > 20 * 10 and m["lakegate_edge_sent_bytes_total"] >= 20 * 4
        assert m["lakegate_job_batches_total"] >= 1
        assert m["lakegate_job_batch_duration_seconds_count"] >= 1
        assert m["lakegate_job_lag_records{partition=0}"] >= 0
        assert sum(v for k, v in m.items() if k.startswith("lakegate_job_lag_records{")) >= 0
        # the rejected frame reaches the quarantine table with its rule
        assert wait_for(lambda: _scrape(port).get("lakegate_job_quarantined_total{rule=MQTT-3.3.1-4}") == 1,
                        timeout=90), lg.tail()
        assert _scrape(port)["lakegate_job_forward_failures_total"] == 0
        code, body = _health(port)
        assert code == 200 and body["status"] == "ok", body
        assert set(body["checks"]) == {"edge", "capture_log", "job"}  # amqp: forwarding off
    finally:
        lg.stop()


def test_healthz_fails_when_the_capture_log_cannot_be_written(tmp_path, monkeypatch):
    cfg = load_config(None, [f"data_dir={tmp_path}", "metrics.port=0", "capture.partitions=1"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    server = types.SimpleNamespace(log=log, failed=None, conns=set(), stats={"connections": 0, "refused": 0},
                                   closed_totals={"bytes_in": 0, "bytes_out": 0, "packets_in": [0] * 16,
                                                  "packets_out": [0] * 16}, rejected={}, ack_latency=None)
    edge = types.SimpleNamespace(server=server, alive=True, error=None)
    cfg.metrics.port = _free_port()
    ms = metrics_server(cfg, edge, lambda: True).start()
    try:
        code, body = _health(cfg.metrics.port)
        assert code == 200, body

        def disk_full(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(partition_mod, "write_all", disk_full)
        with pytest.raises(CaptureWriteError):
            log.append("c", b"k", b"v").wait(10)
        code, body = _health(cfg.metrics.port)
        assert code == 503 and body["status"] == "failing"
        assert body["checks"]["capture_log"]["ok"] is False
        assert "No space left on device" in body["checks"]["capture_log"]["detail"]
        assert _scrape(cfg.metrics.port)["lakegate_capture_writable"] == 0
    finally:
        ms.stop()
        monkeypatch.undo()
        log.close()


def test_a_taken_metrics_port_is_one_config_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        cfg = load_config(None, [f"data_dir={tmp_path}", f"metrics.port={taken}"], env={})
        from bridge.config import ConfigError

        with pytest.raises(ConfigError, match=rf"metrics.port: 127.0.0.1:{taken} cannot be bound"):
            metrics_server(cfg, types.SimpleNamespace(), lambda: True)


def test_count_frames_walks_back_to_back_frames_by_type():
    from bridge.edge.connection import count_frames

    counts = [0] * 16
    big = bytes([0x30, 0x80, 0x01]) + b"x" * 128  # PUBLISH, Remaining Length 128 in two digits
    count_frames(bytes([0x40, 2, 0, 1]) + big + bytes([0xD0, 0]) + bytes([0x40, 2, 0, 2]), counts)
    assert counts[4] == 2 and counts[3] == 1 and counts[13] == 1 and sum(counts) == 4


def test_buckets_are_cumulative_with_inf_last():
    from bridge.buckets import Buckets

    b = Buckets((0.01, 0.1))
    for v in (0.005, 0.01, 0.05, 3.0):
        b.observe(v)
    assert b.cumulative() == [("0.01", 2), ("0.1", 3), ("+Inf", 4)]
    assert b.count == 4 and abs(b.sum - 3.065) < 1e-9


def test_the_job_alone_shows_its_lag_per_partition_and_healthz_fails_when_records_wait_too_long(tmp_path):
    """lakegate process (no edge): lag from the capture log's files; an old last batch with records
    waiting fails /healthz, an old batch with nothing waiting (an idle job) does not."""
    import time

    from bridge.job import progress

    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2", "metrics.max_batch_age_s=30", "amqp.url="],
                      env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    try:
        for i in range(5):
            log.append("c", b"k%d" % i, b"v").wait(10)
        ends = log.next_offsets()
    finally:
        log.close()
    cfg.metrics.port = _free_port()
    idle = {"batch_id": 3, "lag": 0, "end_offsets": {str(p): n for p, n in enumerate(ends)},
            "time": time.time() - 600, "totals": {"batches": 4}, "duration_ms": 120}
    progress._LATEST[str(cfg.data_path)] = idle
    ms = metrics_server(cfg, None, lambda: True).start()
    try:
        m = _scrape(cfg.metrics.port)
        assert sum(v for k, v in m.items() if k.startswith("lakegate_job_lag_records{")) == 0
        assert "lakegate_edge_accepted_connections_total" not in m  # no edge in this process
        code, body = _health(cfg.metrics.port)
        assert code == 200 and set(body["checks"]) == {"job"}, body  # idle: no batch needed
        progress._LATEST[str(cfg.data_path)] = {**idle, "lag": 5, "end_offsets": {"0": 0, "1": 0}}
        m = _scrape(cfg.metrics.port)
        assert sum(v for k, v in m.items() if k.startswith("lakegate_job_lag_records{")) == 5
        code, body = _health(cfg.metrics.port)
        assert code == 503 and "5 records wait" in body["checks"]["job"]["detail"], body
    finally:
        ms.stop()
        progress._LATEST.pop(str(cfg.data_path), None)


def test_lakegate_edge_alone_serves_its_metrics(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "edge", "--port", "0", "--set", f"data_dir={tmp_path}",
                             "--set", f"metrics.port={port}", "--set", "amqp.url="], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "lakegate edge listening on mqtt://" in line, proc.stderr.read() if proc.poll() is not None else line
        edge_port = int(line.split("mqtt://", 1)[1].split(" ", 1)[0].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", edge_port), timeout=10) as raw:
            raw.sendall(bytes([0x10, 13, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, 1]) + b"e")
            assert raw.recv(4) == bytes([0x20, 2, 0, 0])
            raw.sendall(bytes([0x32, 6, 0, 1]) + b"t" + bytes([0, 1]) + b"x")  # QoS 1 PUBLISH, id 1
            assert raw.recv(4) == bytes([0x40, 2, 0, 1])
            m = _scrape(port)
            assert m["lakegate_edge_connections{protocol=3.1.1}"] == 1
            assert m["lakegate_edge_packets_received_total{type=PUBLISH}"] == 1
            assert m["lakegate_edge_ack_latency_seconds_count{qos=1}"] == 1
            assert not any(k.startswith("lakegate_job_") for k in m)  # no job in this process
        code, body = _health(port)
        assert code == 200 and set(body["checks"]) == {"edge", "capture_log"}, body
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
