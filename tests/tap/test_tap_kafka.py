"""lakegate tap into a Kafka topic (``capture.backend = "kafka"``): the tap
opens its log with ``bridge.capture.open_capture_log``, so a tap of the real
Mosquitto writes the real one-node Kafka's topic (one of the test's own,
deleted after it); every message is read back once with
``bridge.capture.open_reader``, with origin tap, and every PUBACK/PUBREC went
to the broker only after Kafka's delivery report for its record."""

from __future__ import annotations

import uuid

import pytest

from bridge.capture import open_reader
from bridge.capture.kafka_log import KafkaCaptureLog
from bridge.capture.kafka_reader import KafkaLogReader
from bridge.config import load_config
from bridge.mqtt import decode_packet
from tests.tap.util import Running, publish
from tests.waiting import wait_for

pytestmark = pytest.mark.broker


@pytest.fixture
def kafka_topic(kafka):
    """A topic name of the test's own (the tap creates it), deleted after the test."""
    topic = f"lg-tap-{uuid.uuid4().hex[:10]}"
    yield topic
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka})  # kept: a collected client fails its futures (_DESTROY)
    for fut in admin.delete_topics([topic]).values():
        try:
            fut.result(10)
        except Exception:  # noqa: BLE001 - never created (the tap did not start): nothing to delete
            pass


def test_tap_writes_to_kafka_and_acknowledges_after_the_delivery_report(mosquitto, kafka, kafka_topic, tmp_path):
    host, port = mosquitto
    prefix = "lgtapk/" + uuid.uuid4().hex[:8]
    cfg = load_config(None, [f"data_dir={tmp_path}", f"tap.broker=mqtt://{host}:{port}",
                             f"tap.client_id=tap-{uuid.uuid4().hex[:8]}", "capture.partitions=2",
                             "capture.backend=kafka", f"kafka.bootstrap_servers={kafka}",
                             f"kafka.topic={kafka_topic}", "kafka.create_topic=true"], env={})
    running = Running(cfg, prefix)
    tap = running.tap
    assert isinstance(tap.log, KafkaCaptureLog)
    # every acknowledgement to the broker, with how many records Kafka had confirmed by then
    seen: list[tuple[str, int, int]] = []
    ack, pubrec = tap._client.ack, tap._client.send_pubrec

    def ack_spy(mid, qos):
        seen.append(("puback", tap.log.stats["deliveries"], len(seen) + 1))
        return ack(mid, qos)

    def pubrec_spy(mid):
        seen.append(("pubrec", tap.log.stats["deliveries"], len(seen) + 1))
        return pubrec(mid)

    tap._client.ack, tap._client.send_pubrec = ack_spy, pubrec_spy
    msgs = [(f"{prefix}/q{q}/{i}", b"k%d-%d" % (q, i), q, False, None) for q in (0, 1, 2) for i in range(6)]
    try:
        publish(host, port, msgs)
        wait_for(lambda: tap.stats.captured >= len(msgs) and tap.stats.acked >= 12,
                 what="every message captured and the QoS 1/2 ones acknowledged")
    finally:
        running.stop()
    assert running.error is None, running.error
    assert tap.stats.failed == 0 and tap.stats.acked == 12
    assert [kind for kind, _, _ in seen].count("puback") == 6 and [k for k, _, _ in seen].count("pubrec") == 6
    # the n-th acknowledgement went out with at least n records confirmed by Kafka
    assert all(deliveries >= n for _, deliveries, n in seen), seen

    reader = open_reader(cfg)
    assert isinstance(reader, KafkaLogReader)
    try:
        durable = reader.durable_offsets()
        recs = [r for p in range(reader.partitions) for r in reader.records(p, 0, durable[p])]
    finally:
        reader.close()
    assert sum(durable) == len(recs) == len(msgs)
    got = {}
    for r in recs:
        h = dict(r.headers)
        assert h["origin"] == b"tap" and h["proto"] == b"5" and h["conn_id"].startswith(b"tap-")
        pkt, n = decode_packet(r.value, 5)
        assert n == len(r.value)
        got.setdefault(pkt.topic, []).append(pkt)
    assert sorted(got) == sorted(m[0] for m in msgs)
    for topic, payload, qos, _retain, _props in msgs:
        (pkt,) = got[topic]
        assert (pkt.payload, pkt.qos) == (payload, qos)
    seqs = sorted(int(dict(r.headers)["seq"]) for r in recs)
    assert seqs == list(range(len(msgs)))
