"""The forwarding engine: :class:`Engine`, everything proton, run only on
the :class:`~bridge.amqp.sender.Forwarder`'s thread.

The Engine is the proton handler of the Forwarder's reactor ``Container``.
It holds the state and composes the parts that work on it, along the data
flow: :class:`~bridge.amqp.batches.BatchAccounting` (batches in, counted,
done or failed), :class:`~bridge.amqp.connection.ConnectionEvents` (the
connection and session), :class:`~bridge.amqp.links.LinkEvents` (each
address's two links), :class:`~bridge.amqp.deliveries.Deliveries` (the
in-order send, dispositions, retries). Here: the Forwarder's commands
(submit, close a batch, call, stop), the periodic tick (dispositions, opens
and attaches that take too long, idle links and connection) and
:meth:`Engine.describe`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import time
from typing import Any

from proton import Handler
from proton.reactor import Container, EventInjector

from bridge.amqp.batches import Batch, BatchAccounting, Item
from bridge.amqp.connection import ConnectionEvents, peer_url
from bridge.amqp.deliveries import Deliveries
from bridge.amqp.links import AddressLink, LinkEvents, qos2_rcv_second, rcv_mode_name, snd_mode_name
from bridge.amqp.mapping import PROFILES
from bridge.amqp.reactor import release
from bridge.amqp.results import ForwardError
from bridge.config import AmqpConfig

__all__ = ["TICK_BUSY_S", "TICK_IDLE_S", "TICK_LINKS", "Engine"]

log = logging.getLogger("bridge.amqp")

TICK_BUSY_S = 0.05
TICK_IDLE_S = 1.0
#: links one tick looks at, at most (``Engine._links_to_check``)
TICK_LINKS = 1_000


class _Tick(Handler):
    def __init__(self, engine: "Engine") -> None:
        super().__init__()
        self.engine = engine

    def on_timer_task(self, event: Any) -> None:
        self.engine.tick()


class Engine(BatchAccounting, ConnectionEvents, LinkEvents, Deliveries, Handler):
    """Everything proton: runs only on the Forwarder's thread."""

    def __init__(self, config: AmqpConfig, container_id: str) -> None:
        super().__init__()
        self.cfg = config
        self.profile = PROFILES[config.profile]
        self.qos2_rcv = qos2_rcv_second(config)
        self.url, self.user, self.password = peer_url(config)
        self.container_id = container_id
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.container: Container | None = None
        self.injector = EventInjector()
        self.conn: Any = None
        self.conn_up = False
        self.conn_started = 0.0
        self.conn_failures = 0
        self.conn_condition = ""
        self.reconnect_at = 0.0
        self.session: Any = None
        self.links: dict[tuple[str, str], AddressLink] = {}
        self.by_name: dict[str, AddressLink] = {}
        self.dirty: set[AddressLink] = set()
        self.inflight_order: collections.deque[tuple[float, Item, int]] = collections.deque()
        #: deliveries sent and not settled: delivery_key -> (held pn_delivery_t *, item or None for QoS 0, link)
        self.deliveries: dict[int, tuple[Any, Item | None, AddressLink]] = {}
        self.batches: list[Batch] = []
        self.good: set[tuple[str, str]] = set()
        self.careful = False
        self.link_seq = itertools.count(1)
        self.idle_since = time.monotonic()
        self.stopping = False
        self.tick_task: Any = None
        #: the keys of links still to look at in this round of ticks (_links_to_check)
        self._tick_keys: list[tuple[str, str]] | None = None
        self.opened = 0
        self.progress = False  # a delivery was accepted on the current connection
        self.peer_info = ""

    # ---------------------------------------------------------- plumbing
    def on_reactor_init(self, event: Any) -> None:
        self.container = event.container
        event.container.selectable(self.injector)
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        busy = bool(self.batches) or bool(self.inflight_order)
        self.tick_task = self.container.schedule(TICK_BUSY_S if busy else TICK_IDLE_S, _Tick(self))

    def on_lg_wakeup(self, event: Any) -> None:
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            op = cmd[0]
            if op == "submit":
                self._submit(cmd[1], cmd[2])
            elif op == "close_batch":
                cmd[1].closed = True
                self._check_batch(cmd[1])
            elif op == "call":
                fn, box, ev = cmd[1], cmd[2], cmd[3]
                try:
                    box.append(fn())
                finally:
                    ev.set()
            elif op == "stop":
                self._stop()
                return
        self.pump()

    def _stop(self) -> None:
        self.stopping = True
        for b in list(self.batches):
            self._fail_batch(b, ForwardError("forwarder closed", outcome="closed"))
        if self.tick_task is not None:
            self.tick_task.cancel()
        for link in list(self.links.values()):
            if link.sender is not None:
                link.sender.close()
            self._drop_sender(link)
        self.links.clear()
        if self.session is not None:
            self.session.close()
        if self.conn is not None:
            self.conn.close()
        self._forget_all()
        self.injector.close()
        if self.conn is None:
            self.container.stop()

    # ---------------------------------------------------------- the tick
    def _links_to_check(self) -> list[AddressLink]:
        """The links this tick looks at (attach timeouts, queued sends that
        waited, idle detach): all of them while there are at most
        :data:`TICK_LINKS`, else the next :data:`TICK_LINKS` in turn. With a
        link per topic (``/topic/{routing_key}``), 200,000 topics made every
        50 ms tick walk 200,000 links: this thread then held the interpreter
        lock more than half the time, and the edge beside it (``lakegate
        run``) waited for it (issue 38, item 8). In turn, each link
        is still looked at every ``len(links) / TICK_LINKS`` ticks (10 s at
        200,000), well within the timeouts it checks."""
        links = self.links
        if len(links) <= TICK_LINKS:
            self._tick_keys = None
            return list(links.values())
        keys = self._tick_keys
        if not keys:
            keys = self._tick_keys = list(links)  # one C-level copy per round
        batch = keys[-TICK_LINKS:]
        del keys[-TICK_LINKS:]
        return [lk for lk in map(links.get, batch) if lk is not None]

    def tick(self) -> None:
        try:
            now = time.monotonic()
            timeout = self.cfg.disposition_timeout_s
            # deliveries without a disposition
            order = self.inflight_order
            while order:
                sent_at, item, key = order[0]
                if item.delivery is None or item.delivery != key or item.done:
                    order.popleft()
                    continue
                if now - sent_at < timeout:
                    break
                order.popleft()
                entry = self.deliveries.pop(key, None)
                link = None
                if entry is not None:
                    release(entry[0], settle=True)  # abandon: a later disposition is ignored
                    link = entry[2]
                    link.inflight.pop(item.seq, None)
                item.delivery = None
                self._fail_item(item, link, f"no disposition within {timeout:g}s")
            # connecting or attaching for too long
            if self.conn is not None and not self.conn_up and now - self.conn_started > timeout:
                self.conn_condition = f"no open from the peer within {timeout:g}s"
                t = self.conn.transport
                if t is not None:
                    t.close_tail()
                    t.close_head()
            for link in self._links_to_check():
                if link.state == "attaching" and now - link.attach_started > timeout and self.conn_up:
                    s = link.sender
                    self._drop_sender(link)
                    s.close()
                    self._attach_failed(link, f"no attach from the peer within {timeout:g}s")
                if link.queue:
                    self.dirty.add(link)
                elif not link.inflight and now - link.last_used > self.cfg.link_idle_s:
                    if link.sender is not None:
                        log.info("AMQP detaching idle %s link to %r", link.cls, link.address)
                        link.sender.close()
                        self._drop_sender(link)
                    del self.links[link.key]
            # an idle connection with no links
            if self.conn is not None and not self.links and not self.batches:
                if now - self.idle_since > self.cfg.link_idle_s:
                    log.info("AMQP closing idle connection to %s", self.url)
                    self.conn.close()
                    self.conn = None
                    self.conn_up = False
                    self.session = None
            else:
                self.idle_since = now
            self.pump()
        finally:
            if not self.stopping:
                self._schedule_tick()

    # ---------------------------------------------------------- inspection
    def describe(self) -> dict[str, Any]:
        return {
            "connected": self.conn_up,
            "peer": self.peer_info,
            "links": [
                {
                    "address": lk.address,
                    "class": lk.cls,
                    "state": lk.state,
                    "snd_settle_mode": snd_mode_name(lk.sender.snd_settle_mode) if lk.sender else None,
                    "rcv_settle_mode": rcv_mode_name(lk.sender.rcv_settle_mode) if lk.sender else None,
                    "remote_rcv_settle_mode": rcv_mode_name(lk.sender.remote_rcv_settle_mode)
                    if lk.sender is not None and lk.state == "up" else None,
                }
                for lk in self.links.values()
            ],
        }
