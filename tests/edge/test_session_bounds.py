"""Persistent sessions do not grow without bound (issue 21 item 10): MQTT 3.x
Clean Session 0 sessions expire after edge.persistent_session_expiry_s, and
the store (hence the snapshot) keeps at most edge.max_persistent_sessions
sessions and edge.max_stored_qos2_ids QoS 2 ids of disconnected sessions."""

from __future__ import annotations

import json
import logging

from bridge.edge.state import NEVER_EXPIRES, SessionStore
from tests.edge.conftest import RawClient, wait_for
from tests.edge.util import publish

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")


def _stored(store: SessionStore, cid: str, level: int, ids: int, at: float) -> None:
    s, _ = store.open(cid, False, NEVER_EXPIRES, at, level)
    for pid in range(1, ids + 1):
        s.qos2[pid] = None
    store.close(s, at)


def test_v3_persistent_session_expires_after_the_configured_time():
    store = SessionStore(v3_expiry_s=100)
    _stored(store, "v3", 4, 0, 1000.0)
    _stored(store, "v5-forever", 5, 0, 1000.0)  # MQTT 5 0xFFFFFFFF: never, as the client asked
    assert store.expire(1099.0) == []
    assert store.expire(1100.0) == ["v3"]
    assert store.expire(10.0 ** 9) == []
    assert list(store.sessions) == ["v5-forever"]


def test_v3_expiry_0_means_never_and_the_flag_survives_the_snapshot():
    store = SessionStore()
    _stored(store, "v3", 3, 0, 1000.0)
    assert store.expire(10.0 ** 9) == []
    again = SessionStore.from_json(json.loads(json.dumps(store.to_json())))
    again.configure(50, None, None)
    assert again.expire(1050.0) == ["v3"]


def test_bound_drops_the_longest_disconnected_sessions_first():
    store = SessionStore(max_sessions=3)
    for i in range(5):
        _stored(store, f"c{i}", 4, 1, 1000.0 + i)
    live, _ = store.open("live", False, NEVER_EXPIRES, 900.0, 4)  # connected: never dropped
    assert store.bound() == [("c0", 1), ("c1", 1), ("c2", 1)]
    assert sorted(store.sessions) == ["c3", "c4", "live"]
    store.configure(0, None, 1)
    assert store.bound() == [("c3", 1)]
    assert store.bound() == []


def test_3x_session_expires_over_the_wire(run_edge):
    e = run_edge("edge.persistent_session_expiry_s=1")
    c = RawClient(e.port)
    assert c.connect(4, client_id="exp", clean_start=False) == b"\x20\x02\x00\x00"
    c.publish(4, topic="t", qos=2, packet_id=5)
    assert c.packet() == b"\x50\x02\x00\x05"  # PUBREC; no PUBREL: the id stays
    c.send(b"\xe0\x00")
    c.close()

    def fresh_session() -> bool:
        r = RawClient(e.port)
        ack = r.connect(4, client_id="exp", clean_start=False)
        r.send(b"\xe0\x00")
        r.close()
        assert ack[:2] == b"\x20\x02" and ack[3] == 0, ack
        return ack[2] == 0  # session present 0: expired
    # each probe reconnects (restarting the clock); probes 1.5 s apart see it expire
    wait_for(fresh_session, 15, "the 3.x session to expire", poll=1.5)


def test_snapshot_keeps_at_most_max_stored_qos2_ids(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.max_stored_qos2_ids=5")
    for k in range(3):
        c = RawClient(e.port)
        assert c.connect(4, client_id=f"q{k}", clean_start=False) == b"\x20\x02\x00\x00"
        c.send(b"".join(publish(4, topic="t", qos=2, packet_id=p) for p in (1, 2, 3)))
        assert [c.packet()[0] for _ in range(3)] == [0x50] * 3
        c.send(b"\xe0\x00")
        assert c.closed()
        wait_for(lambda k=k: f"q{k}" in e.server.store.sessions
                 and not e.server.store.sessions[f"q{k}"].connected, 10, "disconnected")
    e.stop()
    doc = json.loads((e.config.edge_state_dir / "sessions.json").read_text())
    kept = {cid: len(s["qos2"]) for cid, s in doc["sessions"].items()}
    assert kept == {"q2": 3}, kept
    assert "2 persistent sessions dropped" in caplog.text
    assert "edge.max_stored_qos2_ids = 5" in caplog.text
