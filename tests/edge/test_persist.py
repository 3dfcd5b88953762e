"""Persistent sessions across restarts: snapshot + replay of the capture log,
on both capture logs: the local files and a Kafka topic of the test's own
(the real Kafka of scripts/services): a session's state is positions in
the log either way."""

from __future__ import annotations

import json

import pytest

from bridge.edge.persist import load_snapshot, recover, replay, write_snapshot
from bridge.edge.state import NEVER_EXPIRES, ClientSession, Qos2Entry, SessionStore
from bridge.mqtt import Properties
from tests.edge.conftest import reader_of
from tests.edge.util import Harness, connect, publish


@pytest.fixture
def log(any_log):
    """The capture log the sessions append to, local or Kafka (tests/edge/conftest.py)."""
    return any_log


def session(log, store, conn_id, level, **connect_fields) -> Harness:
    h = Harness(store=store, log=log, conn_id=conn_id)
    h.feed(connect(level, **connect_fields))
    return h


def recovered(tmp_path, log) -> SessionStore:
    log.flush()
    store, _wills, _n = recover(tmp_path / "edge", reader_of(log), log.next_offsets(), log.stream)
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
    n = replay(reader_of(log), snap.store, snap.offsets, log.next_offsets())
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


# ---------------------------------------------------------------- owed Wills

def _will(topic, delay=None, **kw):
    from bridge.mqtt import Will

    props = Properties(will_delay_interval=delay) if delay is not None else Properties()
    return Will(topic=topic, payload=b"gone:" + topic.encode(), properties=props, **kw)


def _lost(h: Harness, log) -> list:
    """The connection drops; the server captures the Wills due now (delay 0)
    and keeps the delayed ones pending, as EdgeServer._will does."""
    h.perform(h.session.connection_lost(h.now))
    pending = []
    for w in h.wills:
        if w.delay_s <= 0:
            log.append(w.conn_id, w.key, w.frame, w.headers)
        else:
            pending.append(w)
    h.wills.clear()
    return pending


def owed(tmp_path, log) -> dict:
    log.flush()
    _store, wills, _n = recover(tmp_path / "edge", reader_of(log), log.next_offsets(), log.stream)
    return wills


def test_wills_a_crash_leaves_owed_are_recovered_from_the_log_MQTT_3_1_2_10(tmp_path, log):
    live = SessionStore()
    open3 = session(log, live, "c1", 4, client_id="open3", will=_will("w/open3", qos=1, retain=True))
    expected = open3.session.owed_will()  # what the edge would capture if this connection died
    bye = session(log, live, "c2", 5, client_id="bye", will=_will("w/bye"))
    bye.feed(b"\xe0\x00")  # normal DISCONNECT: the Will is deleted [MQTT-3.1.2-10]
    lost = session(log, live, "c3", 5, client_id="lost", will=_will("w/lost", 30),
                   properties=Properties(session_expiry_interval=60))
    assert [w.delay_s for w in _lost(lost, log)] == [30]  # pending when the edge dies
    sent = session(log, live, "c4", 4, client_id="sent", will=_will("w/sent"))
    assert _lost(sent, log) == []  # captured at once: not owed
    back = session(log, live, "c5", 5, client_id="back", will=_will("w/back", 30),
                   properties=Properties(session_expiry_interval=60))
    _lost(back, log)
    session(log, live, "c6", 5, client_id="back",  # resumed within the delay [MQTT-3.1.3-9]
            clean_start=False, properties=Properties(session_expiry_interval=60))
    d04 = session(log, live, "c7", 5, client_id="d04", will=_will("w/d04", 10),
                  properties=Properties(session_expiry_interval=60))
    d04.feed(bytes.fromhex("E00704051100000005"))  # 0x04 with Will, Session Expiry 5
    session(log, live, "c8", 5, client_id="nowill")

    wills = owed(tmp_path, log)

    assert sorted(wills) == ["d04", "lost", "open3"]
    w = wills["open3"]
    assert (w.frame, w.headers, w.delay_s, w.conn_id, w.key) == \
        (expected.frame, expected.headers, 0, "c1", b"open3")
    assert dict(w.headers)["origin"] == b"will"
    assert wills["lost"].delay_s == 30 and wills["d04"].delay_s == 5


def test_owed_wills_go_through_the_snapshot(tmp_path, log):
    live = SessionStore()
    a = session(log, live, "c1", 4, client_id="a", will=_will("w/a"))
    b = session(log, live, "c2", 4, client_id="b", will=_will("w/b"))
    log.flush()
    snap_wills = {c: h.session.owed_will().to_json() for c, h in (("a", a), ("b", b))}
    write_snapshot(tmp_path / "edge", live.to_json(), log.next_offsets(), log.stream, snap_wills)
    b.feed(b"\xe0\x00")  # after the snapshot: b leaves normally
    c = session(log, live, "c3", 4, client_id="c", will=_will("w/c"))

    wills = owed(tmp_path, log)

    assert sorted(wills) == ["a", "c"]
    assert wills["a"].frame == a.session.owed_will().frame
    assert wills["c"].frame == c.session.owed_will().frame


def test_recovered_3x_session_is_marked_and_expires_with_the_configured_time(tmp_path, log):
    live = SessionStore()
    session(log, live, "c1", 4, client_id="v3", clean_start=False).feed(b"\xe0\x00")
    session(log, live, "c2", 5, client_id="v5", clean_start=False,
            properties=Properties(session_expiry_interval=NEVER_EXPIRES)).feed(b"\xe0\x00")
    store = recovered(tmp_path, log)
    assert store.sessions["v3"].v3 and not store.sessions["v5"].v3
    store.configure(60, None, None)
    ended = store.sessions["v3"].disconnected_at
    assert store.expire(ended + 59) == []
    assert store.expire(ended + 60) == ["v3"]
    assert list(store.sessions) == ["v5"]
