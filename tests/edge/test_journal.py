"""Persistent subscriber sessions in the snapshot (bridge/edge/journal.py):
the queue is stored as capture positions, retention is held below them, and
a graceful restart gives the subscriber what queued while it was away."""

from __future__ import annotations

import json

import pytest

from bridge.capture.commits import read_commits
from bridge.mqtt import Publish, Subscribe, Subscription, encode
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import RawClient

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")


def _two_queued_for_me(run_edge, cfg) -> list:
    """A persistent subscriber ``me`` away while two QoS 1 messages arrive;
    the edge stopped gracefully (it writes the snapshot). Returns the
    snapshot's outbox rows of ``me``."""
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
    return rows


def test_snapshot_stores_positions_and_a_restart_delivers_them(run_edge, edge_config):
    cfg = edge_config()
    _two_queued_for_me(run_edge, cfg)
    e2 = run_edge(config=cfg)
    sub = RawClient(e2.port)
    assert sub.connect(4, client_id="me", clean_start=False)[2] == 1  # session present
    got = [decode_packet(sub.packet(), 4, from_client=False)[0] for _ in range(2)]
    assert [(p.topic, p.packet_id, p.qos, p.dup) for p in got] == [
        ("site/1", 1, 1, False), ("site/2", 2, 1, False)]  # never sent: DUP 0


@pytest.mark.local_capture("the edge applies retention (and its holds) to local files only; a "
                           "Kafka topic keeps records by its own retention.ms, checked at open "
                           "[LG-capture-kafka-retention]")
def test_snapshot_holds_retention_below_the_queued_positions(run_edge, edge_config):
    cfg = edge_config()
    rows = _two_queued_for_me(run_edge, cfg)
    holds = read_commits(cfg.capture_dir, "holds")["edge-sessions"]
    for p, o in {(r[0], r[1]) for r in rows}:
        assert holds[p] <= o  # retention keeps the queued messages' records


def test_restore_reads_the_snapshots_positions_in_runs_not_record_by_record():
    """Recovery reads the messages a snapshot's outboxes refer to in ranges
    (one per run of near offsets), not one read per message: on Kafka a read
    is a round trip (about 0.1 s), and 400 queued messages took 40 s. A run
    that cannot be read is read record by record: only the unreadable
    message's deliveries are dropped."""
    from types import SimpleNamespace

    from bridge.edge import journal
    from bridge.edge.router import Router
    from bridge.edge.state import SessionStore

    frame = encode(Publish(qos=1, topic="site/x", packet_id=1, payload=b"p"), 4)

    class Reader:
        partitions = 2
        calls: list = []

        def records(self, p, lo, hi):
            self.calls.append((p, lo, hi))
            for o in range(lo, hi):
                if o == 7000:
                    raise OSError("deleted")
                yield SimpleNamespace(value=frame, key=b"pub", partition=p, offset=o, timestamp_us=0,
                                      stored_headers=[("proto", b"4")])

    far = 15 + journal.RUN_GAP + 1  # just beyond the gap: a run of its own
    refs = [(0, 10), (0, 11), (0, 15), (1, 3), (0, far), (1, 7000), (1, 7001)]
    store = SessionStore()
    store.open("me", False, 3600, 0.0, 4)
    docs = {"me": {"subs": [], "outbox": {"k": len(refs), "d": [
        [p, o, 1, 0, [], i + 1, 0, 0] for i, (p, o) in enumerate(refs)]}}}
    reader = Reader()
    assert journal.restore(store, Router(), docs, reader) == len(refs) - 1  # 7000 is lost
    assert sorted(reader.calls) == sorted([
        (0, 10, 16), (0, far, far + 1), (1, 3, 4), (1, 7000, 7002),  # runs, and lone records
        (1, 7000, 7001), (1, 7001, 7002)])  # the run that failed, record by record
    box = store.sessions["me"].outbox
    assert [d.msg.ref for d in box.queue] == [r for r in refs if r != (1, 7000)]


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
