"""Subscriber state across edge restarts: subscriptions and outboxes of
persistent sessions, from the session snapshot plus the capture log.

The capture log is the journal of this state, as it is of the QoS 2 state
(:mod:`bridge.edge.persist`): every SUBSCRIBE is captured with the codes its
SUBACK granted (``granted``), every UNSUBSCRIBE, every accepted PUBLISH and
Will (the messages), and every PUBACK / PUBREC / PUBCOMP of a subscriber with
``ack_ref``, the capture coordinates of the message it acknowledges (a run
of 4-byte PUBACKs received together is one record, with ``ack_refs``: one
coordinate per frame). The
snapshot stores, per persistent session, its subscriptions and its outbox as
**positions in the capture log** (partition, offset of each message), never
copies of messages. On start:

1. :func:`restore` rebuilds the subscriptions and the outboxes of the
   snapshot, reading each referenced message back from the log;
2. :class:`Replayer` applies the records after the snapshot, in capture
   order: subscriptions change, messages are routed to the sessions as they
   were live (Packet Identifiers are numbered per session in push order, so
   each delivery gets back the number it had, see
   :mod:`bridge.edge.delivery`), acknowledgements end or advance the
   deliveries they name. While a session is connected in the log, the
   replay also makes the sends its in-flight window allowed
   (:meth:`Outbox.assume_sent <bridge.edge.delivery.Outbox.assume_sent>`;
   the log journals acknowledgements, not sends): a delivery that may have
   been sent before the edge died is back **in flight**, so it goes out
   again first, with DUP 1 and its Packet Identifier (MQTT 5.0 section 4.4:
   "re-send any unacknowledged PUBLISH packets ... with the DUP flag set to
   1" [MQTT-4.4.0-1]), and the queue bound (``edge.max_queued_messages``),
   which drops the oldest *queued* deliveries, never drops it. Each send is
   taken as early as the window (the client's Receive Maximum, at most
   ``edge.max_inflight_messages``, passed to :func:`bridge.edge.persist.recover`)
   allowed, so the set is never smaller than what the live edge had in
   flight (a connection lost without DISCONNECT counts as connected until
   the client's next CONNECT: more DUP 1 at worst, never a delivery lost);
   what stays queued was never sent and goes out with DUP 0;
3. :meth:`Replayer.finish`: QoS 0 deliveries are dropped (they are not kept
   for disconnected sessions).

**Retention** must not delete a record an unexpired session still needs:
:func:`hold_floor` gives, per partition, the lowest offset the snapshot's
sessions refer to, and the server records it as a hold on the capture log
(``bridge.capture.commits.hold_offsets``) with each snapshot.

Limits (stated in the README): a Shared Subscription's choice of member
and the ACL at delivery are not journaled; the replay makes them again, so
after a crash a shared message may go to another member of its group, and
a Packet Identifier of the member may then differ from the one it had.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bridge.edge.delivery import RELEASED, SENT, Delivery, Receiver
from bridge.edge.handshake import Limits
from bridge.edge.message import Message
from bridge.edge.router import Router
from bridge.edge.subscription import Sub
from bridge.mqtt import Connect, Subscribe, Unsubscribe
from bridge.mqtt.codec import decode_packet

if TYPE_CHECKING:
    from bridge.edge.state import ClientSession, SessionStore

__all__ = ["Replayer", "hold_floor", "record_headers", "restore", "session_doc"]

log = logging.getLogger(__name__)


def _sub_row(s: Sub) -> list:
    return [s.topic_filter, s.qos, int(s.no_local), int(s.retain_as_published),
            s.retain_handling, s.sub_id]


def session_doc(router: Router, client: ClientSession) -> dict:
    """What the snapshot adds to a persistent session's entry: its
    subscriptions and its outbox (as capture positions)."""
    doc: dict = {"subs": [_sub_row(s) for s in router.tree.subscriptions(client.client_id)]}
    box = client.outbox
    if box is not None and len(box):
        rows = []
        for d in list(box.inflight.values()) + list(box.queue):
            ref = d.msg.ref
            if ref is None or (d.qos == 0):
                continue
            rows.append([ref[0], ref[1], d.qos, int(d.retain), list(d.sub_ids), d.pid, d.state,
                         int(d.dup)])
        doc["outbox"] = {"k": box.next_k, "d": rows}
    return doc


def hold_floor(docs: dict, offsets: list[int]) -> list[int]:
    """Per partition, the lowest offset the snapshot ``docs`` (sessions)
    refer to, at most the snapshot's ``offsets``."""
    floor = list(offsets)
    for doc in docs.values():
        for row in doc.get("outbox", {}).get("d", ()):
            p, o = row[0], row[1]
            if p < len(floor) and o < floor[p]:
                floor[p] = o
    return floor


#: Referenced records at most this many offsets apart are read in one range
#: (the records between them are read and skipped): a read of one record is
#: a round trip to Kafka (about 0.1 s), a range of thousands about the same.
RUN_GAP = 4096


def _read_runs(reader, cache: dict, docs: dict, clock_offset: float) -> None:
    """Fill ``cache`` with the messages the snapshot's outboxes refer to,
    reading each partition's referenced offsets in runs (offsets at most
    :data:`RUN_GAP` apart) instead of one record at a time. A run that
    cannot be read is left to :func:`_message_at` record by record (which
    says which ones are lost)."""
    want: dict[int, set[int]] = {}
    for doc in docs.values():
        for row in (doc.get("outbox") or {}).get("d", ()):
            want.setdefault(int(row[0]), set()).add(int(row[1]))
    for p, offsets in want.items():
        ordered = sorted(offsets)
        lo = prev = ordered[0]
        for o in [*ordered[1:], None]:
            if o is not None and o - prev <= RUN_GAP:
                prev = o
                continue
            if prev > lo:  # one record: _message_at reads it
                try:
                    for r in reader.records(p, lo, prev + 1):
                        if r.offset in offsets:
                            cache[(p, r.offset)] = message_of_record(r, clock_offset)
                except Exception:  # noqa: BLE001 - read record by record below, each loss logged
                    pass
            lo = prev = o


def _message_at(reader, cache: dict, p: int, o: int, clock_offset: float) -> Message | None:
    key = (p, o)
    if key in cache:
        return cache[key]
    msg = None
    try:
        for r in reader.records(p, o, o + 1):
            msg = message_of_record(r, clock_offset)
    except Exception as exc:  # deleted by retention, or unreadable: the delivery is lost
        log.warning("edge session recovery: message at partition %d offset %d cannot be read "
                    "(%s); its deliveries are dropped", p, o, exc)
    cache[key] = msg
    return msg


def record_headers(record) -> dict[str, bytes]:
    """A capture record's headers as a dict (the first value of a key wins)."""
    out: dict[str, bytes] = {}
    for k, v in record.stored_headers:
        out.setdefault(k, v)
    return out


def message_of_record(r, clock_offset: float = 0.0, h: dict | None = None) -> Message | None:
    """The :class:`Message` of a captured PUBLISH record (None: not an
    accepted PUBLISH). ``clock_offset``: wall clock minus the server's clock,
    so that the arrival time is in the server's clock."""
    v = r.value
    if not v or v[0] >> 4 != 3:
        return None
    h = record_headers(r) if h is None else h
    if "reject" in h:
        return None
    level = int(h.get("proto", b"4"))
    alias = h.get("alias_topic")
    return Message.from_frame(v, level, topic=alias.decode() if alias else None,
                              origin=r.key.decode("utf-8", "replace"),
                              received=r.timestamp_us / 1e6 - clock_offset,
                              ref=(r.partition, r.offset), ready=True)


def restore(store: SessionStore, router: Router, docs: dict, reader,
            clock_offset: float = 0.0) -> int:
    """Rebuild subscriptions and outboxes of the snapshot's sessions
    (``docs``: the snapshot's raw session entries); returns the number of
    deliveries restored."""
    cache: dict = {}
    _read_runs(reader, cache, {cid: d for cid, d in docs.items() if cid in store.sessions}, clock_offset)
    n = 0
    for cid, doc in docs.items():
        s = store.sessions.get(cid)
        if s is None:
            continue
        for tf, qos, nl, rap, rh, sid in doc.get("subs", ()):
            router.subscribe(s, Sub(cid, tf, qos, bool(nl), bool(rap), rh, sid))
        ob = doc.get("outbox")
        if not ob:
            continue
        box = router.outbox(s)
        box.next_k = int(ob["k"])
        for p, o, qos, retain, ids, pid, state, dup in ob["d"]:
            msg = _message_at(reader, cache, p, o, clock_offset)
            if msg is None:
                continue
            d = Delivery(msg, qos, bool(retain), tuple(ids), pid, state)
            if state in (SENT, RELEASED):
                box.inflight[pid] = d
            else:
                d.dup = bool(dup)
                box.queue.append(d)
                box.queued_bytes += msg.size
            n += 1
    return n


class Replayer:
    """Applies the subscriber side of capture records after the snapshot
    (see the module docstring). ``live``: Client Identifier -> session for
    the sessions connected at that point of the log (kept by the caller)."""

    def __init__(self, router: Router, live: dict, clock_offset: float = 0.0,
                 max_inflight: int | None = None, journaled: bool = False) -> None:
        self.router = router
        self.live = live
        self.clock_offset = clock_offset
        #: a cluster's log: sends are journaled (``edge`` = ``sent`` records,
        #: bridge.edge.applier), so none is assumed; an acknowledgement ends
        #: the delivery of its message whatever its queued Packet Identifier
        self.journaled = journaled
        #: journaled: called (cid, ref, Packet Identifier of a PUBREC < 0x80 or None) for an
        #: acknowledgement of a message not routed yet
        self.on_unmatched_ack = None
        #: journaled: called with the Client Identifiers a replayed message was routed to
        self.on_routed = None
        #: ``edge.max_inflight_messages`` (the window of 3.x clients, the
        #: upper bound of the Receive Maximum of MQTT 5 ones)
        self.max_inflight = Limits.max_inflight_messages if max_inflight is None else max_inflight
        #: Client Identifier -> the receiver its last CONNECT in the log made
        #: (none for a session connected since before the snapshot: then the
        #: widest window, ``max_inflight``)
        self.rx: dict[str, Receiver] = {}
        for s in live.values():  # sent after the snapshot, before the crash?
            self._sends(s, None)

    def connect(self, client: ClientSession, present: bool, p: Connect | None = None,
                now: float | None = None) -> None:
        if not present:
            self.router.drop(client.client_id)
        self.router.attach(client)
        if p is not None:
            window, maxp = self.max_inflight, None
            if p.protocol_level == 5:
                rm = p.properties.receive_maximum
                if rm is not None and rm < window:
                    window = rm
                maxp = p.properties.maximum_packet_size
            self.rx[client.client_id] = Receiver(p.protocol_level, window, maxp)
        self._sends(client, now)

    def _sends(self, s: ClientSession, now: float | None) -> None:
        """What the connected session ``s`` may have been sent by now (see
        the module docstring)."""
        box = s.outbox
        if box is not None and box.queue and not self.journaled:
            rx = self.rx.get(s.client_id)
            if rx is None:
                rx = Receiver(4 if s.v3 else 5, self.max_inflight)
            box.assume_sent(rx, now)

    def record(self, r, ptype: int, h: dict, cid: str) -> None:
        """One capture record (not rejected) from client ``cid``."""
        if ptype == 3:
            if h.get("dup") == b"1" or not self.router.tree:
                return
            msg = message_of_record(r, self.clock_offset, h)
            if msg is not None:
                live = self.live
                got = self.router.route(msg, lambda c: c in live)
                for s in got:
                    if s.client_id in live:
                        self._sends(s, msg.received)
                if self.on_routed is not None and got:
                    self.on_routed([s.client_id for s in got])
            return
        s = self.live.get(cid)
        if s is None:
            return
        level = int(h.get("proto", b"4"))
        if ptype == 8:
            p, _ = decode_packet(r.value, level)
            codes = bytes.fromhex(h.get("granted", b"").decode() or "")
            k = h.get("retained_k")
            if k is not None:  # numbers the retained replays took (bridge.edge.retained.replay)
                self.router.outbox(s).next_k += int(k)
            if isinstance(p, Subscribe):
                sid = (p.properties.subscription_identifiers or [None])[0]
                for sub, code in zip(p.subscriptions, codes):
                    if code < 0x80:
                        self.router.subscribe(s, Sub(cid, sub.topic_filter, code, sub.no_local,
                                                     sub.retain_as_published,
                                                     sub.retain_handling, sid))
        elif ptype == 10:
            p, _ = decode_packet(r.value, level)
            if isinstance(p, Unsubscribe):
                for tf in p.topic_filters:
                    self.router.unsubscribe(cid, tf)
        elif ptype in (4, 5, 7):
            box = s.outbox
            if box is None:
                return
            refs = h.get("ack_refs")
            if refs is not None:  # a run of 4-byte PUBACKs in one record
                v = r.value
                for i, ref in enumerate(refs.split(b" ")):
                    if ref != b"-":
                        p_, o_ = (int(x) for x in ref.split(b":"))
                        self._acked(cid, box, 4, v[4 * i:4 * i + 4], (p_, o_))
            else:
                ref = h.get("ack_ref")
                if ref is None:
                    return
                p_, o_ = (int(x) for x in ref.decode().split(":"))
                self._acked(cid, box, ptype, r.value, (p_, o_))
            self._sends(s, r.timestamp_us / 1e6 - self.clock_offset)  # the window has room

    def _acked(self, cid: str, box, ptype: int, v: bytes, ref: tuple[int, int]) -> None:
        if self._ack(box, ptype, v, ref, self.journaled) or self.on_unmatched_ack is None:
            return
        rc = v[4] if len(v) >= 5 else 0
        # a PUBREC < 0x80 leaves the delivery released (PUBREL due), with its identifier
        self.on_unmatched_ack(cid, ref, (v[2] << 8) | v[3] if ptype == 5 and rc < 0x80 else None)

    @staticmethod
    def _ack(box, ptype: int, v: bytes, ref: tuple[int, int], by_ref: bool = False) -> bool:
        """End or advance the delivery of ``ref`` (True: found). ``by_ref``:
        a queued delivery matches by its message alone (a cluster: its
        queued Packet Identifier is this edge's, the acknowledging edge's
        may differ)."""
        pid = (v[2] << 8) | v[3] if len(v) >= 4 else None
        rc = v[4] if len(v) >= 5 else 0
        d = box.inflight.get(pid)
        if d is not None and d.msg.ref == ref:
            if ptype == 5 and rc < 0x80:
                d.state = RELEASED
            else:
                del box.inflight[pid]
            return True
        for d in box.queue:
            if d.msg.ref == ref and (by_ref or d.pid == pid):
                box.queue.remove(d)
                box.queued_bytes -= d.msg.size
                if ptype == 5 and rc < 0x80:
                    d.pid = pid
                    d.state = RELEASED
                    box.inflight[pid] = d
                return True
        return False

    def finish(self) -> None:
        """End of the log: drop QoS 0 deliveries. (The QoS 1/2 ones that may
        have been sent are in flight already, DUP 1; see :meth:`_sends`.)
        What the queue bound dropped during the replay is logged now, one
        line per client (the edge that died may not have logged it: its
        drop lines come every few seconds)."""
        router = self.router
        for cid, n in router.dropped.items():
            log.warning("edge session recovery: client=%s: %d queued messages dropped, the "
                        "oldest first (over edge.max_queued_messages = %d or "
                        "edge.max_queued_bytes = %d); none that may have been sent", cid, n,
                        router.max_queued_messages, router.max_queued_bytes)
        router.dropped.clear()
        for cid, s in router.sessions.items():
            box = s.outbox
            if box is None:
                continue
            keep = [d for d in box.queue if d.qos]
            if len(keep) != len(box.queue):
                box.queue.clear()
                box.queue.extend(keep)
                box.queued_bytes = sum(d.msg.size for d in keep)
