"""Shared Subscriptions and Wills across the edges of a cluster (issue 43,
items 4 and 5), and an edge that loses its lease (bad input and faults:
"two edges that both believe they own a session must be impossible").
The edges are in this process (``EdgeThread``); an edge is made to "die"
by stopping its beats and its feed and aborting its connections, which is
what the others see of a SIGKILL (``test_processes.py`` has the real one)."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt import Disconnect, Properties, Publish
from bridge.mqtt.connect import Will
from tests.edge.cluster.conftest import (connect_session, publish_each, publishes, quiet, receive,
                                         subscribe)
from tests.edge.conftest import RawClient

pytestmark = pytest.mark.broker

LEASE = "cluster.lease_s=2"


def _freeze(edge) -> None:
    """Make ``edge`` look dead to the others: no beats, no feed, every
    connection aborted (nothing of them captured), as after a SIGKILL."""
    srv = edge.server

    def go():
        srv._stop_feed()
        for conn in list(srv.conns):
            if conn.transport is not None:
                conn.transport.abort()
    srv.loop.call_soon_threadsafe(go)
    time.sleep(0.3)


def _wait_members(edges, group: str, timeout: float = 10) -> None:
    """Until every edge's beats reached the others, with ``group``'s members."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = True
        for e in edges:
            st = e.server.cluster_status()
            seen = [m for i, m in st["members"].items() if i != st["edge_id"]]
            if not all(m.get("shared") is not None for m in seen):
                ok = False
        if ok:
            return
        time.sleep(0.1)
    raise AssertionError("the edges' beats did not reach each other")


def test_a_shared_subscription_spread_over_three_edges_gets_each_message_once(make_cluster):
    e0, e1, e2 = make_cluster(3)
    members = []
    for i, e in enumerate((e0, e1, e2)):
        c, _ = connect_session(e.port, 5, f"worker{i}")
        assert subscribe(c, 5, ("$share/grp/jobs/#", 1)) == [1]
        members.append(c)
    plain, _ = connect_session(e2.port, 5, "watcher")  # a non-shared subscriber sees every message once
    assert subscribe(plain, 5, ("jobs/#", 1)) == [1]
    time.sleep(1.0)
    _wait_members((e0, e1, e2), "grp/jobs/#")
    n = 60
    publish_each(e0.port, 5, "jobs/a", [b"j%02d" % i for i in range(n)], cid="jobpub")
    got: dict[int, list[bytes]] = {}
    for i, c in enumerate(members):
        got[i] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            pkts = quiet(c, 0.5)
            if not pkts:
                break
            for pkt in pkts:
                if pkt[0] >> 4 == 3:
                    from bridge.mqtt.codec import decode_packet
                    p, _ = decode_packet(pkt, 5, from_client=False)
                    got[i].append(p.payload)
                    c.send(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
    every = [x for v in got.values() for x in v]
    assert sorted(every) == [b"j%02d" % i for i in range(n)], {k: len(v) for k, v in got.items()}
    assert all(len(v) >= 5 for v in got.values()), {k: len(v) for k, v in got.items()}  # spread over the edges
    assert sorted(p.payload for p in publishes(plain, 5, n)) == [b"j%02d" % i for i in range(n)]


def test_a_shared_subscription_loses_no_message_when_a_members_edge_dies(make_cluster):
    e0, e1, e2 = make_cluster(3, LEASE)
    a, _ = connect_session(e1.port, 5, "wa")
    b, _ = connect_session(e2.port, 5, "wb")
    for c in (a, b):
        assert subscribe(c, 5, ("$share/g2/t/#", 1)) == [1]
    time.sleep(1.0)
    _freeze(e2)
    time.sleep(2.5)  # e2's beats age out: it is no longer a candidate
    publish_each(e0.port, 5, "t/x", [b"k%02d" % i for i in range(20)], cid="kp")
    got = publishes(a, 5, 20, timeout=10)
    assert sorted(p.payload for p in got) == [b"k%02d" % i for i in range(20)]


def test_a_will_of_a_connection_on_a_dead_edge_is_published_once_by_another(make_cluster):
    e0, e1, e2 = make_cluster(3, LEASE)
    watch0, _ = connect_session(e0.port, 5, "will-watch0")
    watch1, _ = connect_session(e1.port, 5, "will-watch1")
    for w in (watch0, watch1):
        assert subscribe(w, 5, ("wills/#", 1)) == [1]
    c = RawClient(e2.port)
    c.connect(5, client_id="dies", will=Will(topic="wills/dies", payload=b"gone", qos=1),
              properties=Properties(session_expiry_interval=60))
    time.sleep(1.0)  # the CONNECT (with its Will) reached the others
    _freeze(e2)
    for w in (watch0, watch1):
        (p,) = publishes(w, 5, 1, timeout=10)
        assert p.topic == "wills/dies" and p.payload == b"gone"
        assert not [x for x in quiet(w, 1.0) if x[0] >> 4 == 3]  # once


def test_an_edge_without_a_confirmed_lease_closes_its_connections_before_another_takes_the_session(
        make_cluster):
    """Edge A stops getting its beats confirmed (cut off from Kafka, here:
    its beats are no longer appended): it closes its connections with
    DISCONNECT 0x9C Use another server at half the lease, refuses
    CONNECTs, and only after the whole lease does edge B take the session.
    A QoS 2 delivery A had in flight is resent by B with its Packet
    Identifier: the client's QoS 2 state keeps it once."""
    e0, e1 = make_cluster(2, LEASE)
    c, _ = connect_session(e0.port, 5, "cut")
    assert subscribe(c, 5, ("cut/#", 2)) == [2]
    publish_each(e1.port, 5, "cut/x", [b"once"], qos=2, cid="cp")
    (first,) = publishes(c, 5, 1, ack=False)
    srv = e0.server
    real = srv._edge_append

    def no_beats(key, cid, kind, extra):
        return None if kind == b"beat" else real(key, cid, kind, extra)

    srv._edge_append = no_beats
    t0 = time.monotonic()
    d = receive(c, 5)
    assert isinstance(d, Disconnect) and d.reason_code == 0x9C, d  # Use another server
    assert time.monotonic() - t0 < 2.0  # at half the lease, before anyone may take the session
    refused = RawClient(e0.port)
    ack = refused.connect(5, client_id="other")
    assert ack[0] == 0x20 and ack[3] == 0x88  # CONNACK Server unavailable [LG-cluster-lease]
    c2, present = connect_session(e1.port, 5, "cut")  # waits for edge 0 to be declared dead
    assert present
    p = receive(c2, 5)
    assert isinstance(p, Publish) and p.dup and p.packet_id == first.packet_id and p.payload == b"once"
