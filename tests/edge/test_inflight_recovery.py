"""Deliveries in flight when the edge dies are re-sent first and never
dropped by the queue bound [MQTT-4.4.0-1] (issue 38, item 2).

The capture log records what a subscriber acknowledged, not what the edge
sent it; recovery (:mod:`bridge.edge.journal`) replays the sends the
in-flight window allowed, so a delivery that may have been sent comes back
in flight (DUP 1, its Packet Identifier), not in the queue where
``edge.max_queued_messages`` drops the oldest first. Sans-IO: a real capture
log written by real sessions (local files, and a Kafka topic), the live side
fanned out by a real router."""

from __future__ import annotations

import pytest

from bridge.edge.delivery import QUEUED, SENT, Outbox, Receiver
from bridge.edge.journal import message_of_record
from bridge.edge.message import Message
from bridge.edge.persist import recover
from bridge.edge.router import Router
from bridge.edge.state import SessionStore
from bridge.mqtt import Properties, PubComp, PubRec, Publish, Subscribe, Subscription, encode
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import log_where, reader_of
from tests.edge.util import Harness, connect, publish, read_log

BOUND = 100


@pytest.fixture
def log(any_log):
    """The capture log the sessions append to, local or Kafka (tests/edge/conftest.py)."""
    return any_log


def _packets(data: bytes, level: int) -> list:
    out = []
    while data:
        p, n = decode_packet(data, level, from_client=False)
        out.append(p)
        data = data[n:]
    return out


class Live:
    """The live edge, played: a persistent subscriber ``me`` and a publisher
    ``pub`` whose captured PUBLISHes the router fans out in capture order
    (as the server does once they are durable)."""

    def __init__(self, log, level: int, qos: int) -> None:
        self.log, self.level, self.qos = log, level, qos
        self.router = Router(max_queued_messages=BOUND)
        store = SessionStore()
        props = Properties(session_expiry_interval=3600) if level == 5 else None
        fields = {"properties": props} if props else {}
        self.sub = Harness(store=store, log=log, conn_id="c1", router=self.router)
        self.sub.feed(connect(level, client_id="me", clean_start=False, **fields))
        self.sub.feed(encode(Subscribe(1, [Subscription("site/#", qos)]), level))
        self.sub.take()
        self.pub = Harness(store=store, log=log, conn_id="c2")
        self.pub.feed(connect(level, client_id="pub"))
        self.n = 0
        self.routed: set[tuple[int, int]] = set()
        #: what the subscriber received: Packet Identifier -> PUBLISH
        self.got: dict[int, Publish] = {}

    def publish(self, count: int) -> None:
        for _ in range(count):
            self.n += 1
            self.pub.feed(publish(self.level, f"site/{self.n}", b"m%d" % self.n, self.qos,
                                  packet_id=self.n % 60000 + 1))
        self.log.flush()
        for r in read_log(log_where(self.log)):
            at = (r.partition, r.offset)
            if r.key == b"pub" and r.value[0] >> 4 == 3 and at not in self.routed:
                self.routed.add(at)
                self.router.route(message_of_record(r), lambda cid: True)
        self.sub.perform(self.sub.session.deliver(self.sub.now))
        self.receive()

    def receive(self) -> None:
        for p in _packets(self.sub.take(), self.level):
            if isinstance(p, Publish):
                self.got[p.packet_id] = p

    def ack(self, packet) -> None:
        self.sub.feed(encode(packet, self.level))
        self.receive()

    @property
    def box(self) -> Outbox:
        return self.sub.session.client.outbox


def _recovered_box(tmp_path, log) -> Outbox:
    log.flush()
    router = Router(max_queued_messages=BOUND)
    store, _wills, _n = recover(tmp_path / "edge", reader_of(log), log.next_offsets(),
                                log.stream, router)
    return store.sessions["me"].outbox


@pytest.mark.parametrize("level,qos", [(4, 1), (5, 2)])
def test_mqtt_4_4_0_1_deliveries_in_flight_at_a_crash_come_back_in_flight_not_dropped(
        tmp_path, log, level, qos):
    live = Live(log, level, qos)
    live.publish(20)                       # fills the in-flight window (20)
    assert sorted(live.got) == list(range(1, 21))
    live.publish(BOUND)                    # queued: exactly the bound, none dropped
    assert live.box.dropped == 0 and len(live.box.queue) == BOUND
    sent = dict(live.box.inflight)
    assert [d.state for d in sent.values()] == [SENT] * 20
    # the edge dies here (SIGKILL): recovery has only the capture log
    box = _recovered_box(tmp_path, log)
    assert box.dropped == 0, "the queue bound dropped deliveries the subscriber may hold"
    assert list(box.inflight) == list(sent)
    assert all(d.state == SENT and d.msg.ref == sent[pid].msg.ref
               for pid, d in box.inflight.items())
    assert [d.pid for d in box.queue] == [d.pid for d in live.box.queue]
    assert not any(d.dup for d in box.queue), "never sent: DUP 0 [MQTT-3.3.1-1]"
    # on reconnection: every one of them again first, DUP 1, the same Packet Identifier
    again = _packets(b"".join(box.resend(Receiver(level, 20), 0.0)), level)
    assert [(p.packet_id, p.payload, p.dup) for p in again] == [
        (pid, live.got[pid].payload, True) for pid in sent]
    after = _packets(b"".join(box.pump(Receiver(level, 40), 0.0)), level)
    assert [(p.packet_id, p.dup) for p in after] == [(pid, False) for pid in range(21, 41)]


def test_mqtt_4_4_0_1_recovery_follows_acknowledgements_and_the_window(tmp_path, log):
    """Acknowledgements free the window (the next queued ones were sent);
    a PUBREC leaves its delivery in flight (PUBREL due); the live bound drops
    the oldest queued ones; recovery ends with the same in-flight set and queue."""
    live = Live(log, 5, 2)
    live.publish(30)
    for pid in range(1, 6):
        live.ack(PubRec(pid))              # PUBREL sent; still in flight
    for pid in range(1, 4):
        live.ack(PubComp(pid))             # three end: three more sent
    assert len(live.box.inflight) == 20 and sorted(live.got) == list(range(1, 24))
    live.publish(BOUND)                    # the live queue bound drops the oldest queued
    assert live.box.dropped == 7           # 24..30: 7 queued + 100 > 100
    box = _recovered_box(tmp_path, log)
    assert [(pid, d.state) for pid, d in box.inflight.items()] == [
        (pid, d.state) for pid, d in live.box.inflight.items()]
    assert [d.pid for d in box.queue] == [d.pid for d in live.box.queue]
    frames = box.resend(Receiver(5, 20), 0.0)
    assert [f[0] for f in frames[:2]] == [0x62, 0x62]  # PUBREL for 4 and 5 [MQTT-4.4.0-1]
    again = _packets(b"".join(frames[2:]), 5)
    assert [(p.packet_id, p.dup) for p in again] == [(pid, True) for pid in range(6, 24)]


def _msg(i: int, qos: int = 1) -> Message:
    frame = publish(4, f"t/{i}", b"m%d" % i, qos, packet_id=1)
    return Message.from_frame(frame, 4, origin="pub", ref=(0, i), ready=True)


def test_mqtt_4_4_0_1_the_queue_bound_never_drops_a_delivery_waiting_for_its_resend():
    """A client reconnects with a smaller Receive Maximum: the unacknowledged
    PUBLISHes beyond it go back to the queue (DUP 1); a burst over the queue
    bound then drops the oldest never-sent deliveries, not those."""
    box = Outbox(max_messages=5)
    for i in range(3):
        box.push(_msg(i), 1, False)
    assert len(box.pump(Receiver(4, 3), 0.0)) == 3
    assert len(box.resend(Receiver(5, 1), 0.0)) == 1       # 1 again; 2 and 3 wait, DUP 1
    assert [(d.pid, d.state, d.dup) for d in box.queue] == [(2, QUEUED, True), (3, QUEUED, True)]
    dropped = sum(box.push(_msg(i), 1, False) for i in range(3, 13))
    assert dropped == box.dropped == 7
    assert [d.pid for d in box.queue] == [2, 3, 11, 12, 13]
    box.puback(1)
    p = _packets(b"".join(box.pump(Receiver(5, 1), 0.0)), 5)
    assert [(x.packet_id, x.dup) for x in p] == [(2, True)]

