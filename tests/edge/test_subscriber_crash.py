"""SIGKILL of the edge with messages queued for, and in flight to, a
persistent subscriber: after a restart nothing the publisher got PUBACK for
is lost; the unacknowledged deliveries come again with DUP 1 and the Packet
Identifiers they had [MQTT-4.4.0-1], then what queued while the subscriber
was away, in order. The subscriber's state is rebuilt from the capture log
alone (no snapshot was written: the edge was killed within seconds)."""

from __future__ import annotations

import signal

import pytest

from bridge.mqtt import PubAck, Publish, Subscribe, Subscription, encode
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import RawClient
from tests.edge.test_crash import start_edge

pytestmark = pytest.mark.subprocess

#: on both capture logs (tests/edge/conftest.py): the edge subprocess gets the test's capture settings
CAPTURE_BACKENDS = ("local", "kafka")


def _publishes(c: RawClient, n: int, level: int) -> list[Publish]:
    out = []
    for _ in range(n):
        p, _used = decode_packet(c.packet(), level, from_client=False)
        assert isinstance(p, Publish), p
        out.append(p)
    return out


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_4_4_0_1_unacknowledged_deliveries_survive_a_sigkill(tmp_path, capture_backend, level):
    proc, port = start_edge(tmp_path, *capture_backend)
    try:
        sub = RawClient(port)
        fields = {"clean_start": False} if level == 4 else {
            "clean_start": False, "properties": __import__("bridge.mqtt", fromlist=["Properties"])
            .Properties(session_expiry_interval=3600)}
        sub.connect(level, client_id="me", **fields)
        sub.send_packet(Subscribe(1, [Subscription("site/#", 1)]), level)
        assert sub.packet()[0] == 0x90
        pub = RawClient(port)
        pub.connect(level, client_id="pub")
        for i in range(1, 6):
            pub.send(encode(Publish(qos=1, topic=f"site/{i}", packet_id=i,
                                    payload=f"m{i}".encode()), level))
            assert pub.packet()[0] == 0x40  # PUBACK: the message is durable
        first = _publishes(sub, 5, level)
        assert [p.payload for p in first] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
        assert not any(p.dup for p in first)
        for p in first[:2]:  # the subscriber acknowledges two of them
            sub.send_packet(PubAck(p.packet_id), level)
        sub.close()  # away; more arrive meanwhile
        for i in range(6, 9):
            pub.send(encode(Publish(qos=1, topic=f"site/{i}", packet_id=i,
                                    payload=f"m{i}".encode()), level))
            assert pub.packet()[0] == 0x40
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, port = start_edge(tmp_path, *capture_backend)
    try:
        sub = RawClient(port)
        connack = sub.connect(level, client_id="me", **fields)
        assert connack[2] & 1  # session present
        again = _publishes(sub, 6, level)
        # the three sent and unacknowledged: DUP 1, the same Packet Identifiers, in order
        assert [(p.payload, p.packet_id, p.dup) for p in again[:3]] == [
            (q.payload, q.packet_id, True) for q in first[2:]]
        # then what queued while away, in order, numbered on from there
        assert [p.payload for p in again[3:]] == [b"m6", b"m7", b"m8"]
        assert [p.packet_id for p in again[3:]] == [6, 7, 8]
        assert all(p.qos == 1 and p.topic.startswith("site/") for p in again)
    finally:
        proc.kill()
        proc.wait(10)
