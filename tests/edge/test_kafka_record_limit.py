"""A Kafka topic's record size limit at the edge [LG-capture-kafka-too-large]
(issue 42, bad input: "a broker that rejects a record as too large: the
client gets the MQTT reason code for it, never a silent drop"), against
the real Kafka of scripts/services and an in-process edge.

The capture topic is made with ``max.message.bytes`` 16,384: the edge's
Maximum Packet Size comes down to fit (less RECORD_HEADROOM for the client
id and headers) and is advertised in CONNACK; a PUBLISH over it is refused
with DISCONNECT 0x95 Packet too large in MQTT 5 (MQTT 5.0 section
3.2.2.3.6: a packet over the server's Maximum Packet Size) and the
connection closed in 3.1.1, never acknowledged: it is in the topic only as
the edge's record of a rejected frame (header ``reject``, for the job's
quarantine), which fits since the limit leaves room for it. One under the
limit is acknowledged and captured as a message."""

from __future__ import annotations

import pytest

from bridge.edge.server import RECORD_HEADROOM
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.connect import Connack
from bridge.mqtt.disconnect import Disconnect
from tests.edge.conftest import RawClient
from tests.edge.util import publish, read_log

pytestmark = pytest.mark.broker

TOPIC_MAX = 16384


@pytest.fixture
def small_topic(kafka, kafka_topic):
    from confluent_kafka.admin import AdminClient, NewTopic

    name = kafka_topic("lg-small")
    admin = AdminClient({"bootstrap.servers": kafka})
    new = NewTopic(name, 4, 1, config={"max.message.bytes": str(TOPIC_MAX)})
    admin.create_topics([new])[name].result(30)
    return name


@pytest.fixture
def small_edge(kafka, small_topic, tmp_path):
    from bridge.config import load_config
    from bridge.edge.thread import EdgeThread

    cfg = load_config(None, [f"data_dir={tmp_path / 'data'}", "edge.port=0", "capture.backend=kafka",
                             f"kafka.bootstrap_servers={kafka}", f"kafka.topic={small_topic}"], env={})
    edge = EdgeThread(cfg).start()
    yield edge
    edge.stop()


def _records_with(cfg, payload: bytes) -> list:
    return [r for r in read_log(cfg) if payload in r.value]


def test_lg_capture_kafka_too_large_the_maximum_packet_size_fits_the_topic_and_is_advertised(small_edge):
    c = RawClient(small_edge.port)
    ack, _n = decode_packet(c.connect(5, client_id="big5"), 5, from_client=False)
    assert isinstance(ack, Connack) and ack.reason_code == 0
    assert ack.properties.maximum_packet_size == TOPIC_MAX - RECORD_HEADROOM


@pytest.mark.parametrize("level", [4, 5])
def test_lg_capture_kafka_too_large_a_larger_publish_is_refused_and_never_captured(small_edge, level):
    c = RawClient(small_edge.port)
    c.connect(level, client_id=f"big{level}")
    small = b"s" * 1000
    c.send(publish(level, topic="big/ok", payload=small, qos=1, packet_id=1))
    assert c.packet()[0] == 0x40  # PUBACK: captured
    big = b"B" * (TOPIC_MAX - RECORD_HEADROOM + 100)  # within edge.max_packet_bytes, over what fits the topic
    c.send(publish(level, topic="big/no", payload=big, qos=1, packet_id=2))
    pkt = c.packet()
    if level == 5:
        d, _n = decode_packet(pkt, 5, from_client=False)
        assert isinstance(d, Disconnect) and d.reason_code == 0x95, d  # Packet too large
        assert c.packet() == b""
    else:
        assert pkt == b""  # 3.1.1 has no reason: the connection closes, no PUBACK
    cfg = small_edge.config
    (ok,) = _records_with(cfg, small)
    assert "reject" not in dict(ok.stored_headers)
    (refused,) = _records_with(cfg, big)  # nothing dropped silently: the refusal is captured, as a rejection
    h = dict(refused.stored_headers)
    assert h["reject_code"] == b"149" and b"exceeds the Maximum Packet Size" in h["reject_error"], h


def test_lg_capture_kafka_too_large_a_record_over_the_limit_by_its_client_id_closes_that_connection(
        small_edge, caplog):
    """A PUBLISH within the Maximum Packet Size whose record does not fit
    all the same (its key, the client id, is 6,000 bytes): the log refuses
    it before producing, that connection closes with the rule and no PUBACK,
    the log and every other client go on."""
    cid = "k" * 6000
    c = RawClient(small_edge.port)
    assert c.connect(4, client_id=cid)[:2] == b"\x20\x02"
    payload = b"L" * (TOPIC_MAX - RECORD_HEADROOM - 200)
    with caplog.at_level("WARNING", logger="bridge.edge"):
        c.send(publish(4, topic="big/key", payload=payload, qos=1, packet_id=1))
        assert c.packet() == b""  # closed, no PUBACK
    assert any("LG-capture-kafka-too-large" in r.getMessage() and "closing the connection" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    other = RawClient(small_edge.port)
    other.connect(4, client_id="after")
    other.send(publish(4, topic="big/after", payload=b"fine", qos=1, packet_id=1))
    assert other.packet()[0] == 0x40
    assert not _records_with(small_edge.config, payload[:4000])
