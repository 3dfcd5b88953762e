"""Persistent subscriber sessions in the snapshot (bridge/edge/journal.py):
the queue is stored as capture positions, retention is held below them, and
a graceful restart gives the subscriber what queued while it was away."""

from __future__ import annotations

import json

from bridge.capture.commits import read_commits
from bridge.mqtt import Publish, Subscribe, Subscription, encode
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import RawClient


def test_snapshot_stores_positions_and_holds_retention_below_them(run_edge, edge_config):
    cfg = edge_config()
    e1 = run_edge(config=cfg)
    sub = RawClient(e1.port)
    sub.connect(4, client_id="me", clean_start=False)
    sub.send(encode(Subscribe(1, [Subscription("site/#", 2), Subscription("x/+", 0)]), 4))
    assert sub.packet() == b"\x90\x04\x00\x01\x02\x00"
    sub.close()
    pub = RawClient(e1.port)
    pub.connect(4, client_id="pub")
    for i in (1, 2):
        pub.send(encode(Publish(qos=1, topic=f"site/{i}", packet_id=i, payload=b"p"), 4))
        assert pub.packet() == bytes((0x40, 2, 0, i))
    pub.close()
    e1.stop()  # graceful: writes the snapshot
    doc = json.loads((cfg.edge_state_dir / "sessions.json").read_text())
    me = doc["sessions"]["me"]
    assert me["subs"] == [["site/#", 2, 0, 0, 0, None], ["x/+", 0, 0, 0, 0, None]]
    rows = me["outbox"]["d"]
    assert [(r[2], r[5], r[6]) for r in rows] == [(1, 1, 0), (1, 2, 0)]  # QoS, id, queued
    holds = read_commits(cfg.capture_dir, "holds")["edge-sessions"]
    for p, o in {(r[0], r[1]) for r in rows}:
        assert holds[p] <= o  # retention keeps the queued messages' records
    e2 = run_edge(config=cfg)
    sub = RawClient(e2.port)
    assert sub.connect(4, client_id="me", clean_start=False)[2] == 1  # session present
    got = [decode_packet(sub.packet(), 4, from_client=False)[0] for _ in range(2)]
    assert [(p.topic, p.packet_id, p.qos, p.dup) for p in got] == [
        ("site/1", 1, 1, False), ("site/2", 2, 1, False)]  # never sent: DUP 0


def test_replay_of_a_run_of_pubacks_ends_each_delivery_it_names():
    """A run of 4-byte PUBACKs is one record with ``ack_refs`` (one capture
    position per frame, ``-`` for an acknowledgement of nothing): the replay
    ends exactly the deliveries the run named, as the live edge did."""
    from types import SimpleNamespace

    from bridge.edge.delivery import Receiver
    from bridge.edge.journal import Replayer, message_of_record
    from bridge.edge.router import Router
    from bridge.edge.state import SessionStore
    from bridge.edge.subscription import Sub

    router = Router()
    store = SessionStore()
    s, _present = store.open("me", False, 3600, 0.0, 4)
    router.attach(s)
    router.subscribe(s, Sub("me", "a/#", 1))
    frame = encode(Publish(qos=1, topic="a/b", packet_id=9, payload=b"p"), 4)
    for o in (5, 6, 7):
        router.route(message_of_record(SimpleNamespace(
            value=frame, key=b"pub", partition=0, offset=o, timestamp_us=0,
            stored_headers=[("proto", b"4")])))
    box = s.outbox
    assert len(box.pump(Receiver(4, 20), 0.0)) == 3 and list(box.inflight) == [1, 2, 3]
    run = b"\x40\x02\x00\x01" + b"\x40\x02\x00\x02" + b"\x40\x02\x00\x03"
    record = SimpleNamespace(value=run, key=b"me", partition=1, offset=0, timestamp_us=0)
    # identifier 2 acknowledged nothing when it was captured: it stays in flight
    Replayer(router, {"me": s}).record(record, 4, {"proto": b"4", "ack_refs": b"0:5 - 0:7"}, "me")
    assert list(box.inflight) == [2]
