"""lakegate tap against the real Mosquitto: every message lands in the log once,
with origin tap, and messages published while the tap was down arrive after it
comes back (persistent session, acknowledged only once durable)."""

import uuid

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bridge.config import load_config
from bridge.mqtt import Publish, decode_packet
from bridge.tap import frame_for
from tests.tap.util import Running
from tests.tap.util import publish as _publish
from tests.tap.util import records as _records
from tests.waiting import wait_for

pytestmark = pytest.mark.broker


def _start(cfg, prefix):
    r = Running(cfg, prefix)
    return r.tap, r.thread


def test_frame_for_drops_hop_properties_and_round_trips():
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("k", "v")
    props.UserProperty = ("k", "w")
    props.SubscriptionIdentifier = 7
    props.ContentType = "text/plain"
    props.MessageExpiryInterval = 30
    frame = frame_for("a/b", b"hi", 1, True, 5, props)
    pkt, n = decode_packet(frame, 5)
    assert n == len(frame) and isinstance(pkt, Publish)
    assert (pkt.topic, pkt.payload, pkt.qos, pkt.retain, pkt.packet_id) == ("a/b", b"hi", 1, True, 5)
    assert pkt.properties.user_properties == [("k", "v"), ("k", "w")]
    assert pkt.properties.subscription_identifiers == [] and pkt.properties.topic_alias is None
    assert (pkt.properties.content_type, pkt.properties.message_expiry_interval) == ("text/plain", 30)


def test_tap_captures_every_message_once_with_origin_tap(mosquitto, tmp_path):
    host, port = mosquitto
    prefix = "lgtap/" + uuid.uuid4().hex[:8]
    cfg = load_config(None, [f"data_dir={tmp_path}", f"tap.broker=mqtt://{host}:{port}",
                             f"tap.client_id=tap-{uuid.uuid4().hex[:8]}", "capture.partitions=2"], env={})
    tap, thread = _start(cfg, prefix)
    try:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("site", "north")
        msgs = [(f"{prefix}/q{q}/{i}", b"m%d" % i, q, i == 0, props) for q in (0, 1, 2) for i in range(5)]
        _publish(host, port, msgs)
        wait_for(lambda: tap.stats.captured >= len(msgs) and tap.stats.acked >= 10, what="all messages captured")
    finally:
        tap.stop()
        thread.join(10)
    recs = _records(cfg.capture_dir)
    got = {}
    for r in recs:
        h = dict(r.headers)
        assert h["origin"] == b"tap" and h["proto"] == b"5"
        pkt, _ = decode_packet(r.value, 5)
        got.setdefault(pkt.topic, []).append(pkt)
    assert sorted(got) == sorted(m[0] for m in msgs)
    for topic, pkts in got.items():
        assert len(pkts) == 1, topic
        p = pkts[0]
        assert p.properties.user_properties == [("site", "north")]
    assert got[f"{prefix}/q2/0"][0].retain is True and got[f"{prefix}/q2/0"][0].qos == 2


def test_messages_published_while_the_tap_is_down_arrive_after_restart(mosquitto, tmp_path):
    host, port = mosquitto
    prefix = "lgtap/" + uuid.uuid4().hex[:8]
    cid = "tap-" + uuid.uuid4().hex[:8]
    cfg = load_config(None, [f"data_dir={tmp_path}", f"tap.broker=mqtt://{host}:{port}", f"tap.client_id={cid}"], env={})
    tap, thread = _start(cfg, prefix)
    tap.stop()
    thread.join(10)
    # the session persists on the broker: QoS 1 and 2 messages are queued for the tap
    _publish(host, port, [(f"{prefix}/offline/{i}", b"x", 1 + i % 2, False, None) for i in range(6)])
    tap, thread = _start(cfg, prefix)
    try:
        wait_for(lambda: tap.stats.acked >= 6, what="queued messages delivered after restart")
    finally:
        tap.stop()
        thread.join(10)
    topics = sorted(decode_packet(r.value, 5)[0].topic for r in _records(cfg.capture_dir))
    assert topics == sorted(f"{prefix}/offline/{i}" for i in range(6))
