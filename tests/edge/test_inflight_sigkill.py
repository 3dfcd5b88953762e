"""SIGKILL of the edge with a persistent subscriber's in-flight window full
and its queue at ``edge.max_queued_messages``: after the restart every
PUBLISH that was sent and not acknowledged comes again first, DUP 1, with
its Packet Identifier [MQTT-4.4.0-1]; the queue bound drops none of them,
and what was never sent follows in order, DUP 0 [MQTT-3.3.1-1] (issue 38,
item 2: recovery put them back in the queue, where the bound dropped the
oldest first, exactly the ones already sent)."""

from __future__ import annotations

import signal

import pytest

from bridge.mqtt import (Properties, PubAck, PubComp, PubRec, PubRel, Publish, Subscribe,
                         Subscription, encode)
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import RawClient
from tests.edge.test_crash import start_edge

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

pytestmark = pytest.mark.subprocess

BOUND = 100
WINDOW = 20  # edge.max_inflight_messages, the default


def _publish_all(pub: RawClient, level: int, qos: int, first: int, count: int) -> None:
    """Publishes ``m<first>`` .. and waits for each one's acknowledgement
    (the edge sends it once the message is durable)."""
    for i in range(first, first + count):
        pub.send(encode(Publish(qos=qos, topic=f"site/{i}", packet_id=i,
                                payload=f"m{i}".encode()), level))
        ack = pub.packet()
        if qos == 1:
            assert ack[0] == 0x40, ack
        else:
            assert ack[0] == 0x50, ack
            pub.send(encode(PubRel(i), level))
            assert pub.packet()[0] == 0x70


def _receive(sub: RawClient, level: int, n: int, ack: bool) -> list[Publish]:
    """The next ``n`` PUBLISHes; with ``ack`` each is acknowledged as it
    comes (PUBACK, or PUBREC then PUBCOMP for its PUBREL)."""
    out: list[Publish] = []
    while len(out) < n:
        pkt = sub.packet()
        assert pkt, f"connection closed or silent after {len(out)} of {n} PUBLISHes"
        p, _ = decode_packet(pkt, level, from_client=False)
        if isinstance(p, Publish):
            out.append(p)
            if ack:
                sub.send(encode(PubAck(p.packet_id) if p.qos == 1 else PubRec(p.packet_id),
                                level))
        elif isinstance(p, PubRel):
            sub.send(encode(PubComp(p.packet_id), level))
    return out


@pytest.mark.parametrize("level,qos", [(4, 1), (5, 2)])
def test_mqtt_4_4_0_1_in_flight_deliveries_are_resent_first_after_a_sigkill(tmp_path, capture_backend,
                                                                          level, qos):
    settings = (f"edge.max_queued_messages={BOUND}", *capture_backend)
    fields = {"clean_start": False}
    if level == 5:
        fields["properties"] = Properties(session_expiry_interval=3600)
    proc, port = start_edge(tmp_path, *settings)
    try:
        sub = RawClient(port)
        sub.connect(level, client_id="me", **fields)
        sub.send(encode(Subscribe(1, [Subscription("site/#", qos)]), level))
        assert sub.packet()[0] == 0x90
        pub = RawClient(port)
        pub.connect(level, client_id="pub")
        _publish_all(pub, level, qos, 1, WINDOW)
        first = _receive(sub, level, WINDOW, ack=False)  # sent, never acknowledged
        assert [(p.payload, p.dup) for p in first] == [(f"m{i}".encode(), False)
                                                       for i in range(1, WINDOW + 1)]
        _publish_all(pub, level, qos, WINDOW + 1, BOUND)  # queued: the bound exactly
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    proc, port = start_edge(tmp_path, *settings)
    try:
        sub = RawClient(port)
        connack = sub.connect(level, client_id="me", **fields)
        assert connack[0] == 0x20 and connack[2] & 1  # session present
        again = _receive(sub, level, WINDOW + BOUND, ack=True)
        # the ones in flight at the kill: first, DUP 1, the same Packet Identifiers, in order
        assert [(p.payload, p.packet_id, p.dup) for p in again[:WINDOW]] == [
            (q.payload, q.packet_id, True) for q in first], "in-flight deliveries lost"
        # then the queue, in order, never sent before: DUP 0, numbered on
        assert [(p.payload, p.packet_id, p.dup) for p in again[WINDOW:]] == [
            (f"m{i}".encode(), i, False) for i in range(WINDOW + 1, WINDOW + BOUND + 1)]
        assert all(p.qos == qos for p in again)
    finally:
        proc.kill()
        proc.wait(10)
