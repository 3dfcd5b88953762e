"""The edge server's side of live delivery: hand each accepted PUBLISH to
the router once appended, release it to subscribers once durable, and move
the bytes.

* When a PUBLISH (or a Will) is appended to the capture log, the
  :class:`~bridge.edge.router.Router` pushes a delivery into the outbox of
  every matching session at once, so deliveries are queued in append order.
  The message stays ``ready = False`` until its group commit completes: no
  subscriber sees a message a crash of the edge could lose, and an outbox
  sends nothing behind a message that is not durable yet (order per topic
  across QoS levels).
* One callback per group commit (shared with the acknowledgements, see
  :mod:`bridge.edge.acks`) marks its messages ready and pumps the sessions
  that got them.
* A subscriber connection whose transport buffer is full (a peer that does
  not read) is not pumped until the transport drains (``resume_writing``):
  its deliveries wait in its outbox, whose bound applies.
* Counted drops (queue bound, expiry, Maximum Packet Size) are logged once
  per :data:`~bridge.edge.persist.SNAPSHOT_INTERVAL_S` per client, never per
  message.

:class:`FanOut` is a part of :class:`~bridge.edge.server.EdgeServer` and
works on its attributes.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

from bridge.edge.message import Message, publish_parts
from bridge.edge.session import TURN_BUDGET

if TYPE_CHECKING:
    from bridge.edge.connection import Connection

__all__ = ["FanOut"]

log = logging.getLogger("bridge.edge")


class FanOut:
    """Live delivery for the :class:`~bridge.edge.server.EdgeServer`."""

    def _route(self, frame: bytes, level: int, topic: str | None, origin: str, ack,
               m=None) -> None:
        """``frame`` (an accepted PUBLISH) was appended with ``ack``; ``m``:
        the tree's match for ``topic`` if the session took it (used while
        the tree has not changed since)."""
        router = self.router
        if topic is None:
            _first, t0, t1, _p0, _pay = publish_parts(frame, level)
            topic = frame[t0:t1].decode()
        if m is None or m.version != router.tree.version:
            m = router.tree.match(topic)
        retain = frame[0] & 1 and self.retained is not None
        if not m and not retain:
            return  # nobody subscribed: no message is built
        msg = Message.from_frame(frame, level, topic=topic, origin=origin,
                                 received=self.loop.time(), ref=(ack.partition, ack.offset))
        if retain:  # the retained store takes it now; it goes out once durable, as any
            self.retained.capture(topic, ack.seq, (ack.partition, ack.offset), msg)
        targets = router.deliver(msg, m, self._connected) if m else []
        if not targets and not retain:
            return
        fut: Future = ack.future
        if fut.done():
            if fut.exception() is not None:
                return  # the log failed: the server is stopping
            msg.ready = True
            self.loop.call_soon(self._pump_all, targets)
            return
        waiting = self._fanout_wait.get(fut)
        if waiting is None:
            self._fanout_wait[fut] = ([msg], {id(t): t for t in targets})
            fut.add_done_callback(self._durable_threadsafe)
        else:
            waiting[0].append(msg)
            for t in targets:
                waiting[1][id(t)] = t

    def _released(self, fut: Future) -> None:
        """Called on the loop when the group commit ``fut`` completed."""
        waiting = self._fanout_wait.pop(fut, None)
        if waiting is None or fut.exception() is not None:
            return
        for m in waiting[0]:
            m.ready = True
        self._pump_all(waiting[1].values())

    def _connected(self, client_id: str) -> bool:
        return client_id in self.clients

    def _pump_all(self, targets) -> None:
        """Pump the sessions ``targets`` got messages for, a turn's work
        (``session.TURN_BUDGET`` frames, a unit per session) at a time: the
        rest in the next turn of the event loop [LG-edge-turn-budget]. (A
        group commit can release messages for hundreds of sessions, each
        of which may take a share of its queue, ``delivery._PUMP_FRAMES``.)"""
        clients = self.clients
        spent = 0
        targets = list(targets)
        for i, client in enumerate(targets):
            if spent >= TURN_BUDGET:
                self.loop.call_soon(self._pump_all, targets[i:])
                return
            conn = clients.get(client.client_id)
            if conn is not None:
                box = client.outbox
                sent = box.sent if box is not None else 0
                self.pump(conn)
                spent += 1 + (box.sent - sent if box is not None else 0)

    def pump(self, conn: Connection) -> None:
        """Send what ``conn``'s session may send now (nothing while its
        transport buffer is full)."""
        if conn.transport is None or "write" in conn.paused_by or conn.session is None:
            return
        actions = conn.session.deliver(self.loop.time())
        if actions:
            self.perform(conn, actions)  # (which pumps again soon if the outbox says more)
        else:
            client = conn.client
            if client is not None and client.outbox is not None and client.outbox.more:
                self.pump_soon(conn)  # a replay handed out nothing yet, and is not done

    def pump_soon(self, conn: Connection) -> None:
        """Pump ``conn`` once more from the event loop (a retained replay
        hands out a bounded share per pump, so that a subscription to ``#``
        over a million topics neither builds one huge write nor holds the
        loop)."""
        if not conn.pump_soon:
            conn.pump_soon = True
            self.loop.call_soon(self._pump_due, conn)

    def _pump_due(self, conn: Connection) -> None:
        """The pump :meth:`pump_soon` scheduled. Only this one clears the
        flag: a direct :meth:`pump` meanwhile (a group commit releasing a
        message to the same session) must not, or its own request for more
        schedules a second pump while this one is pending, one more per
        commit, and the turns grow without bound (issue 38: a subscriber
        to ``#`` replayed 200,000 retained messages while live ones came)
        [LG-edge-turn-budget]."""
        conn.pump_soon = False
        self.pump(conn)

    def _log_drops(self) -> None:
        """One line per client whose deliveries were dropped since the last call."""
        router = self.router
        for cid, n in router.dropped.items():
            log.warning("client=%s: %d queued messages dropped, the oldest first (over "
                        "edge.max_queued_messages = %d or edge.max_queued_bytes = %d)", cid, n,
                        self.edge.max_queued_messages, self.edge.max_queued_bytes)
        router.dropped.clear()
        for cid, s in router.sessions.items():
            box = s.outbox
            if box is None:
                continue
            seen = self._drop_seen.get(cid, (0, 0))
            if (box.expired, box.too_large) != seen:
                log.info("client=%s: %d messages expired before they could be sent "
                         "[MQTT-3.3.2-5], %d larger than the client's Maximum Packet Size not "
                         "sent [MQTT-3.1.2-25] (totals)", cid, box.expired, box.too_large)
                self._drop_seen[cid] = (box.expired, box.too_large)

