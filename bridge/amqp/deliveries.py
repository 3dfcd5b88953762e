"""Deliveries of the forwarding engine: sending in order, and what comes back.

:class:`Deliveries` pumps (connects, attaches and sends whatever can go
now), sends each address's messages in one order across its two links
(``_send_in_order``), makes a message's delivery (or sets it aside as
unforwardable, or expired, or done at once for QoS 0), takes the peer's
disposition, and sends a message again after backoff when it failed
(up to ``amqp.max_retries``, ahead of anything not yet sent to its address).
Past that bound the batch fails, except for a message the peer rejected
for its own sake on every attempt (:func:`~bridge.amqp.retry.message_fault`):
that one is quarantined as ``LG-amqp-rejected`` and the batch goes on; so is,
without being sent, a message larger than its link's max-message-size.

The per-message work runs on proton's C API (:mod:`bridge.amqp.reactor`):
``_transfer`` sends with :func:`~bridge.amqp.reactor.send` and keeps the
delivery in ``Engine.deliveries`` (key: its address; the entry names the
lane, :class:`~bridge.amqp.links.AddressLink`, whose own link or the
anonymous relay's carried it); an *accepted*
disposition is settled by :meth:`Deliveries.fast_delivery` before proton
wraps the event; every other outcome reaches :meth:`Deliveries.on_delivery`.

:class:`Deliveries` is a part of :class:`~bridge.amqp.engine.Engine` and works on
its attributes; it runs only on the Forwarder's thread.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any

from cproton_ffi import lib
from proton import Delivery

from bridge.amqp.mapping import LINK_QOS01, LINK_QOS2
from bridge.amqp.reactor import PN_ACCEPTED, delivery_key, release, send
from bridge.amqp.wire import wire_bytes
from bridge.amqp.results import ForwardError
from bridge.amqp.retry import backoff, delivery_outcome, message_fault
from bridge.amqp.unforwardable import ENCODING_FAILURES, NOT_THE_ROWS_FAULT, rejected, unforwardable

if TYPE_CHECKING:  # pragma: no cover
    from bridge.amqp.batches import Item
    from bridge.amqp.links import AddressLink

__all__ = ["Deliveries"]

log = logging.getLogger("bridge.amqp")


class Deliveries:
    """The pump, the in-order send, transfers, dispositions, retries of messages."""

    def fast_delivery(self, d: Any) -> bool:
        """A ``PN_DELIVERY`` event's raw delivery, before proton wraps it
        (:class:`~bridge.amqp.reactor.FastContainer`): an *accepted* outcome
        of one of ours is settled and counted here; anything else (not ours,
        another outcome) returns False and reaches :meth:`on_delivery`."""
        key = delivery_key(d)
        entry = self.deliveries.get(key)
        if entry is None or lib.pn_delivery_remote_state(d) != PN_ACCEPTED:
            return False
        del self.deliveries[key]
        release(d, settle=True)
        item, link = entry[1], entry[2]
        if item is None:  # QoS 0: done when sent
            link.pending0.discard(key)
            return True
        item.delivery = None
        inflight = link.inflight
        inflight.pop(item.seq, None)
        if not inflight:
            self._went_idle(link)  # may be: a lane waiting for a link may take its place
        if item.batch.error is None:
            self.progress = True
            self._item_done(item, "accepted")
        self.pump()
        return True

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        lnk = dlv.link
        if not lnk.is_sender or not dlv.updated:
            return
        state = dlv.remote_state
        terminal = state in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED, Delivery.MODIFIED)
        if not terminal and not dlv.settled:
            return  # e.g. RECEIVED: not an outcome
        key = delivery_key(dlv._impl)
        entry = self.deliveries.pop(key, None)
        item = entry[1] if entry is not None else None
        outcome = "accepted" if state == Delivery.ACCEPTED else delivery_outcome(dlv)
        fault = message_fault(dlv) is not None
        # the lane that sent it (on the relay, the relay's name tells only the class)
        link = entry[2] if entry is not None else self.by_name.get(lnk.name)
        dlv.settle()  # first: frees it; second: lets the receiver settle
        if entry is not None:
            release(entry[0])
            if item is None:
                entry[2].pending0.discard(key)
        if item is None:
            if entry is not None and state != Delivery.ACCEPTED:
                log.debug("AMQP QoS 0 message not accepted: %s", outcome)
            return
        item.delivery = None
        if link is not None:
            link.inflight.pop(item.seq, None)
            link.last_used = time.monotonic()
            if not link.inflight:
                self._went_idle(link)
        if item.batch.error is not None:
            return
        if state == Delivery.ACCEPTED:
            self.progress = True
            self._item_done(item, "accepted")
        else:
            self._fail_item(item, link, outcome, fault=fault)
        self.pump()

    def _forget(self, item: Item) -> None:
        """``item`` has no delivery in flight any more (its link or connection
        is gone, or it was abandoned): let go of the one it had."""
        if item.delivery is not None:
            entry = self.deliveries.pop(item.delivery, None)
            if entry is not None:
                release(entry[0])
            item.delivery = None

    def _forget_all(self) -> None:
        """The connection is gone: let go of every delivery still held."""
        entries, self.deliveries = self.deliveries, {}
        for d, item, link in entries.values():
            release(d)
            if item is not None:
                item.delivery = None
            else:
                link.pending0.clear()

    def _fail_item(self, item: Item, link: AddressLink | None, outcome: str, requeue: bool = True,
                   fault: bool = False) -> None:
        """A failed attempt of ``item``; ``fault``: the peer rejected it for
        the message's own sake (retry.MESSAGE_FAULT_CONDITIONS)."""
        if item.done or item.batch.error is not None:
            return
        item.attempts += 1
        if fault:
            item.faults += 1
        self._forget(item)
        if item.attempts > self.cfg.max_retries:
            out = item.out
            if item.faults == item.attempts:  # the same bytes refused every time: the message's fault
                item.batch.result.failures.append(
                    rejected(out, f"AMQP peer did not accept {out.kind} {out.key} sent to address "
                                  f"{out.address!r}: {outcome} ({item.attempts} attempts)", item.size))
                self._item_done(item, "unforwardable")
                return
            self._fail_batch(item.batch, ForwardError(
                f"AMQP peer did not accept {out.kind} {out.key} sent to address {out.address!r}: "
                f"{outcome} ({item.attempts} attempts)",
                address=out.address, outcome=outcome, attempts=item.attempts, key=out.key))
            return
        delay = backoff(self.cfg, item.attempts)
        item.not_before = time.monotonic() + delay
        log.debug("AMQP %s to %r: %s; retry %d/%d in %.2fs",
                  item.out.key, item.out.address, outcome, item.attempts, self.cfg.max_retries, delay)
        self._trouble(item.batch, f"{outcome} (address {item.out.address!r})")
        if requeue and link is not None:
            self._requeue(link, [item])

    def _requeue(self, link: AddressLink, items: list[Item]) -> None:
        if not items:
            return
        items.sort(key=lambda i: i.seq)
        merged = collections.deque()
        q = link.queue
        for item in items:
            while q and q[0].seq < item.seq:
                merged.append(q.popleft())
            merged.append(item)
        merged.extend(q)
        link.queue = merged
        self.dirty.add(link)

    # ---------------------------------------------------------- progress
    def pump(self) -> None:
        """Attach, connect and send whatever can go now: a lane without a link
        gets one (or the anonymous relay's), within ``amqp.max_links`` (else it
        waits: :mod:`bridge.amqp.links`)."""
        if self.stopping:
            return
        room = bool(self.waiting) and (bool(self.idle) or self.open_links < self.max_links)
        if not self.dirty and not room and (self.conn is not None or not self.batches):
            return
        now = time.monotonic()
        if self.conn is None:
            if self.batches and now >= self.reconnect_at:
                self._connect()
            else:
                return
        if self.relay_on is None and self.relay_wanted:
            return  # the peer's open frame decides between the relay and links (on_connection_remote_open)
        dirty, self.dirty = self.dirty, set()
        attaching = -1
        relay = self.relay_on
        for link in dirty:
            if not link.queue:
                continue
            if link.state == "idle" and link.via is None:
                if now < link.not_before:
                    continue
                if relay:
                    self._bind(link)
                    continue
                if self.careful and link.key not in self.good:
                    if attaching < 0:
                        attaching = sum(1 for lk in self.links.values() if lk.state == "attaching")
                    if attaching:
                        continue
                    attaching += 1
                if self.open_links >= self.max_links or self.waiting:
                    self._wait_for_link(link)  # after those waiting already
                    continue
                self._attach(link)
        if self.waiting and (self.idle or self.open_links < self.max_links):
            self._serve_waiting(dirty, now)  # in turn, into free slots or those of idle links
        addresses = {link.address for link in dirty if link.queue}
        if addresses:
            wall = time.time()
            for address in addresses:
                self._send_in_order(address, now, wall)

    def _send_in_order(self, address: str, now: float, wall: float) -> None:
        """Send what can go now to ``address``, over its two links (QoS 0/1
        and QoS 2) in one order: by ``seq``, the order ``forward`` was given
        the messages (capture order), whatever their QoS level. When the next
        message's link cannot take it yet (attaching, no credit, a resend
        waiting for its backoff), nothing later to that address goes either,
        so a peer that handles one session's transfers in order (RabbitMQ 3.x
        does) receives a topic's messages from one MQTT connection in the
        order they were published, across QoS levels. Different addresses do
        not wait for each other: each link's messages go out in runs, which
        is what keeps many topics fast (a transfer that switches links costs
        proton an event)."""
        links = [lk for lk in (self.links.get((address, LINK_QOS01)), self.links.get((address, LINK_QOS2)))
                 if lk is not None and self._head(lk) is not None]
        credit: dict[AddressLink, int] = {}  # per sender link, read once, then counted down here
        while links:
            link = links[0] if len(links) == 1 or links[0].queue[0].seq < links[1].queue[0].seq else links[1]
            item = link.queue[0]
            via = link.via
            sl = link if via is None else via  # the sender link: its own, or the relay's
            if sl.state != "up" or item.not_before > now:
                if via is not None and sl.state != "up":
                    via.blocked.add(link)
                return
            c = credit.get(sl)
            if c is None:
                c = lib.pn_link_credit(sl.impl)
            if c <= 0:
                if via is not None:
                    via.blocked.add(link)  # the relay's next flow wakes it
                return
            link.queue.popleft()
            credit[sl] = c - 1 if self._transfer(link, item, now, wall) else c
            if self._head(link) is None:
                links.remove(link)
                if not link.inflight:
                    self._went_idle(link)  # QoS 0 only, or set aside

    @staticmethod
    def _head(link: AddressLink) -> "Item | None":
        """The link's next message to send (dropping those already done or of a failed batch)."""
        q = link.queue
        while q:
            item = q[0]
            if not item.done and item.batch.error is None:
                return item
            q.popleft()
        return None

    def _transfer(self, link: AddressLink, item: Item, now: float, wall: float) -> bool:
        """Send ``item`` on ``link`` (True), or settle it unsent (False: expired,
        unforwardable, over the link's max-message-size)."""
        out = item.out
        try:
            # on the relay the peer routes by "to": with amqp.anonymous_relay = "on" and a template that is
            # not {topic}, the address goes there instead of the topic (bridge.amqp.links)
            data = wire_bytes(out, wall, to=out.address if (self.relay_to and link.via is not None) else None)
        except ENCODING_FAILURES as exc:  # the row's fault: set aside, the batch goes on
            if isinstance(exc, NOT_THE_ROWS_FAULT):
                raise
            item.batch.result.failures.append(unforwardable(out, exc))
            self._item_done(item, "unforwardable")
            return False
        if data is None:
            self._item_done(item, "expired")
            return False
        via = link.via
        sl = link if via is None else via
        impl = sl.impl
        limit = sl.max_size  # 0: the peer set no limit
        if limit and len(data) > limit:  # the peer would refuse it every time: not sent
            item.batch.result.failures.append(rejected(
                out, f"amqp:link:message-size-exceeded: {out.kind} {out.key} is {len(data)} bytes encoded, "
                     f"over the max-message-size {limit} of its link to address {out.address!r}; not sent",
                len(data)))
            self._item_done(item, "unforwardable")
            return False
        item.size = len(data)
        d = send(impl, str(item.seq).encode(), data)
        key = delivery_key(d)
        r = item.batch.result
        r.transfers += 1
        if item.attempts:
            r.retried += 1
        link.last_used = now
        if out.qos == 0:
            self.deliveries[key] = (d, None, link)  # its disposition is settled, not awaited
            link.pending0.add(key)
            self._item_done(item, "qos0")
            return True
        self.deliveries[key] = (d, item, link)
        item.delivery = key
        item.sent_at = now
        link.inflight[item.seq] = item
        self.inflight_order.append((now, item, key))
        return True
