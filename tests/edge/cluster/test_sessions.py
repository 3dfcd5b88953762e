"""Sessions that move between the edges of a cluster (issue 43, item 3):
a persistent session resumes on any edge with nothing acknowledged lost
and QoS 2 exactly once; a CONNECT on another edge takes the session over
[MQTT-3.1.4-3]. The edges are in this process (``EdgeThread``); killed
edges are in ``test_processes.py``."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt import Connack, Disconnect, Properties, Publish
from bridge.mqtt.codec import decode_packet
from tests.edge.cluster.conftest import receive, subscribe
from tests.edge.conftest import RawClient
from tests.edge.util import publish

pytestmark = pytest.mark.broker

KEEP = Properties(session_expiry_interval=600)


def _connect(port: int, level: int, cid: str, clean: bool = False) -> tuple[RawClient, bool]:
    c = RawClient(port, timeout=20)
    fields = {"client_id": cid, "clean_start": clean}
    if level == 5:
        fields["properties"] = KEEP
    ack, _n = decode_packet(c.connect(level, **fields), level, from_client=False)
    assert isinstance(ack, Connack) and ack.reason_code == 0, ack
    return c, ack.session_present


def _pub(port: int, level: int, topic: str, payloads, qos: int = 1, cid: str = "pub") -> None:
    p = RawClient(port)
    p.connect(level, client_id=cid)
    for i, body in enumerate(payloads):
        p.send(publish(level, topic=topic, payload=body, qos=qos, packet_id=i + 1))
        pkt = p.packet()
        if qos == 2:
            assert pkt[0] == 0x50
            p.send(bytes((0x62, 2, (i + 1) >> 8, (i + 1) & 0xFF)))
            pkt = p.packet()
            assert pkt[0] == 0x70
        elif qos == 1:
            assert pkt[0] == 0x40
    p.send(bytes((0xE0, 0)))
    p.close()


def _publishes(c: RawClient, level: int, want: int, ack: bool = True, timeout: float = 10) -> list[Publish]:
    got: list[Publish] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        p = receive(c, level)
        assert p is not None, f"closed after {len(got)} of {want}"
        if isinstance(p, Publish):
            got.append(p)
            if ack and p.qos == 1:
                c.send(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
            elif ack and p.qos == 2:
                c.send(bytes((0x50, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
        elif p.packet_type == 6 and ack:  # PUBREL
            c.send(bytes((0x70, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
    return got


def _quiet(c: RawClient, seconds: float = 0.7) -> list[bytes]:
    """Packets that arrive within ``seconds`` (none expected)."""
    c.sock.settimeout(seconds)
    out = []
    try:
        while True:
            pkt = c.packet()
            if not pkt:
                break
            out.append(pkt)
    except OSError:
        pass
    c.sock.settimeout(10)
    return out


@pytest.mark.parametrize("level", [4, 5])
def test_a_persistent_session_moves_to_another_edge_with_what_was_queued_meanwhile(make_cluster, level):
    e0, e1 = make_cluster(2)
    c, present = _connect(e0.port, level, "mover")
    assert not present
    assert subscribe(c, level, ("m/#", 2)) == [2]
    c.send(bytes((0xE0, 0)))
    c.close()
    # queued while offline, published on both edges, at QoS 1 and 2
    _pub(e0.port, level, "m/a", [b"a%d" % i for i in range(5)], qos=1, cid="p0")
    _pub(e1.port, level, "m/b", [b"b%d" % i for i in range(5)], qos=2, cid="p1")
    c2, present = _connect(e1.port, level, "mover")
    assert present  # the session of edge 0, resumed on edge 1
    got = _publishes(c2, level, 10)
    assert sorted(p.payload for p in got) == sorted([b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)])
    assert [p.payload for p in got if p.topic == "m/a"] == [b"a%d" % i for i in range(5)]  # per-publisher order
    assert [p.payload for p in got if p.topic == "m/b"] == [b"b%d" % i for i in range(5)]
    assert not [x for x in _quiet(c2) if x[0] >> 4 == 3]  # nothing twice
    # and the subscription went with it: a live message on edge 0 reaches it on edge 1
    _pub(e0.port, level, "m/c", [b"live"], qos=1, cid="p2")
    (p,) = _publishes(c2, level, 1)
    assert p.payload == b"live"


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_in_flight_moves_with_its_packet_identifiers_exactly_once(make_cluster, level):
    """The subscriber got QoS 2 PUBLISHes on edge 0 and answered none; it
    reconnects to edge 1: edge 0 closes the old connection (0x8E in MQTT 5),
    edge 1 sends them again with DUP 1 and the same Packet Identifiers
    [MQTT-4.4.0-1], so the client's own QoS 2 state makes them exactly once."""
    e0, e1 = make_cluster(2)
    c, _ = _connect(e0.port, level, "q2")
    assert subscribe(c, level, ("q/#", 2)) == [2]
    _pub(e1.port, level, "q/x", [b"x%d" % i for i in range(3)], qos=2, cid="px")
    first = _publishes(c, level, 3, ack=False)
    assert [p.dup for p in first] == [False] * 3
    ids = [p.packet_id for p in first]
    # PUBREC for the first (it becomes PUBREL due), nothing for the others
    c.send(bytes((0x50, 2, ids[0] >> 8, ids[0] & 0xFF)))
    assert receive(c, level).packet_type == 6  # PUBREL
    c2, present = _connect(e1.port, level, "q2")
    assert present
    if level == 5:
        d = receive(c, 5)
        assert isinstance(d, Disconnect) and d.reason_code == 0x8E
    assert c.packet() == b""
    again = []
    deadline = time.monotonic() + 10
    while len(again) < 3 and time.monotonic() < deadline:
        again.append(receive(c2, level))
    kinds = sorted((type(p).__name__, p.packet_id, getattr(p, "dup", None)) for p in again)
    assert ("PubRel", ids[0], None) in kinds, kinds
    resent = [p for p in again if isinstance(p, Publish)]
    assert sorted(p.packet_id for p in resent) == sorted(ids[1:])
    assert all(p.dup for p in resent)
    assert sorted(p.payload for p in resent) == [b"x1", b"x2"]


@pytest.mark.parametrize("level", [4, 5])
def test_inbound_qos2_state_moves_the_pubrel_is_answered_and_the_message_captured_once(make_cluster, level):
    e0, e1 = make_cluster(2)
    watch, _ = _connect(e1.port, level, "watch")
    assert subscribe(watch, level, ("in/#", 2)) == [2]
    c, _ = _connect(e0.port, level, "sender")
    c.send(publish(level, topic="in/a", payload=b"once", qos=2, packet_id=7))
    assert c.packet()[0] == 0x50  # PUBREC: captured
    c2, present = _connect(e1.port, level, "sender")  # moves before sending PUBREL
    assert present
    c2.send(publish(level, topic="in/a", payload=b"once", qos=2, packet_id=7, dup=True))  # a re-send
    assert c2.packet()[0] == 0x50
    c2.send(bytes((0x62, 2, 0, 7)))
    comp = c2.packet()
    assert comp[0] == 0x70 and (len(comp) == 4 or comp[4] == 0), comp  # PUBCOMP, not 0x92 not found
    got = _publishes(watch, level, 1)
    assert got[0].payload == b"once"
    assert not [x for x in _quiet(watch) if x[0] >> 4 == 3]  # delivered once


def test_clean_start_on_another_edge_ends_the_session_everywhere(make_cluster):
    e0, e1 = make_cluster(2)
    c, _ = _connect(e0.port, 5, "fresh")
    assert subscribe(c, 5, ("f/#", 1)) == [1]
    c.send(bytes((0xE0, 0)))
    c.close()
    c2, present = _connect(e1.port, 5, "fresh", clean=True)
    assert not present
    c2.send(bytes((0xE0, 0)))
    c2.close()
    _pub(e0.port, 5, "f/x", [b"gone"], cid="pf")
    c3, present = _connect(e0.port, 5, "fresh")  # Clean Start 0 on edge 0 again
    assert present  # the session edge 1 started (Clean Start 1, expiry 600 s)...
    # ...and nothing of the one before it survives, its subscription neither [MQTT-3.1.2-4]
    assert not [x for x in _quiet(c3) if x[0] >> 4 == 3]


def test_a_client_that_flips_between_edges_loses_nothing(make_cluster):
    """A client that reconnects to the other edge every time while a
    publisher sends: every QoS 1 message arrives (duplicates allowed, DUP 1)."""
    e0, e1 = make_cluster(2)
    c, _ = _connect(e0.port, 5, "flip")
    assert subscribe(c, 5, ("fl/#", 1)) == [1]
    c.send(bytes((0xE0, 0)))
    c.close()
    seen: set[bytes] = set()
    n = 0
    for round_ in range(6):
        _pub((e0, e1)[round_ % 2].port, 5, "fl/x", [b"%d" % (n + i) for i in range(5)], cid=f"fp{round_}")
        n += 5
        c, present = _connect((e1, e0)[round_ % 2].port, 5, "flip")
        assert present
        for p in _publishes(c, 5, 5, timeout=10):
            seen.add(p.payload)
        c.send(bytes((0xE0, 0)))
        c.close()
    assert seen == {b"%d" % i for i in range(n)}


def test_an_older_connect_seen_late_neither_takes_over_nor_moves_the_newer_session(make_cluster):
    """Edge 1 reads edge 0's records 0.5 s late. A client connects on edge 0,
    then at once on edge 1 (Clean Start 1, before edge 1 read the first
    CONNECT): the later CONNECT wins on both edges -- edge 0 closes its
    connection, edge 1 keeps its own when the older CONNECT reaches it (its
    session stays this edge's, not marked as connected elsewhere)."""
    e0, e1 = make_cluster(2)
    feed = e1.server.feed
    slow = feed.on_records

    def late(records):
        time.sleep(0.5)
        slow(records)

    feed.on_records = late
    old, _ = _connect(e0.port, 5, "twice")
    new, present = _connect(e1.port, 5, "twice", clean=True)
    assert not present
    assert receive(old, 5) is not None  # DISCONNECT 0x8E (or the close)
    time.sleep(1.5)  # edge 1 has read the older CONNECT by now
    assert subscribe(new, 5, ("tw/#", 1)) == [1]
    _pub(e0.port, 5, "tw/x", [b"still here"], cid="twp")
    (p,) = _publishes(new, 5, 1)
    assert p.payload == b"still here"
    assert e1.call(lambda: e1.server.store.sessions["twice"].home) is None
