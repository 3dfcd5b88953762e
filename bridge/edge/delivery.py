"""Per-session delivery: the outbound state machine and queue. Sans-IO.

Each :class:`~bridge.edge.state.ClientSession` has one :class:`Outbox`. The
router (:mod:`bridge.edge.router`) pushes deliveries into it; the
connection's session (:mod:`bridge.edge.subscribing`) asks it for the frames
it may send now (:meth:`Outbox.pump`), feeds it the subscriber's PUBACK,
PUBREC and PUBCOMP, and on a reconnection asks for the re-sends
(:meth:`Outbox.resend`). No sockets, no clock: times are passed in.

* **Order.** Deliveries leave in the order they were pushed, which is the
  order their messages were appended to the capture log; a message whose
  record is not durable yet (``Message.ready`` false) holds back everything
  behind it (no subscriber sees a message a crash could lose, and order
  per topic holds across QoS levels [MQTT-4.6.0-6]).
* **Packet Identifiers** are numbered per session as QoS 1/2 deliveries are
  pushed: the k-th gets ``k mod 65535 + 1``. The numbering depends only on
  what was pushed, so replaying the capture log after a crash gives every
  unacknowledged delivery the Packet Identifier it had (see
  :mod:`bridge.edge.persist`). Should a number come round while its earlier
  holder is still unacknowledged (65,535 deliveries overtaking one), sending
  waits for it.
* **In-flight window.** At most ``receive_maximum`` QoS 1/2 PUBLISH packets
  unacknowledged (PUBACK, or PUBCOMP for QoS 2) [MQTT-3.3.4-9]; the client's
  Receive Maximum in MQTT 5, ``edge.max_inflight_messages`` in 3.x.
* **Queue bound.** Deliveries not yet sent are bounded by ``max_messages``
  and ``max_bytes`` (payload bytes); beyond either, the oldest queued ones
  are dropped and counted (MQTT 5.0 section 4.1: a server may limit the
  Session State it stores; :attr:`Outbox.dropped`).
* **Expiry.** A delivery whose Message Expiry Interval has passed before it
  is sent is dropped [MQTT-3.3.2-5] (counted in :attr:`Outbox.expired`).
* **Maximum Packet Size.** A PUBLISH larger than the client's Maximum Packet
  Size is not sent; it is dropped as if its delivery completed
  [MQTT-3.1.2-25] (counted in :attr:`Outbox.too_large`).
* **Acknowledgements.** PUBACK ends a QoS 1 delivery; PUBREC (< 0x80) turns
  a QoS 2 one into PUBREL sent, PUBCOMP ends it; PUBREC >= 0x80 ends it
  [MQTT-4.3.3-4]. An acknowledgement of the wrong kind for the delivery
  with that Packet Identifier is a Protocol Error [LG-edge-ack-mismatch];
  one for an identifier with no delivery is answered as before (the session
  decides).
* **Messages from the AMQP network** (``Message.sink`` set, see
  :mod:`bridge.edge.downlink`) are not in the capture log, so they must not
  shift the numbering above: each takes a free Packet Identifier far ahead
  of it (``packet_id(next_k + 32767 + j)``, skipping those in use), and the
  sink is told when each QoS 1/2 delivery of it ends (acknowledged, or
  dropped by the queue bound, expiry, size or the session's end). With the
  seed's QoS 2 flow (``sink.peer_pubrel``) a PUBREC leaves the delivery
  RECEIVED: the PUBREL goes only when the AMQP side sends AMQP_PUBREL.
* **Re-sends** on reconnection: every unacknowledged PUBLISH again with DUP
  1, and PUBREL for the released ones, in their original order
  [MQTT-4.4.0-1]; DUP is set only there [MQTT-3.3.1-1, MQTT-3.3.1-3].

One piece: :class:`Outbox` is one state -- the queue, ``inflight`` and the
numbering ``next_k`` -- that every method reads and changes under the rules
above: ``push`` numbers deliveries from ``next_k`` and ``_free_pid`` keeps
the AMQP messages' identifiers clear of it and of ``inflight``; ``pump``
and ``assume_sent`` move deliveries from the queue into ``inflight``;
``resend`` puts some back at the front with DUP 1, which ``_bound`` must
then never drop; the acknowledgements take them out. Split, the class's
invariants would be spread over modules; the message it carries is
:mod:`bridge.edge.message`'s.
"""

from __future__ import annotations

import collections
import struct
from typing import NamedTuple

from bridge.edge.message import Message

__all__ = ["Barrier", "Delivery", "Outbox", "Receiver", "QUEUED", "SENT", "RELEASED", "RECEIVED",
           "AckMismatch", "packet_id"]

#: RECEIVED: a QoS 2 delivery from the AMQP network, PUBREC received, its
#: PUBREL not due until the AMQP side sends AMQP_PUBREL (the seed's flow)
QUEUED, SENT, RELEASED, RECEIVED = 0, 1, 2, 3
_PUBREL = struct.Struct(">BBH")
#: retained messages a pump hands out at most (then it asks to be called
#: again, ``Outbox.more``); also what one take gets at QoS 0 (no window)
_REPLAY_BUDGET = 256
#: frames a pump hands out at most (QoS 0 has no window to bound it): then
#: ``Outbox.more``, and the server pumps again in the next turn of its event
#: loop [LG-edge-turn-budget]
_PUMP_FRAMES = 256
_U16 = struct.Struct(">H")


class AckMismatch(Exception):
    """An acknowledgement of the wrong kind for its delivery (Protocol Error)."""


class Receiver(NamedTuple):
    """What the subscriber's connection accepts: protocol ``level``, the
    in-flight window and its Maximum Packet Size (None: no limit)."""

    level: int
    receive_maximum: int
    max_packet: int | None = None


def packet_id(k: int) -> int:
    """The Packet Identifier of a session's k-th QoS 1/2 delivery (see the
    module docstring: it depends only on k)."""
    return k % 65535 + 1


class Barrier:
    """Something in an outbox's queue that is not a message but hands out
    deliveries when :meth:`Outbox.pump` reaches it (a retained replay,
    ``bridge.edge.retained.replay.Replay``); live deliveries queue behind it.
    ``qos_cap``: the highest QoS of what it hands out (0: no window bounds it)."""

    ready = False
    size = 0
    ref = None
    expiry = None
    #: not a message from the AMQP network (what ``Outbox.clear`` asks every queued item)
    sink = None
    qos_cap = 0

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def take(self, n: int) -> list[Delivery]:
        raise NotImplementedError


class Delivery:
    """One message for one session: the QoS it goes out at, RETAIN, the
    matching subscriptions' identifiers, the Packet Identifier (QoS 1/2)
    and where it stands (QUEUED, SENT, RELEASED)."""

    __slots__ = ("msg", "qos", "retain", "sub_ids", "pid", "state", "dup")

    def __init__(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...],
                 pid: int | None, state: int = QUEUED) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.pid = pid
        self.state = state
        #: may have been sent before an edge restart: goes out with DUP 1
        self.dup = False

    def __repr__(self) -> str:
        return (f"Delivery({self.msg!r}, qos={self.qos}, pid={self.pid}, "
                f"state={('queued', 'sent', 'released', 'received')[self.state]})")


class Outbox:
    """The deliveries of one session (see the module docstring)."""

    def __init__(self, max_messages: int = 1000, max_bytes: int = 1 << 26) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.queue: collections.deque[Delivery] = collections.deque()
        #: Packet Identifier -> SENT or RELEASED delivery, in the order sent
        self.inflight: dict[int, Delivery] = {}
        #: QoS 1/2 deliveries pushed so far (the next one gets k mod 65535 + 1)
        self.next_k = 0
        self.queued_bytes = 0
        self.dropped = 0
        self.expired = 0
        self.too_large = 0
        self.sent = 0
        #: retained replays in the queue (bridge.edge.retained.replay)
        self.replays = 0
        #: the last pump stopped at its replay budget: pump again soon
        self.more = False
        #: Packet Identifiers held by deliveries of AMQP messages (see above)
        self.dl_pids: set[int] = set()
        self._dl_j = 0

    def __len__(self) -> int:
        return len(self.queue) + len(self.inflight)

    # ------------------------------------------------------------ in
    def push(self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...] = ()) -> int:
        """Queue a delivery; returns how many queued deliveries were dropped
        (oldest first) to keep the bound."""
        pid = None
        if qos:
            if msg.sink is None:
                pid = packet_id(self.next_k)
                self.next_k += 1
            else:
                pid = self._free_pid()
                msg.sink.copies += 1
        q = self.queue
        if len(q) >= self.max_messages and not self.replays:
            d = q[0]
            if type(d) is Delivery and not d.dup and d.msg.sink is None:
                # At the bound, the oldest queued delivery is dropped (as
                # _bound would) and its object carries the new one: a session
                # that does not read costs no object made and freed per
                # message. (Made and freed, each new one would stay in the
                # cyclic collector's young generation, whose count does not
                # grow when an old one is freed for it: 200 such sessions
                # filled it with 200,000 live deliveries, a collection of
                # tens of ms of the event loop each.)
                q.popleft()
                self.queued_bytes += msg.size - d.msg.size
                d.msg = msg
                d.qos = qos
                d.retain = retain
                d.sub_ids = sub_ids
                d.pid = pid
                d.state = QUEUED
                q.append(d)
                self.dropped += 1
                if self.queued_bytes > self.max_bytes:
                    return 1 + self._bound()
                return 1
        q.append(Delivery(msg, qos, retain, sub_ids, pid))
        self.queued_bytes += msg.size
        if len(q) > self.max_messages or self.queued_bytes > self.max_bytes:
            return self._bound()
        return 0

    def _free_pid(self) -> int:
        """A Packet Identifier for a delivery of an AMQP message: far ahead of
        the captured numbering, not held by another such delivery nor in flight."""
        held = self.dl_pids
        for _ in range(65536):
            pid = packet_id(self.next_k + 32767 + self._dl_j)
            self._dl_j = (self._dl_j + 1) % 32768
            if pid not in held and pid not in self.inflight:
                held.add(pid)
                return pid
        raise RuntimeError("no free Packet Identifier")  # 32,768 AMQP deliveries held at once

    def _end(self, d: Delivery, ok: bool) -> None:
        """A delivery of an AMQP message ended (``ok``: acknowledged, or
        ended as the standard says a delivery may: expired, too large)."""
        sink = d.msg.sink
        if sink is not None and d.qos:
            if d.state != RECEIVED:
                self.dl_pids.discard(d.pid)
            sink.end(d, ok)

    def _bound(self) -> int:
        q = self.queue
        n = 0
        # A delivery that may have been sent already (DUP 1: it waits for its
        # re-send, Outbox.resend) is never dropped: the subscriber may hold
        # it unacknowledged, and it must be re-sent [MQTT-4.4.0-1]. So the
        # queue may exceed the bound by at most the in-flight window.
        if self.replays:
            # a retained replay and what it handed out are never dropped (the
            # replay would be cut short): the oldest live deliveries go. What
            # is kept comes off the front and goes back (the replay and what
            # it handed out wait there, a few): a push stays O(1), not a copy
            # of the whole queue per push
            over = len(q) - self.max_messages
            head = []
            while q and (over > 0 or self.queued_bytes > self.max_bytes):
                d = q.popleft()
                if type(d) is Delivery and not isinstance(d.msg, Barrier) and not d.dup:
                    self.queued_bytes -= d.msg.size
                    if d.msg.sink is not None:
                        self._end(d, False)
                    n += 1
                    over -= 1
                else:
                    head.append(d)
            if head:
                q.extendleft(reversed(head))
        else:
            resend = []  # the re-sends waiting at the front (Outbox.resend put them back)
            while q and (len(q) + len(resend) > self.max_messages
                         or self.queued_bytes > self.max_bytes):
                d = q.popleft()
                if d.dup:
                    resend.append(d)
                    continue
                self.queued_bytes -= d.msg.size
                if d.msg.sink is not None:
                    self._end(d, False)
                n += 1
            if resend:
                q.extendleft(reversed(resend))
        self.dropped += n
        return n

    def add_replay(self, replay) -> None:
        """Queue a retained replay (``bridge.edge.retained.replay.Replay``)
        behind what is queued: it reserves the Packet Identifiers of its
        QoS 1/2 deliveries now, and hands them out as :meth:`pump` gets to
        it. Live deliveries pushed later queue behind it."""
        replay.k = self.next_k
        self.next_k += replay.count
        self.queue.append(Delivery(replay, 0, True, (), None))
        self.replays += 1

    # ------------------------------------------------------------ out
    def pump(self, rx: Receiver, now: float, journal: list | None = None) -> list[bytes]:
        """The frames that may be sent now, in order. ``journal``: gets
        (message ref, Packet Identifier) of each QoS 1/2 delivery sent for
        the first time (a cluster edge journals them, bridge.edge.applier)."""
        q = self.queue
        if not q:
            return []
        out: list[bytes] = []
        inflight = self.inflight
        level = rx.level
        v5 = level == 5
        maxp = rx.max_packet
        room = rx.receive_maximum - len(inflight)
        pack = _U16.pack
        freed = 0
        budget = _REPLAY_BUDGET
        self.more = False
        while q:
            d = q[0]
            msg = d.msg
            if not msg.ready:
                if not self.replays or not isinstance(msg, Barrier):
                    break
                # a retained replay: its next deliveries go before it
                if msg.qos_cap and room <= 0:
                    break
                if budget <= 0:
                    self.more = True
                    break
                q.popleft()
                more = msg.take(min(max(room, 1), budget) if msg.qos_cap else budget)
                budget -= len(more) or 1
                if msg.done:
                    self.replays -= 1
                else:
                    q.appendleft(d)
                q.extendleft(reversed(more))
                self.queued_bytes += sum([x.msg.size for x in more])
                if not more and not msg.done:  # still matching (a scan): the next pump goes on
                    self.more = True
                    break
                continue
            qos = d.qos
            if qos and (room <= 0 or d.pid in inflight):
                break
            if len(out) >= _PUMP_FRAMES:
                self.more = True
                break
            q.popleft()
            freed += msg.size
            if msg.expiry is None and not d.sub_ids:
                # the common case: the bytes every subscriber gets, but the
                # Packet Identifier
                head, tail = msg.parts(v5, 0x30 | (8 if d.dup and qos else 0) | (qos << 1)
                                       | (1 if d.retain else 0))
                frame = head + pack(d.pid) + tail if qos else head + tail
            else:
                if msg.expiry is not None and msg.remaining(now) <= 0:
                    self.expired += 1  # [MQTT-3.3.2-5]
                    if msg.sink is not None:
                        self._end(d, True)
                    continue
                frame = msg.frame(level, qos, d.pid, dup=d.dup and qos > 0, retain=d.retain,
                                  sub_ids=d.sub_ids, now=now)
            if maxp is not None and len(frame) > maxp:
                self.too_large += 1  # [MQTT-3.1.2-25]
                if msg.sink is not None:
                    self._end(d, True)
                continue
            out.append(frame)
            if qos:
                d.state = SENT
                inflight[d.pid] = d
                room -= 1
                if journal is not None and msg.ref is not None:
                    journal.append((msg.ref, d.pid))
        self.queued_bytes -= freed
        self.sent += len(out)
        return out

    def resend(self, rx: Receiver, now: float) -> list[bytes]:
        """Every unacknowledged delivery again, in order: PUBLISH with DUP 1,
        or PUBREL for the released ones [MQTT-4.4.0-1], within the new
        connection's window: the send quota starts afresh with each
        connection (MQTT 5.0 section 4.9), so PUBLISHes beyond it go back to
        the front of the queue and leave, still with DUP 1 and their Packet
        Identifiers, as acknowledgements free the window [MQTT-3.3.4-9]. A
        PUBLISH now larger than the connection's Maximum Packet Size (the
        client reconnected with a smaller one) is not sent; its delivery
        ends as if completed [MQTT-3.1.2-25]."""
        out = []
        maxp = rx.max_packet
        keep: dict[int, Delivery] = {}
        back: list[Delivery] = []
        for pid, d in self.inflight.items():
            if d.state == RELEASED:
                out.append(_PUBREL.pack(0x62, 2, pid))
                keep[pid] = d
            elif d.state == RECEIVED:
                keep[pid] = d  # its PUBREL waits for the AMQP side's AMQP_PUBREL
            elif maxp is not None and d.msg.frame_size(rx.level, d.qos, d.sub_ids) > maxp:
                self.too_large += 1
                if d.msg.sink is not None:
                    self._end(d, True)
            elif len(keep) >= rx.receive_maximum:
                d.state = QUEUED
                d.dup = True
                back.append(d)
            else:
                out.append(d.msg.frame(rx.level, d.qos, pid, dup=True, retain=d.retain,
                                       sub_ids=d.sub_ids, now=now))
                keep[pid] = d
        self.inflight = keep
        if back:
            self.queue.extendleft(reversed(back))
            self.queued_bytes += sum(d.msg.size for d in back)
        return out

    def assume_sent(self, rx: Receiver, now: float | None = None) -> None:
        """Recovery after a crash (:class:`bridge.edge.journal.Replayer`):
        the capture log journals acknowledgements, not sends, so what a
        connected session's :meth:`pump` would have sent at this point of
        the log (within ``rx``'s window, in order) is taken as sent: it goes
        in flight, SENT, DUP 1. :meth:`resend` then sends it first with its
        Packet Identifier, and :meth:`_bound` cannot drop it [MQTT-4.4.0-1].
        Taken as early as the window allowed, the set is never smaller than
        what the live edge had in flight. Expired (``now``, the server's
        clock; None: not known) and too large deliveries end as in
        :meth:`pump`; QoS 0 ones went out (or were lost with the connection)."""
        q = self.queue
        inflight = self.inflight
        maxp = rx.max_packet
        while q:
            d = q[0]
            msg = d.msg
            if type(d) is not Delivery or isinstance(msg, Barrier) or msg.sink is not None:
                break  # not journaled (a retained replay, a message from the AMQP network)
            if d.qos and (len(inflight) >= rx.receive_maximum or d.pid in inflight):
                break
            q.popleft()
            self.queued_bytes -= msg.size
            if msg.expiry is not None and now is not None and msg.remaining(now) <= 0:
                self.expired += 1  # [MQTT-3.3.2-5]
            elif maxp is not None and msg.frame_size(rx.level, d.qos, d.sub_ids) > maxp:
                self.too_large += 1  # [MQTT-3.1.2-25]
            elif d.qos:
                d.state = SENT
                d.dup = True
                inflight[d.pid] = d

    def renumber(self) -> None:
        """A session moved in from another cluster edge (bridge.edge.cluster):
        its queued deliveries were numbered here, its in-flight ones there;
        queued ones whose number is in flight (or taken twice) get free ones
        (they were never sent, so any number will do)."""
        used = set(self.inflight)
        for d in self.queue:
            if isinstance(d.msg, Barrier) or not d.qos or d.msg.sink is not None:
                continue
            if d.pid in used:
                while packet_id(self.next_k) in used:
                    self.next_k += 1
                d.pid = packet_id(self.next_k)
                self.next_k += 1
            used.add(d.pid)

    def ready(self) -> bool:
        """Something could be sent now (given window room)."""
        return bool(self.queue) and (self.queue[0].msg.ready or isinstance(self.queue[0].msg, Barrier))

    # ------------------------------------------------------------ acks
    def puback(self, pid: int) -> Delivery | None:
        """PUBACK from the subscriber; returns the delivery it ends (None:
        no delivery has that Packet Identifier)."""
        d = self.inflight.get(pid)
        if d is None:
            return None
        if d.qos != 1:
            raise AckMismatch(f"PUBACK for Packet Identifier {pid}, a QoS 2 delivery")
        del self.inflight[pid]
        if d.msg.sink is not None:
            self._end(d, True)
        return d

    def puback_run(self, pids, refs: list) -> int:
        """PUBACKs from the subscriber for ``pids``, in order (a received
        run of them): each ends its QoS 1 delivery as :meth:`puback` does and
        appends the ``ack_ref`` of its message to ``refs`` (``-`` for an
        identifier with no delivery, or a message with no capture record).
        Returns how many were applied: fewer than ``len(pids)`` when the
        next one names a QoS 2 delivery (left to :meth:`puback`, which
        raises :class:`AckMismatch`)."""
        inflight = self.inflight
        n = 0
        for pid in pids:
            d = inflight.get(pid)
            if d is None:
                refs.append(b"-")
            elif d.qos != 1:
                return n
            else:
                del inflight[pid]
                refs.append(d.msg.ref_header)
                if d.msg.sink is not None:
                    self._end(d, True)
            n += 1
        return n

    def pubrec(self, pid: int, reason_code: int) -> Delivery | None:
        """PUBREC from the subscriber: PUBREL is due (the caller sends it)
        unless the reason code is a failure, which ends the delivery."""
        d = self.inflight.get(pid)
        if d is None:
            return None
        if d.qos != 2:
            raise AckMismatch(f"PUBREC for Packet Identifier {pid}, a QoS 1 delivery")
        if d.state != SENT:  # a second PUBREC: PUBREL again (or, RECEIVED, still not due)
            return d
        sink = d.msg.sink
        if reason_code >= 0x80:
            del self.inflight[pid]
            if sink is not None:
                self._end(d, True)  # the client refused it: its delivery ended [MQTT-4.3.3-4]
        elif sink is not None and sink.peer_pubrel:
            d.state = RECEIVED
            self._end(d, True)      # the AMQP_PUBLISH is done with; AMQP_PUBREL comes next
        else:
            d.state = RELEASED
        return d

    def pubcomp(self, pid: int) -> Delivery | None:
        """PUBCOMP from the subscriber: ends a released QoS 2 delivery."""
        d = self.inflight.get(pid)
        if d is None:
            return None
        if d.state != RELEASED:
            raise AckMismatch(f"PUBCOMP for Packet Identifier {pid}, "
                              + ("a QoS 1 delivery" if d.qos == 1 else "before PUBREC"))
        del self.inflight[pid]
        if d.msg.sink is not None:
            self._end(d, True)
        return d

    def release(self, pid: int) -> Delivery | None:
        """AMQP_PUBREL for the RECEIVED delivery ``pid``: its PUBREL is due
        now (the caller sends it, or the re-send on reconnection does)."""
        d = self.inflight.get(pid)
        if d is None or d.state != RECEIVED:
            return None
        d.state = RELEASED
        return d

    def clear(self) -> None:
        for d in list(self.inflight.values()) + list(self.queue):
            if type(d) is Delivery and d.msg.sink is not None and d.state != RECEIVED:
                self._end(d, False)
        self.dl_pids.clear()
        self.queue.clear()
        self.inflight.clear()
        self.queued_bytes = 0
        self.replays = 0

    def __repr__(self) -> str:
        return (f"Outbox(queued={len(self.queue)}, inflight={len(self.inflight)}, "
                f"dropped={self.dropped}, expired={self.expired}, too_large={self.too_large})")
