"""A session that ends while a retained replay is still queued (issue 38,
item 1): its outbox clears, its connection goes away, a persistent session
taken over with Clean Start gets its CONNACK, and housekeeping survives
whatever one session's clean-up raises."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from bridge.edge.delivery import Outbox, Receiver
from bridge.edge.message import Message
from bridge.edge.retained.store import RetainedStore
from bridge.mqtt import Subscribe, Subscription, encode
from tests.edge.conftest import RawClient
from tests.edge.test_subscribers import Client
from tests.waiting import wait_for

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")


class _Sink:
    """An AMQP delivery's sink as bridge.edge.downlink hands it (what ends when)."""

    peer_pubrel = False

    def __init__(self) -> None:
        self.copies = 0
        self.ended: list[bool] = []

    def end(self, d, ok: bool) -> None:
        self.ended.append(ok)


def _downlinked(topic: str, sink: _Sink) -> Message:
    m = Message(topic, 1, False, b"a", ready=True)
    m.sink = sink
    return m


def _store_with_overlay(tmp_path, n: int) -> RetainedStore:
    s = RetainedStore(tmp_path / "no-table", "mqtt-frames", 0.0, 1 << 20)
    s.swap(s.load())
    for i in range(n):
        s.capture(f"r/{i}", i, (0, i), Message(f"r/{i}", 1, True, b"x", ready=True))
    return s


def test_lg_edge_outbox_clear_with_a_queued_replay_ends_every_delivery(tmp_path):
    s = _store_with_overlay(tmp_path, 50)
    box = Outbox()
    sink = _Sink()
    box.push(_downlinked("dl/1", sink), 1, False)
    box.add_replay(s.replay("r/#", 1, (), time.time()))
    box.push(_downlinked("dl/2", sink), 1, False)
    box.pump(Receiver(5, 3), time.time())  # one in flight, two of the replay handed out
    box.clear()  # raised AttributeError: 'Replay' object has no attribute 'sink'
    assert len(box) == 0 and box.replays == 0 and box.queued_bytes == 0
    assert sink.ended == [False, False]  # both AMQP deliveries given back, once each


def _flood_retained(port: int, n: int) -> None:
    pub = Client(port, 5, "flood-pub")
    for start in range(0, n, 500):  # within the edge's Receive Maximum (1024) [MQTT-3.3.4-7]
        infos = [pub.publish(f"fl/{i}", b"r" * 64, qos=1, retain=True)
                 for i in range(start, min(n, start + 500))]
        for i in infos:
            i.wait_for_publish(60)
    pub.close()


def _slow_hash_subscriber(port: int, cid: str, clean: bool, level: int = 5) -> RawClient:
    c = RawClient(port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    props = {} if level != 5 or clean else {"properties": _expiry(600)}
    assert c.connect(level, client_id=cid, clean_start=clean, **props)[0] == 0x20
    c.send(encode(Subscribe(1, [Subscription("#", 1)]), level))
    return c


def _expiry(s: int):
    from bridge.mqtt import Properties

    return Properties(session_expiry_interval=s)


@pytest.mark.subprocess
def test_lg_edge_a_clean_session_with_a_queued_replay_is_removed_when_it_disconnects(
        run_edge, caplog):
    edge = run_edge("edge.max_inflight_messages=2")
    _flood_retained(edge.port, 3000)
    slow = _slow_hash_subscriber(edge.port, "slow-clean", clean=True)
    srv = edge.server
    box = wait_for(lambda: getattr(srv.router.sessions.get("slow-clean"), "outbox", None), 10,
                   "the slow subscriber's outbox")
    wait_for(lambda: box.replays == 1, 10, "the replay queued")
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        slow.close()
        wait_for(lambda: any("close " in r.getMessage() and "client=slow-clean" in r.getMessage()
                             for r in caplog.records), 10, "the connection's close line")
    assert not any(c.session.client_id == "slow-clean" for c in srv.conns)
    assert "slow-clean" not in srv.router.sessions and box.replays == 0
    assert not any(r.levelno >= logging.ERROR for r in caplog.records), \
        [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.subprocess
def test_lg_edge_a_persistent_session_with_a_queued_replay_taken_over_by_clean_start(run_edge):
    edge = run_edge("edge.max_inflight_messages=2")
    _flood_retained(edge.port, 3000)
    slow = _slow_hash_subscriber(edge.port, "slow-kept", clean=False)
    srv = edge.server
    box = wait_for(lambda: getattr(srv.router.sessions.get("slow-kept"), "outbox", None), 10,
                   "the slow subscriber's outbox")
    wait_for(lambda: box.replays == 1, 10, "the replay queued")
    slow.close()
    wait_for(lambda: not any(c.session.client_id == "slow-kept" for c in srv.conns), 10,
             "the first connection removed")
    again = RawClient(edge.port)
    connack = again.connect(5, client_id="slow-kept", clean_start=True)
    # before the fix no CONNACK came: the take-over's clean-up raised
    assert connack[0] == 0x20 and connack[2] == 0 and connack[3] == 0
    again.close()


@pytest.mark.subprocess
def test_lg_edge_housekeeping_survives_a_session_whose_expiry_raises(run_edge, caplog,
                                                                      monkeypatch):
    import bridge.edge.housekeeping as hk
    import bridge.edge.persist as persist

    monkeypatch.setattr(hk, "SNAPSHOT_INTERVAL_S", 0.2)
    monkeypatch.setattr(persist, "SNAPSHOT_INTERVAL_S", 0.2)
    edge = run_edge("edge.max_inflight_messages=2")
    srv = edge.server
    for cid in ("bad", "good"):
        c = RawClient(edge.port)
        assert c.connect(5, client_id=cid, clean_start=False,
                         properties=_expiry(1))[3] == 0
        c.send(encode(Subscribe(1, [Subscription(f"{cid}/#", 1)]), 5))
        assert c.packet()[0] == 0x90
        c.close()
    wait_for(lambda: len(srv.conns) == 0, 10, "both connections closed")
    boom = srv.router.sessions["bad"]

    class Broken(Outbox):  # a session whose clean-up raises, whatever the cause
        def clear(self):
            raise RuntimeError("clean-up of session 'bad' failed")

    boom.outbox = Broken()
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        wait_for(lambda: "good" not in srv.router.sessions and "bad" not in srv.store.sessions,
                 15, "both sessions expired")
        # housekeeping goes on: another session expires later
        c = RawClient(edge.port)
        assert c.connect(5, client_id="later", clean_start=False, properties=_expiry(1))[3] == 0
        c.close()
        wait_for(lambda: "later" not in srv.store.sessions, 15, "the later session expired")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "client=bad" in errors[0], errors
