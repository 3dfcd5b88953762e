"""Live forwarding (``bridge.amqp.live``): from the capture log to the real
RabbitMQ as records become durable, outside the micro-batch: capture order,
the job's selection of rows, the forwarded marks as the cursor (a restart
resumes after them), nothing recorded for a range the peer did not take,
retention held back, rows set aside quarantined once."""

from __future__ import annotations

import json

import pytest

from bridge.amqp.forwarded import ForwardedOffsets
from bridge.amqp.live import CONSUMER, LiveForwarder, forwards_live
from bridge.amqp.mapping import ID_PROPERTY
from bridge.amqp.results import ForwardError
from bridge.amqp.unforwardable import Unforwardable
from bridge.capture import CaptureLog, LogReader
from bridge.config import load_config
from bridge.job.pipeline import job_forwards
from tests.amqp.peer import free_port
from tests.job.frames import append_publish, append_pubrel


def _config(tmp_path, url, *extra):
    return load_config(None, [f"data_dir={tmp_path}", f"amqp.url={url}", "capture.partitions=2",
                              "amqp.max_retries=1", "amqp.retry_backoff_s=0.05",
                              "amqp.disposition_timeout_s=10", *extra], env={})


def _append(cfg, items):
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    try:
        acks = [fn(log) for fn in items]
        for a in acks:
            a.wait(10)
    finally:
        log.close()


@pytest.mark.broker
def test_live_forwarder_sends_durable_records_in_capture_order_and_resumes_after_its_marks(
        consumer, rabbitmq, tmp_path):
    cfg = _config(tmp_path, rabbitmq)
    topic = consumer.topic("live")
    other = consumer.topic("live-refused")
    _append(cfg, [
        lambda log: append_publish(log, "c1", topic, b"1", qos=1, packet_id=1),
        lambda log: append_publish(log, "c1", topic, b"2", qos=0),
        lambda log: append_publish(log, "c1", topic, b"3", qos=2, packet_id=3),
        lambda log: append_pubrel(log, "c1", 3, topic),
        lambda log: append_publish(log, "c1", topic, b"3", qos=2, packet_id=3, dup="1"),  # edge-marked re-send
        lambda log: append_publish(log, "c1", other, b"x", qos=1, packet_id=4, reject="MQTT-3.3.2-2"),
        lambda log: append_publish(log, "c1", topic, b"4", qos=1, packet_id=5),
    ])
    durable = LogReader(cfg.capture_dir).durable_offsets()
    live = LiveForwarder(cfg)

    assert live.cycle() == sum(durable)

    got = consumer.wait(topic, 5)
    assert [bytes(m.body) if m.body is not None else None for m in got][:2] == [b"1", b"2"]
    assert [bytes(m.body) for m in got if m.body] == [b"1", b"2", b"3", b"4"]  # the PUBREL has no body
    assert len({m.properties[ID_PROPERTY] for m in got}) == 5
    marks = ForwardedOffsets(cfg.data_path, cfg.capture.stream)
    assert [marks.get(p) for p in range(2)] == [n - 1 for n in durable]  # every record passed, forwarded or not
    assert live.stats.forwarded == 5 and live.stats.records == sum(durable)
    assert live.cycle() == 0  # nothing new
    live.stop(drain_s=0)  # commits the cursor as the capture consumer
    commit = json.loads((cfg.capture_dir / "consumers" / f"{CONSUMER}.json").read_text())
    assert commit["offsets"] == {str(p): n for p, n in enumerate(durable)}

    # a new forwarder (a restart) resumes after the marks: only the new record goes out
    _append(cfg, [lambda log: append_publish(log, "c1", topic, b"5", qos=1, packet_id=6)])
    again = LiveForwarder(cfg)
    assert again.cycle() == 1
    got = consumer.wait(topic, 6)
    assert [bytes(m.body) for m in got if m.body] == [b"1", b"2", b"3", b"4", b"5"]
    assert other not in consumer.by_topic  # the edge refused it: never forwarded


@pytest.mark.broker
def test_live_forwarder_records_nothing_for_a_range_the_peer_did_not_take_then_sends_it(
        consumer, rabbitmq, tmp_path):
    topic = consumer.topic("live-outage")
    down = _config(tmp_path, f"amqp://guest:guest@127.0.0.1:{free_port()}", "amqp.idle_timeout_s=1")
    _append(down, [lambda log: append_publish(log, "c1", topic, b"kept", qos=1, packet_id=1)])
    live = LiveForwarder(down)
    with pytest.raises(ForwardError):
        live.cycle()
    marks = ForwardedOffsets(down.data_path, down.capture.stream)
    assert [marks.get(p) for p in range(2)] == [-1, -1]
    # the peer is back (here: the real one): the same record goes out
    assert LiveForwarder(_config(tmp_path, rabbitmq)).cycle() == 1
    assert [bytes(m.body) for m in consumer.wait(topic, 1)] == [b"kept"]


def test_live_forwarder_quarantines_set_aside_rows_once_per_partition_and_offset(tmp_path):
    from bridge.rows.arrow_frames import frame_rows_arrow

    cfg = _config(tmp_path, "amqp://127.0.0.1:1")
    _append(cfg, [lambda log, i=i: append_publish(log, "c1", f"t/{i}", b"p", qos=1, packet_id=i + 1)
                  for i in range(4)])
    reader = LogReader(cfg.capture_dir)
    table = frame_rows_arrow(b for p, end in enumerate(reader.durable_offsets())
                             for b in reader.arrow_batches(p, 0, end))
    part = table["partition"][0].as_py()
    offsets = sorted(o for p, o in zip(table["partition"].to_pylist(), table["offset"].to_pylist()) if p == part)
    err = "[LG-amqp-unforwardable] ValueError: does not fit"

    def fail(o):
        return Unforwardable(cfg.capture.stream, part, o, "LG-amqp-unforwardable", err)

    live = LiveForwarder(cfg)
    assert live._quarantine(table, [fail(offsets[0])]) == 1
    # the same range sent again after a crash, now longer: only the row above the recorded version
    assert live._quarantine(table, [fail(offsets[0]), fail(offsets[1])]) == 1
    assert live._quarantine(table, [fail(offsets[1])]) == 0
    rows = live.engine().arrow("quarantine").to_pylist()
    assert sorted((r["partition"], r["offset"], r["rule"]) for r in rows) == [
        (part, offsets[0], "LG-amqp-unforwardable"), (part, offsets[1], "LG-amqp-unforwardable")]


@pytest.mark.parametrize("forward_by, url, run, edge, process", [
    # (who forwards in) lakegate run: live / job; lakegate edge: live; lakegate process: job
    ("auto", "amqp://h", ("live",), (), ("job",)),
    ("edge", "amqp://h", ("live",), ("live",), ()),
    ("job", "amqp://h", ("job",), (), ("job",)),
    ("auto", "", (), (), ()),
])
def test_amqp_forward_by_decides_who_forwards(forward_by, url, run, edge, process):
    cfg = load_config(None, [f"amqp.forward_by={forward_by}", f"amqp.url={url}"], env={})
    run_live = forwards_live(cfg, hosts_edge=True, runs_job=True)
    got_run = (("live",) if run_live else ()) + (("job",) if job_forwards(cfg, live_elsewhere=run_live) else ())
    got_edge = ("live",) if forwards_live(cfg, hosts_edge=True, runs_job=False) else ()
    got_process = ("job",) if job_forwards(cfg) else ()
    assert (got_run, got_edge, got_process) == (run, edge, process)


def test_amqp_forward_by_refuses_an_unknown_value():
    from bridge.config import ConfigError

    with pytest.raises(ConfigError, match="amqp.forward_by"):
        load_config(None, ["amqp.forward_by=spark"], env={})


@pytest.mark.broker
@pytest.mark.subprocess
def test_lakegate_edge_with_forward_by_edge_forwards_live_and_scrapes_its_counts(consumer, rabbitmq, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.metrics.test_metrics import _health, _scrape
    from tests.waiting import wait_for

    topic = consumer.topic("live-edge")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "edge", "--port", "0", "--set", f"data_dir={tmp_path}",
                             "--set", f"metrics.port={port}", "--set", f"amqp.url={rabbitmq}",
                             "--set", "amqp.forward_by=edge"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "lakegate edge listening on mqtt://" in line, proc.stderr.read() if proc.poll() is not None else line
        edge_port = int(line.split("mqtt://", 1)[1].split(" ", 1)[0].rsplit(":", 1)[1])
        import paho.mqtt.client as mqtt

        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="live-edge", protocol=mqtt.MQTTv5)
        c.connect("127.0.0.1", edge_port)
        c.loop_start()
        for i in range(3):
            c.publish(topic, b"m%d" % i, qos=1).wait_for_publish(30)
        c.loop_stop()
        c.disconnect()
        assert [bytes(m.body) for m in consumer.wait(topic, 3)] == [b"m0", b"m1", b"m2"]  # no job runs: live
        assert wait_for(lambda: _scrape(port).get("lakegate_live_forward_forwarded_total") == 3, timeout=20)
        m = _scrape(port)
        assert m["lakegate_live_forward_failing"] == 0 and m["lakegate_live_forward_unforwardable_total"] == 0
        # one topic, QoS 1: one sender link, attached once (issue 39: links bounded, counted)
        assert m["lakegate_live_forward_links"] == 1 and m["lakegate_live_forward_link_attaches_total"] == 1
        assert m["lakegate_live_forward_link_detaches_total"] == 0 and m["lakegate_live_forward_anonymous_relay"] == 0
        code, body = _health(port)
        assert code == 200 and {"edge", "capture_log", "live_forwarding", "amqp"} == set(body["checks"]), body
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, proc.stderr.read()[-2000:]
        proc.stdout.close()
        proc.stderr.close()
    assert not (tmp_path / "forward-live.json").exists()  # removed at stop: lakegate status shows no live forwarder
