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
