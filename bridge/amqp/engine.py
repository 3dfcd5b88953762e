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
:meth:`Engine.describe`. The engine keeps at most ``amqp.max_links`` sender
links open, or rides the peer's anonymous relay (:mod:`bridge.amqp.links`);
its counts of links (open, peak, attaches, detaches, evictions, lanes
waiting) are plain ints, read from other threads without a call
(:meth:`Engine.link_stats`).
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
        #: after the peer ended a session with several links attaching: those suspects attach again, and
        #: every link not known good attaches one at a time, until each suspect attached or gave up
        #: (LinkEvents._careful_check)
        self.careful = False
        self.suspects: set[tuple[str, str]] = set()
        self.link_seq = itertools.count(1)
        self.idle_since = time.monotonic()
        self.stopping = False
        self.tick_task: Any = None
        #: the keys of links still to look at in this round of ticks (_links_to_check)
        self._tick_keys: list[tuple[str, str]] | None = None
        self.opened = 0
        self.progress = False  # a delivery was accepted on the current connection
        self.peer_info = ""
        # the bound on open links (bridge.amqp.links)
        self.max_links = config.max_links
        #: links of their own that went idle (nothing in flight), in the order they did: the least recently
        #: used first. An entry may be stale (busy again, or gone): _evict_one checks it and lets it go
        self.idle: collections.OrderedDict[AddressLink, None] = collections.OrderedDict()
        #: lanes waiting for a link, first come first served
        self.waiting: collections.OrderedDict[AddressLink, None] = collections.OrderedDict()
        self.open_links = 0  # sender links attaching, attached, or detached here and not yet by the peer
        #: the links detached here whose detach the peer has not answered (they count as open): name -> when
        self.closing: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.peak_links = 0
        self.attaches = 0  # sender links attached (begun), since the start
        self.detaches = 0  # sender links ended: detached at both ends, or gone with their session or connection
        self.evictions = 0  # ... of which detached to make room under amqp.max_links
        # the anonymous relay (bridge.amqp.links): per class, its link; whether this connection uses it
        self.relays: dict[str, AddressLink] = {}
        self.relay_on: bool | None = None  # None: not decided yet (no open frame from the peer on this connection)
        self.relay_to = False  # on the relay, each message's "to" is set to its address
        #: attaches wait for the peer's open frame: its capabilities decide between the relay and links
        self.relay_wanted = config.anonymous_relay == "on" or (
            config.anonymous_relay == "auto" and config.address_template == "{topic}")

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
        for link in list(self.links.values()) + list(self.relays.values()):
            if link.sender is not None:
                link.sender.close()
            self._drop_sender(link)
        self.links.clear()
        self.relays.clear()
        self.waiting.clear()
        self._forget_closing()
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
            closing = self.closing
            while closing and now - next(iter(closing.values())) > timeout:  # a detach the peer never answered
                name, _ = closing.popitem(last=False)
                log.info("AMQP no detach from the peer for link %s within %gs: its slot is free again", name, timeout)
                self.open_links -= 1
                self.detaches += 1
            for relay in list(self.relays.values()):
                if relay.state == "attaching" and now - relay.attach_started > timeout and self.conn_up:
                    s = relay.sender
                    self._relay_ended(relay, f"no attach from the peer within {timeout:g}s", refused=True)
                    s.close()
            for link in self._links_to_check():
                if link.via is None and link.state == "attaching" and now - link.attach_started > timeout \
                        and self.conn_up:
                    s = link.sender
                    self._drop_sender(link)
                    s.close()
                    self._attach_failed(link, f"no attach from the peer within {timeout:g}s")
                if not link.inflight and link.sender is not None and link not in self.idle:
                    self._went_idle(link)  # missed (its batch failed, its other lane waits ...): a candidate
                if link.queue:
                    if link not in self.waiting:  # those waiting for a link get one in turn (pump)
                        self.dirty.add(link)
                elif not link.inflight and now - link.last_used > self.cfg.link_idle_s:
                    if link.sender is not None:
                        log.info("AMQP detaching idle %s link to %r", link.cls, link.address)
                        self._close_link(link, "idle")
                    elif link.via is not None:
                        self._drop_sender(link)  # leaves the relay, which stays
                    del self.links[link.key]
                    self.waiting.pop(link, None)
            if self.careful:
                self._careful_check()  # a suspect whose batch failed meanwhile
            # an idle connection with no links
            if self.conn is not None and not self.links and not self.batches:
                if now - self.idle_since > self.cfg.link_idle_s:
                    log.info("AMQP closing idle connection to %s", self.url)
                    self._drop_relays()
                    self._forget_closing()
                    self.relay_on = None
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
    def link_stats(self) -> dict[str, Any]:
        """The link counts (plain ints: safe to read from any thread, each
        value current when read): ``open`` sender links (attaching, attached,
        or detached here and not yet by the peer: ``detaching``; relay links
        included; at most ``max_links``), ``peak`` (the most open at once),
        ``attaches``, ``detaches`` (ended at both ends, or with the session
        or connection: ``open == attaches - detaches``), ``evictions`` (detached
        to make room under ``max_links``), ``waiting`` (lanes waiting for a
        link), ``lanes`` ((address, class) pairs with state), ``relay``
        (this connection rides the anonymous relay)."""
        return {"open": self.open_links, "peak": self.peak_links, "attaches": self.attaches,
                "detaches": self.detaches, "detaching": len(self.closing), "evictions": self.evictions,
                "waiting": len(self.waiting), "lanes": len(self.links), "max_links": self.max_links,
                "relay": bool(self.relay_on)}

    def describe(self) -> dict[str, Any]:
        def one(lk: AddressLink) -> dict[str, Any]:
            s = lk.sender if lk.via is None else lk.via.sender
            return {
                "address": lk.address if lk.lanes is None else None,
                "class": lk.cls,
                "state": lk.state,
                "via": "relay" if lk.via is not None else None,
                "snd_settle_mode": snd_mode_name(s.snd_settle_mode) if s else None,
                "rcv_settle_mode": rcv_mode_name(s.rcv_settle_mode) if s else None,
                "remote_rcv_settle_mode": rcv_mode_name(s.remote_rcv_settle_mode)
                if s is not None and (lk.via or lk).state == "up" else None,
            }

        return {
            "connected": self.conn_up,
            "peer": self.peer_info,
            **self.link_stats(),
            "links": [one(lk) for lk in self.links.values()],
            "relay_links": [one(lk) for lk in self.relays.values()],
        }
