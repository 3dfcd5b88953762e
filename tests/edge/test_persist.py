"""Persistent sessions across restarts: snapshot + replay of the capture log."""

from __future__ import annotations

import json

import pytest

from bridge.capture import CaptureLog, LogReader
from bridge.edge.persist import load_snapshot, recover, replay, write_snapshot
from bridge.edge.state import NEVER_EXPIRES, ClientSession, Qos2Entry, SessionStore
from bridge.mqtt import Properties
from tests.edge.util import Harness, connect, publish


@pytest.fixture
def log(tmp_path):
    lg = CaptureLog.open(tmp_path / "capture", fsync_interval_ms=1, partitions=3)
    yield lg
    lg.close()


def session(log, store, conn_id, level, **connect_fields) -> Harness:
    h = Harness(store=store, log=log, conn_id=conn_id)
    h.feed(connect(level, **connect_fields))
    return h


def recovered(tmp_path, log) -> SessionStore:
    log.flush()
    store, _n = recover(tmp_path / "edge", LogReader(log.root), log.next_offsets(), log.stream)
    return store


def test_recovers_qos2_ids_awaiting_pubrel_of_persistent_sessions_only(tmp_path, log):
    live = SessionStore()
    a = session(log, live, "c1", 4, client_id="keep", clean_start=False)
    for pid in (1, 2, 3):
        a.feed(publish(4, topic=f"t/{pid}", qos=2, packet_id=pid))
    a.feed(b"\x62\x02\x00\x02")
    b = session(log, live, "c2", 5, client_id="clean")
    b.feed(publish(5, qos=2, packet_id=5))
    c = session(log, live, "c3", 5, client_id="v5keep",
                properties=Properties(session_expiry_interval=3600))
    c.feed(publish(5, topic="full/topic", qos=2, packet_id=9, properties=Properties(topic_alias=1)))
    c.feed(publish(5, topic="", qos=2, packet_id=10, properties=Properties(topic_alias=1)))
    store = recovered(tmp_path, log)
    assert set(store.sessions) == {"keep", "v5keep"}
    keep = store.sessions["keep"]
    assert sorted(keep.qos2) == [1, 3] and keep.expiry_s == NEVER_EXPIRES
    live_entry = a.session.client.qos2[3]
    assert keep.qos2[3] == live_entry and live_entry.seq is not None  # same coordinates
    v5 = store.sessions["v5keep"]
    assert {pid: e.topic for pid, e in v5.qos2.items()} == {9: "full/topic", 10: "full/topic"}
    assert all(not s.connected and s.disconnected_at for s in store.sessions.values())


def test_dup_resends_and_rejected_frames_do_not_change_the_state(tmp_path, log):
    live = SessionStore()
    a = session(log, live, "c1", 4, client_id="k", clean_start=False)
    first = publish(4, qos=2, packet_id=4, topic="one")
    a.feed(first)
    a.feed(bytes((first[0] | 8,)) + first[1:])  # re-send: recorded with dup=1
    a.feed(b"\x36\x03\x00\x01x")  # QoS 3: rejected, closes
    store = recovered(tmp_path, log)
    (entry,) = store.sessions["k"].qos2.values()
    assert entry.topic == "one" and entry.seq == 1


def test_disconnect_ends_a_session_whose_expiry_it_sets_to_0(tmp_path, log):
    live = SessionStore()
    a = session(log, live, "c1", 5, client_id="x", properties=Properties(session_expiry_interval=60))
    a.feed(publish(5, qos=2, packet_id=1))
    a.feed(bytes.fromhex("E00700051100000000"))
    b = session(log, live, "c2", 4, client_id="y", clean_start=False)
    b.feed(publish(4, qos=2, packet_id=1))
    b2 = session(log, live, "c3", 4, client_id="y", clean_start=True)  # clean start: state gone
    b2.feed(b"\xe0\x00")
    assert recovered(tmp_path, log).sessions == {}


def test_snapshot_then_replay_from_its_offsets(tmp_path, log):
    live = SessionStore()
    a = session(log, live, "c1", 4, client_id="k", clean_start=False)
    a.feed(publish(4, qos=2, packet_id=1, topic="before"))
    log.flush()
    write_snapshot(tmp_path / "edge", live.to_json(), log.next_offsets(), log.stream)
    a.feed(publish(4, qos=2, packet_id=2, topic="after") + b"\x62\x02\x00\x01")
    log.flush()
    snap = load_snapshot(tmp_path / "edge")
    assert sorted(snap.store.sessions["k"].qos2) == [1]
    n = replay(LogReader(log.root), snap.store, snap.offsets, log.next_offsets())
    assert n == 2  # only the records after the snapshot
    assert {p: e.topic for p, e in snap.store.sessions["k"].qos2.items()} == {2: "after"}


def test_a_damaged_snapshot_is_an_error_naming_the_file(tmp_path):
    d = tmp_path / "edge"
    d.mkdir()
    (d / "sessions.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match=r"sessions\.json cannot be read"):
        load_snapshot(d)


def test_store_round_trips_through_json():
    store = SessionStore()
    s, present = store.open("a", False, 30, 100.0)
    assert not present
    s.qos2[7] = Qos2Entry("t", 5, 1, 2)
    store.close(s, 200.0)
    back = SessionStore.from_json(json.loads(json.dumps(store.to_json())))
    b = back.sessions["a"]
    assert (b.expiry_s, b.disconnected_at, b.qos2) == (30, 200.0, {7: Qos2Entry("t", 5, 1, 2)})
    assert back.expire(229.0) == [] and back.expire(230.0) == ["a"]
    assert isinstance(ClientSession.from_json("z", {"expiry_s": 1}), ClientSession)
