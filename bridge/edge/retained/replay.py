"""One subscription's retained messages on their way out. Sans-IO.

A :class:`Replay` is made when a SUBSCRIBE asks for retained messages
(Retain Handling 0, or 1 for a new subscription; always in MQTT 3.x
[MQTT-3.3.1-9, MQTT-3.3.1-10]). It holds the matched table rows (row
numbers into the snapshot it was made from, which it keeps alive) and the
overlay's messages, not the messages themselves: the session's
:class:`~bridge.edge.delivery.Outbox` keeps it in its queue as a barrier
(every live message for the session queues behind it, so none for the new
subscription leaves before the retained ones) and takes a few deliveries at
a time (:meth:`Replay.take`), as the client's Receive Maximum and the
outbox's per-pump budget allow. A replay of a million topics is therefore
never in memory at once, and never cut short: it ends when every row was
sent, expired meanwhile [MQTT-3.3.2-5], or could not be read (a table file
vacuumed away under it: counted and logged).

Each delivery: RETAIN 1 [MQTT-3.3.1-8, 3.1.1 numbering; MQTT 5.0 section
3.3.1.3], QoS the minimum of the stored and the granted QoS [MQTT-3.8.4-8],
the subscription's Subscription Identifier [MQTT-3.3.4-3], properties as
stored with the Message Expiry Interval decremented [MQTT-3.3.2-6] (done by
:meth:`~bridge.edge.message.Message.frame`).

Packet Identifiers: the replay's QoS 1/2 deliveries take the numbers
``k`` .. ``k + count - 1`` the outbox reserved for it when it was queued,
so the numbering of later live deliveries (and their replay after a crash,
``bridge.edge.journal``: the SUBSCRIBE's capture carries ``retained_k`` =
``count``) does not depend on how fast the replay goes.
"""

from __future__ import annotations

import collections

from bridge.edge.delivery import Barrier, Delivery, packet_id
from bridge.edge.message import Message
from bridge.edge.retained.scan import OverlayScan

__all__ = ["BLOCK", "Replay", "ReplayedDelivery"]

#: table rows read at a time (one vectorised read of their payloads)
BLOCK = 256
#: overlay scan steps one take may run (bridge.edge.retained.scan: ~1 ms each)
SCAN_STEPS = 2


class ReplayedDelivery(Delivery):
    """A delivery of a retained message on subscribe (the outbox's queue
    bound never drops one: the replay would be cut short)."""

    __slots__ = ()


class Replay(Barrier):
    """See the module docstring. ``rows``: snapshot rows (int64), ``extra``:
    overlay messages, both already filtered by the store; ``qos_cap``: the
    granted QoS; ``count``: deliveries at QoS 1/2 among them."""

    topic = "(retained replay)"

    def __init__(self, snapshot, rows, extra: list[Message], qos_cap: int,
                 sub_ids: tuple[int, ...], clock_offset: float, allowed=None,
                 scan: OverlayScan | None = None, lazy: tuple[str, float] | None = None) -> None:
        self.snapshot = snapshot
        #: the table's rows to send; None: matched when the replay gets to
        #: them (``lazy``: the filter and the server's clock at the SUBSCRIBE)
        self.rows = rows
        self.lazy = lazy
        self.pos = 0
        self.extra = collections.deque(extra)
        self.qos_cap = qos_cap
        self.sub_ids = sub_ids
        self.clock_offset = clock_offset
        #: the overlay matched a block at a time (bridge.edge.retained.scan);
        #: its messages go first, then the table's rows (less those it hid)
        self.scan = scan
        self.count = int(sum(1 for m in extra if min(m.qos, qos_cap)))
        if rows is None:  # not matched yet: every row of the version may be served
            size = snapshot.size if snapshot is not None else 0
            self.total = len(extra) + size
            if qos_cap:
                self.count += size
        else:
            if qos_cap and rows.size:
                self.count += int((snapshot.qos[rows] != 0).sum())
            self.total = len(extra) + int(rows.size)
        if scan is not None:  # not known yet: every entry of the list may be served
            self.total += len(scan.entries)
            if qos_cap:
                self.count += len(scan.entries)
        self.k = 0  # the first reserved number (set by the outbox)
        self.sent = 0
        self.lost = 0  # rows whose table file could not be read
        #: ``allowed(topic)``: the ACL's read check at delivery (None: no ACL)
        self.allowed = allowed
        self.denied = 0

    @property
    def done(self) -> bool:
        return not self.extra and self.scan is None and self.rows is not None \
            and self.pos >= self.rows.size

    def _match_rows(self) -> None:
        """The table's rows of a lazy replay, once the overlay is done
        (as ``RetainedStore.replay`` would have found them at the SUBSCRIBE)."""
        import numpy as np  # (a table is loaded: numpy is)

        snap = self.snapshot
        topic_filter, now = self.lazy
        self.lazy = None
        if snap is None:
            self.rows = np.zeros(0, dtype=np.int64)
            return
        rows = snap.index.match(topic_filter)
        if rows.size:
            rows = snap.live_rows(rows, int((now + self.clock_offset) * 1e6))
        self.rows = rows

    def take(self, n: int) -> list[Delivery]:
        """Up to ``n`` deliveries, in order (fewer at the end). Table rows
        are read :data:`BLOCK` at a time (one vectorised read per block,
        however small the client's window), so at most that many messages
        wait in memory."""
        out: list[Delivery] = []
        extra = self.extra
        scans = 0
        while len(out) < n:
            if not extra:
                scan = self.scan
                if scan is not None:
                    if scans == SCAN_STEPS:
                        break  # not done: the outbox pumps again soon
                    extra.extend(scan.step())
                    scans += 1
                    if scan.done:
                        self.scan = None
                        if self.rows is None:
                            self._match_rows()
                        if scan.hidden:
                            import numpy as np  # (a table is loaded: numpy is)

                            self.rows = np.setdiff1d(self.rows, np.asarray(scan.hidden,
                                                                           dtype=np.int64))
                    continue
                if self.rows is None:
                    self._match_rows()
                    break  # (a match of its own: the rows go from the next take)
                if self.pos >= self.rows.size:
                    break
                chunk = self.rows[self.pos:self.pos + BLOCK]
                self.pos += len(chunk)
                for i, msg in enumerate(self.snapshot.messages(chunk, self.clock_offset)):
                    if msg is None:
                        self.lost += 1
                        if self.qos_cap and self.snapshot.qos[chunk[i]]:
                            self.k += 1  # its number stays unused
                        continue
                    extra.append(msg)
                continue
            msg = extra.popleft()
            if self.allowed is not None and not self.allowed(msg.topic):
                self.denied += 1  # [LG-acl-subscribe] checked again at delivery
                if min(msg.qos, self.qos_cap):
                    self.k += 1  # its number stays unused
                continue
            out.append(self._delivery(msg))
        self.sent += len(out)
        return out

    def _delivery(self, msg: Message) -> Delivery:
        q = msg.qos if msg.qos < self.qos_cap else self.qos_cap
        pid = None
        if q:
            pid = packet_id(self.k)
            self.k += 1
        return ReplayedDelivery(msg, q, True, self.sub_ids, pid)  # RETAIN 1 [MQTT-3.3.1-8]

    def __repr__(self) -> str:
        return f"Replay({self.sent} of {self.total} sent, {self.lost} lost)"
