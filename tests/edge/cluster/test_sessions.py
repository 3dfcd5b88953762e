"""Sessions that move between the edges of a cluster (issue 43, item 3):
a persistent session resumes on any edge with nothing acknowledged lost
and QoS 2 exactly once; a CONNECT on another edge takes the session over
[MQTT-3.1.4-3]. The edges are in this process (``EdgeThread``); killed
edges are in ``test_processes.py``."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt import Disconnect, Publish
from tests.edge.cluster.conftest import (connect_session, leave, publish_each, publishes, quiet, receive,
                                         slow_feed, subscribe)
from tests.edge.util import publish
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

@pytest.mark.parametrize("level", [4, 5])
def test_a_persistent_session_moves_to_another_edge_with_what_was_queued_meanwhile(make_cluster, level):
    e0, e1 = make_cluster(2)
    c, present = connect_session(e0.port, level, "mover")
    assert not present
    assert subscribe(c, level, ("m/#", 2)) == [2]
    leave(c)
    # (edge 1 applied the SUBSCRIBE before it captures for it: see the known defect below)
    wait_for(lambda: knows_subscription(e1, "m/b"), 10, "edge 1 to apply edge 0's SUBSCRIBE")
    # queued while offline, published on both edges, at QoS 1 and 2
    publish_each(e0.port, level, "m/a", [b"a%d" % i for i in range(5)], qos=1, cid="p0")
    publish_each(e1.port, level, "m/b", [b"b%d" % i for i in range(5)], qos=2, cid="p1")
    c2, present = connect_session(e1.port, level, "mover")
    assert present  # the session of edge 0, resumed on edge 1
    got = publishes(c2, level, 10)
    assert sorted(p.payload for p in got) == sorted([b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)])
    assert [p.payload for p in got if p.topic == "m/a"] == [b"a%d" % i for i in range(5)]  # per-publisher order
    assert [p.payload for p in got if p.topic == "m/b"] == [b"b%d" % i for i in range(5)]
    assert not [x for x in quiet(c2) if x[0] >> 4 == 3]  # nothing twice
    # and the subscription went with it: a live message on edge 0 reaches it on edge 1
    publish_each(e0.port, level, "m/c", [b"live"], qos=1, cid="p2")
    (p,) = publishes(c2, level, 1)
    assert p.payload == b"live"


def knows_subscription(edge, topic: str) -> bool:
    """``edge`` has a subscription (of any session) that matches ``topic``."""
    return edge.call(lambda: bool(edge.server.router.tree.match(topic).found))


@pytest.mark.xfail(strict=True, reason="known defect (issue 43 note, 2026-11-29): an edge that captures a message "
                   "before it applied another edge's SUBSCRIBE (its feed late) does not queue it for that session, "
                   "and the session resumed there lacks it; 3 of 16 runs of this file under load hit it")
def test_a_message_captured_before_the_edge_applied_a_remote_subscribe_still_reaches_the_moved_session(
        make_cluster):
    """Edge 1 reads edge 0's records 0.7 s late. A persistent session
    subscribes on edge 0 (SUBACK: the subscription exists) and leaves; a
    message published on edge 1 right after must reach it when it resumes
    on edge 1, as on one server."""
    e0, e1 = make_cluster(2)
    slow_feed(e1, 0.7)
    c, _ = connect_session(e0.port, 5, "late")
    assert subscribe(c, 5, ("l/#", 1)) == [1]
    leave(c)
    publish_each(e1.port, 5, "l/x", [b"after the SUBACK"], qos=1, cid="lp")
    time.sleep(1.5)  # edge 1 has read edge 0's records by now
    c2, present = connect_session(e1.port, 5, "late")
    assert present
    c2.sock.settimeout(3)
    got = publishes(c2, 5, 1, timeout=3)
    assert [p.payload for p in got] == [b"after the SUBACK"]


@pytest.mark.parametrize("level", [4, 5])
def test_qos2_in_flight_moves_with_its_packet_identifiers_exactly_once(make_cluster, level):
    """The subscriber got QoS 2 PUBLISHes on edge 0 and answered none; it
    reconnects to edge 1: edge 0 closes the old connection (0x8E in MQTT 5),
    edge 1 sends them again with DUP 1 and the same Packet Identifiers
    [MQTT-4.4.0-1], so the client's own QoS 2 state makes them exactly once."""
    e0, e1 = make_cluster(2)
    c, _ = connect_session(e0.port, level, "q2")
    assert subscribe(c, level, ("q/#", 2)) == [2]
    wait_for(lambda: knows_subscription(e1, "q/x"), 10, "edge 1 to apply edge 0's SUBSCRIBE (known defect below)")
    publish_each(e1.port, level, "q/x", [b"x%d" % i for i in range(3)], qos=2, cid="px")
    first = publishes(c, level, 3, ack=False)
    assert [p.dup for p in first] == [False] * 3
    ids = [p.packet_id for p in first]
    # PUBREC for the first (it becomes PUBREL due), nothing for the others
    c.send(bytes((0x50, 2, ids[0] >> 8, ids[0] & 0xFF)))
    assert receive(c, level).packet_type == 6  # PUBREL
    c2, present = connect_session(e1.port, level, "q2")
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
    watch, _ = connect_session(e1.port, level, "watch")
    assert subscribe(watch, level, ("in/#", 2)) == [2]
    c, _ = connect_session(e0.port, level, "sender")
    c.send(publish(level, topic="in/a", payload=b"once", qos=2, packet_id=7))
    assert c.packet()[0] == 0x50  # PUBREC: captured
    c2, present = connect_session(e1.port, level, "sender")  # moves before sending PUBREL
    assert present
    c2.send(publish(level, topic="in/a", payload=b"once", qos=2, packet_id=7, dup=True))  # a re-send
    assert c2.packet()[0] == 0x50
    c2.send(bytes((0x62, 2, 0, 7)))
    comp = c2.packet()
    assert comp[0] == 0x70 and (len(comp) == 4 or comp[4] == 0), comp  # PUBCOMP, not 0x92 not found
    got = publishes(watch, level, 1)
    assert got[0].payload == b"once"
    assert not [x for x in quiet(watch) if x[0] >> 4 == 3]  # delivered once


def test_clean_start_on_another_edge_ends_the_session_everywhere(make_cluster):
    e0, e1 = make_cluster(2)
    c, _ = connect_session(e0.port, 5, "fresh")
    assert subscribe(c, 5, ("f/#", 1)) == [1]
    leave(c)
    c2, present = connect_session(e1.port, 5, "fresh", clean=True)
    assert not present
    leave(c2)
    publish_each(e0.port, 5, "f/x", [b"gone"], cid="pf")
    c3, present = connect_session(e0.port, 5, "fresh")  # Clean Start 0 on edge 0 again
    assert present  # the session edge 1 started (Clean Start 1, expiry 600 s)...
    # ...and nothing of the one before it survives, its subscription neither [MQTT-3.1.2-4]
    assert not [x for x in quiet(c3) if x[0] >> 4 == 3]


def test_a_client_that_flips_between_edges_loses_nothing(make_cluster):
    """A client that reconnects to the other edge every time while a
    publisher sends: every QoS 1 message arrives (duplicates allowed, DUP 1)."""
    e0, e1 = make_cluster(2)
    c, _ = connect_session(e0.port, 5, "flip")
    assert subscribe(c, 5, ("fl/#", 1)) == [1]
    leave(c)
    seen: set[bytes] = set()
    n = 0
    for round_ in range(6):
        publish_each((e0, e1)[round_ % 2].port, 5, "fl/x", [b"%d" % (n + i) for i in range(5)], cid=f"fp{round_}")
        n += 5
        c, present = connect_session((e1, e0)[round_ % 2].port, 5, "flip")
        assert present
        for p in publishes(c, 5, 5, timeout=10):
            seen.add(p.payload)
        leave(c)
    assert seen == {b"%d" % i for i in range(n)}


def test_an_older_connect_seen_late_neither_takes_over_nor_moves_the_newer_session(make_cluster):
    """Edge 1 reads edge 0's records 0.5 s late. A client connects on edge 0,
    then at once on edge 1 (Clean Start 1, before edge 1 read the first
    CONNECT): the later CONNECT wins on both edges -- edge 0 closes its
    connection, edge 1 keeps its own when the older CONNECT reaches it (its
    session stays this edge's, not marked as connected elsewhere)."""
    e0, e1 = make_cluster(2)
    slow_feed(e1, 0.5)
    old, _ = connect_session(e0.port, 5, "twice")
    new, present = connect_session(e1.port, 5, "twice", clean=True)
    assert not present
    assert receive(old, 5) is not None  # DISCONNECT 0x8E (or the close)
    time.sleep(1.5)  # edge 1 has read the older CONNECT by now
    assert subscribe(new, 5, ("tw/#", 1)) == [1]
    publish_each(e0.port, 5, "tw/x", [b"still here"], cid="twp")
    (p,) = publishes(new, 5, 1)
    assert p.payload == b"still here"
    assert e1.call(lambda: e1.server.store.sessions["twice"].home) is None


def test_an_old_connections_records_read_late_do_not_change_the_new_session(make_cluster):
    """Edge 1 reads edge 0's records 0.5 s late. A persistent session
    subscribes on edge 0 and leaves; the client starts a new session on
    edge 1 (Clean Start 1) before edge 1 read any of that. When edge 1 reads
    the old connection's CONNECT and SUBSCRIBE, they are older than its own
    CONNECT: the new session gets no subscription from them
    [MQTT-3.1.2-4] (the edge had it before: the failure CI found)."""
    e0, e1 = make_cluster(2)
    slow_feed(e1, 0.5)
    c, _ = connect_session(e0.port, 5, "renew")
    assert subscribe(c, 5, ("rn/#", 1)) == [1]
    leave(c)
    c2, present = connect_session(e1.port, 5, "renew", clean=True)
    assert not present
    leave(c2)
    time.sleep(1.5)  # edge 1 has read edge 0's records by now
    publish_each(e1.port, 5, "rn/x", [b"not for the new session"], cid="rnp")
    c3, present = connect_session(e1.port, 5, "renew")
    assert present
    assert not [x for x in quiet(c3) if x[0] >> 4 == 3]


def _per_client_state(e) -> dict:
    """What an edge keeps per client or per move, by kind (a flipping
    client must not make any of it grow)."""
    def read():
        s = e.server
        box = s.store.sessions["flipm"].outbox
        return {"sessions": len(s.store.sessions), "router": len(s.router.sessions), "clients": len(s.clients),
                "conns": len(s.applier.conns), "unmatched": len(s.applier.unmatched),
                "live": len(s.applier.live), "remote_wills": len(s.applier.remote_wills),
                "releases": len(s._releases), "fence_wait": len(s._fence_wait), "conn_objects": len(s.conns),
                "queued": len(box.queue) if box is not None else 0,
                "inflight": len(box.inflight) if box is not None else 0}
    return e.call(read)


def test_a_client_flipping_between_edges_neither_loses_messages_nor_grows_memory(make_cluster):
    """[issue 43, bad input] A client that moves to the other edge at every
    connection (440 moves, a message published on the edge it left each
    time): every message arrives; what the edges keep per client and per
    move (sessions, connections, CONNECTs known, claims, fences, queues) is
    the same after 440 moves as after 40, and the memory the edges' code
    allocated (tracemalloc, lines under bridge/, after a collection) grows
    by less than 256 KiB meanwhile (measured: 95 KiB, the capture log's
    bounded cache of partition keys, 4,096 connection ids at most; a leak
    of 600 bytes a move would fail it)."""
    import gc
    import tracemalloc

    e0, e1 = make_cluster(2)
    c, _ = connect_session(e0.port, 5, "flipm")
    assert subscribe(c, 5, ("fm/#", 1)) == [1]
    leave(c)
    seen: set[int] = set()  # (numbers, not the payloads: bytes the test kept would count as the edges')

    def flips(first: int, last: int) -> None:
        for n in range(first, last):
            publish_each((e0, e1)[n % 2].port, 5, "fm/x", [b"%d" % n], cid="fmp")
            c, present = connect_session((e1, e0)[n % 2].port, 5, "flipm")
            assert present
            seen.update(int(p.payload) for p in publishes(c, 5, 1, timeout=10))
            leave(c)

    def state() -> list[dict]:
        return [_per_client_state(e) for e in (e0, e1)]

    flips(0, 40)
    time.sleep(0.5)
    before = state()
    tracemalloc.start()
    try:
        gc.collect()  # (the edges' collector runs rarely: cycles of closed connections wait for it)
        first = tracemalloc.take_snapshot()
        flips(40, 440)
        try:
            wait_for(lambda: state() == before, 10, "the edges' per-client state as after 40 moves")
        except AssertionError:
            assert state() == before  # (shows what differs)
        gc.collect()
        last = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert seen == set(range(440))
    ours = [tracemalloc.Filter(True, "*/bridge/*")]
    diff = last.filter_traces(ours).compare_to(first.filter_traces(ours), "lineno")
    grown = sum(d.size_diff for d in diff)
    assert grown < 256 * 1024, [str(d) for d in diff[:10]]
