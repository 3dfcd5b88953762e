"""Delivery across the edges of a cluster (issue 43, items 1 and 2): what
one edge captured reaches the subscribers of every other edge by the same
rules as on one edge, retained messages are exact across edges, and a
CONNECT on another edge takes the connection over [MQTT-3.1.4-3]."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt import Disconnect, Properties
from tests.edge.cluster.conftest import leave, publishes, receive, slow_feed, subscribe
from tests.edge.conftest import RawClient
from tests.edge.util import publish

pytestmark = pytest.mark.broker


def _ack(client, qos: int, pid: int) -> None:
    """Complete the publisher's QoS 1/2 flow for ``pid``."""
    if qos == 1:
        assert client.packet()[0] == 0x40
    elif qos == 2:
        assert client.packet()[0] == 0x50
        client.send(bytes((0x62, 2, pid >> 8, pid & 0xFF)))
        assert client.packet()[0] == 0x70


@pytest.mark.parametrize("level", [4, 5])
def test_a_publish_on_one_edge_reaches_subscribers_on_both_once_at_each_qos(make_cluster, level):
    e0, e1 = make_cluster(2)
    far = RawClient(e1.port)
    far.connect(level, client_id="far")
    near = RawClient(e0.port)
    near.connect(level, client_id="near")
    assert subscribe(far, level, ("q/#", 2)) == [2]
    assert subscribe(near, level, ("q/#", 1)) == [1]
    pub = RawClient(e0.port)
    pub.connect(level, client_id="pub")
    for i in range(9):
        qos = i % 3
        pub.send(publish(level, topic=f"q/{i}", payload=b"m%d" % i, qos=qos, packet_id=i + 1))
        _ack(pub, qos, i + 1)
    got_far = publishes(far, level, 9)
    got_near = publishes(near, level, 9)
    # per-publisher order on every edge; QoS the minimum of published and granted
    assert [p.payload for p in got_far] == [b"m%d" % i for i in range(9)]
    assert [p.qos for p in got_far] == [i % 3 for i in range(9)]
    assert [p.payload for p in got_near] == [b"m%d" % i for i in range(9)]
    assert [p.qos for p in got_near] == [min(i % 3, 1) for i in range(9)]
    # once each: nothing more comes on either edge
    far.sock.settimeout(0.5)
    near.sock.settimeout(0.5)
    for c in (far, near):
        try:
            extra = c.packet()
        except OSError:
            extra = b""
        assert extra == b"" or extra[0] >> 4 not in (3,), extra


def test_mqtt5_properties_subscription_identifier_and_expiry_cross_the_edges(make_cluster):
    e0, e1 = make_cluster(2)
    far = RawClient(e1.port)
    far.connect(5, client_id="far5")
    assert subscribe(far, 5, ("p/+", 1, False, True, 0), sub_id=7) == [1]
    pub = RawClient(e0.port)
    pub.connect(5, client_id="pub5")
    props = Properties(content_type="text/plain", message_expiry_interval=3600,
                       user_properties=[("k", "v")], correlation_data=b"\x01\x02")
    pub.send(publish(5, topic="p/1", payload=b"hello", qos=1, packet_id=3, retain=True,
                     properties=props))
    _ack(pub, 1, 3)
    (p,) = publishes(far, 5, 1)
    assert p.payload == b"hello" and p.topic == "p/1"
    assert p.retain  # Retain As Published
    assert p.properties.subscription_identifiers == [7]
    assert p.properties.content_type == "text/plain"
    assert p.properties.user_properties == [("k", "v")]
    assert p.properties.correlation_data == b"\x01\x02"
    assert 3590 <= p.properties.message_expiry_interval <= 3600


def test_an_expired_message_is_not_delivered_by_another_edge(make_cluster):
    """Expiry counts from the original publish [MQTT-3.3.2-5]: a message
    queued for an offline session on another edge expires there."""
    e0, e1 = make_cluster(2)
    far = RawClient(e1.port)
    far.connect(5, client_id="late", clean_start=False,
                properties=Properties(session_expiry_interval=300))
    assert subscribe(far, 5, ("x/#", 1)) == [1]
    leave(far)
    pub = RawClient(e0.port)
    pub.connect(5, client_id="pubx")
    pub.send(publish(5, topic="x/short", payload=b"gone", qos=1, packet_id=1,
                     properties=Properties(message_expiry_interval=1)))
    _ack(pub, 1, 1)
    pub.send(publish(5, topic="x/long", payload=b"kept", qos=1, packet_id=2))
    _ack(pub, 1, 2)
    time.sleep(2.2)
    back = RawClient(e1.port)
    back.connect(5, client_id="late", clean_start=False,
                 properties=Properties(session_expiry_interval=300))
    (p,) = publishes(back, 5, 1)
    assert p.payload == b"kept"


def test_retained_exact_across_edges_even_when_the_feed_lags(make_cluster):
    """A SUBSCRIBE on edge B after a retained publish on edge A was
    acknowledged gets it, however late B's feed is: the SUBSCRIBE waits at
    the fence (bridge.edge.cluster). The feed is slowed by 300 ms here, so
    without the fence every subscription below would miss its message."""
    e0, e1 = make_cluster(2)
    slow_feed(e1, 0.3)
    subs = []
    for i in range(5):
        s = RawClient(e1.port)
        s.connect(4, client_id=f"s{i}")
        subs.append(s)
    pub = RawClient(e0.port)
    pub.connect(4, client_id="pubr")
    for i, s in enumerate(subs):
        pub.send(publish(4, topic=f"r/{i}", payload=b"v%d" % i, qos=1, packet_id=i + 1, retain=True))
        _ack(pub, 1, i + 1)
        assert subscribe(s, 4, (f"r/{i}", 1)) == [1]
        (p,) = publishes(s, 4, 1)
        assert p.retain and p.payload == b"v%d" % i
    # cleared on edge A: served by no edge
    pub.send(publish(4, topic="r/0", payload=b"", qos=1, packet_id=9, retain=True))
    _ack(pub, 1, 9)
    for e in (e0, e1):
        c = RawClient(e.port)
        c.connect(4, client_id=f"after{e.port}")
        assert subscribe(c, 4, ("r/#", 1)) == [1]
        got = publishes(c, 4, 4)
        assert sorted(p.payload for p in got) == [b"v1", b"v2", b"v3", b"v4"]


def test_retained_later_publish_on_another_edge_wins(make_cluster):
    """The hybrid logical clock: a retained publish on edge B made after B
    saw edge A's for the same topic has the higher capture sequence, so
    every edge serves B's."""
    e0, e1 = make_cluster(2)
    a = RawClient(e0.port)
    a.connect(4, client_id="a")
    b = RawClient(e1.port)
    b.connect(4, client_id="b")
    for i in range(5):
        a.send(publish(4, topic="w/t", payload=b"A%d" % i, qos=1, packet_id=1, retain=True))
        _ack(a, 1, 1)
        watch = RawClient(e1.port)  # B has seen A's publish once its SUBSCRIBE is answered
        watch.connect(4, client_id=f"w{i}")
        assert subscribe(watch, 4, ("w/t", 0)) == [0]
        b.send(publish(4, topic="w/t", payload=b"B%d" % i, qos=1, packet_id=2, retain=True))
        _ack(b, 1, 2)
        for e in (e0, e1):
            c = RawClient(e.port)
            c.connect(4, client_id=f"c{i}{e.port}")
            assert subscribe(c, 4, ("w/t", 0)) == [0]
            (p,) = publishes(c, 4, 1)
            assert p.payload == b"B%d" % i, (i, e.port)


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_3_1_4_3_a_connect_on_another_edge_takes_the_connection_over(make_cluster, level):
    e0, e1 = make_cluster(2)
    old = RawClient(e0.port)
    old.connect(level, client_id="mover")
    new = RawClient(e1.port)
    new.connect(level, client_id="mover")
    if level == 5:
        d = receive(old, 5)
        assert isinstance(d, Disconnect) and d.reason_code == 0x8E  # Session taken over
    assert old.packet() == b""  # closed
    # the newer connection stays: the older CONNECT, seen later, takes nothing over
    new.send(bytes((0xC0, 0)))
    assert new.packet()[0] == 0xD0
