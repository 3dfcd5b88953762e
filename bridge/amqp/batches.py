"""Batches in the forwarding engine: what one
:meth:`~bridge.amqp.sender.Forwarder.forward` call has handed over.

:class:`Batch` counts (its :class:`~bridge.amqp.results.ForwardResult`),
bounds what the caller may hand over before the engine catches up
(:data:`WINDOW`, in chunks of :data:`CHUNK`), and keeps the batch's trouble;
:class:`Item` is one message of it, with its attempts and its delivery.
:class:`BatchAccounting` takes items in, counts each one's end, closes the
batch or fails it (dropping its queued items), and reports its trouble: the
first failed attempt as one WARNING, later ones to DEBUG and to the batch's
``on_trouble`` at most once per :data:`TROUBLE_REPORT_S`.

:class:`BatchAccounting` is a part of :class:`~bridge.amqp.engine.Engine` and works on
its attributes; it runs only on the Forwarder's thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any


from bridge.amqp.links import AddressLink
from bridge.amqp.mapping import Outgoing
from bridge.amqp.results import ForwardError, ForwardResult

__all__ = ["CHUNK", "TROUBLE_REPORT_S", "WINDOW", "Batch", "BatchAccounting", "Item"]

log = logging.getLogger("bridge.amqp")

#: Mapped rows handed to the engine at a time, and the most not yet done.
CHUNK = 1000
WINDOW = 20000
#: Seconds between two ``on_trouble`` calls of one batch (a failed attempt may come per message).
TROUBLE_REPORT_S = 1.0


class Batch:
    __slots__ = ("result", "pending", "closed", "error", "done", "submitted", "finished", "room", "started",
                 "trouble", "trouble_since", "troubles", "on_trouble", "trouble_told")

    def __init__(self) -> None:
        self.result = ForwardResult()
        self.pending = 0  # submitted items not yet done (engine thread only)
        self.closed = False
        self.error: ForwardError | None = None
        self.done = threading.Event()
        self.room = threading.Event()  # set: the caller may submit more
        self.room.set()
        self.submitted = 0  # written by the caller only
        self.finished = 0  # written by the engine only
        self.started = time.monotonic()
        self.trouble = ""  # the latest failure's cause, "" while there was none
        self.trouble_since = 0.0  # wall-clock time of the batch's first failure
        self.troubles = 0  # failed attempts (messages, connections, links) in this batch
        self.on_trouble: Any = None  # called (cause, since) on the engine thread: see _trouble
        self.trouble_told = 0.0  # monotonic time on_trouble was last called


class Item:
    __slots__ = ("out", "batch", "seq", "attempts", "faults", "size", "delivery", "sent_at", "not_before", "done")

    def __init__(self, out: Outgoing, batch: Batch, seq: int) -> None:
        self.out = out
        self.batch = batch
        self.seq = seq
        self.attempts = 0  # failed attempts so far
        self.faults = 0  # ... of which rejected for the message's own sake (retry.MESSAGE_FAULT_CONDITIONS)
        self.size = 0  # bytes of the last encoding sent
        self.delivery: int | None = None  # its delivery in flight: key into Engine.deliveries
        self.sent_at = 0.0
        self.not_before = 0.0
        self.done = False


class BatchAccounting:
    """A batch's items in, their ends counted, the batch done or failed, its trouble told."""

    def _submit(self, batch: Batch, items: list[Item]) -> None:
        if batch.error is not None:
            return
        if not self.batches or batch not in self.batches:
            self.batches.append(batch)
            if self.conn is None:
                self.conn_failures = 0
                self.reconnect_at = 0.0
        for item in items:
            key = (item.out.address, item.out.link)
            link = self.links.get(key)
            if link is None:
                link = self.links[key] = AddressLink(*key)
            link.queue.append(item)
            batch.pending += 1
            self.dirty.add(link)

    def _check_batch(self, batch: Batch) -> None:
        if batch.error is None and batch.closed and batch.pending == 0:
            batch.result.seconds = time.monotonic() - batch.started
            if batch.troubles:
                log.info("AMQP batch forwarded after %d failed attempts (%d messages resent) in %.1fs; "
                         "last cause: %s", batch.troubles, batch.result.retried, batch.result.seconds,
                         batch.trouble)
            if batch in self.batches:
                self.batches.remove(batch)
            batch.room.set()
            batch.done.set()

    def _item_done(self, item: Item, how: str) -> None:
        if item.done:
            return
        item.done = True
        b = item.batch
        if b.error is not None:
            return
        r = b.result
        if how == "accepted":
            r.accepted += 1
        elif how == "qos0":
            r.qos0 += 1
        elif how == "expired":
            r.expired += 1
        elif how == "unforwardable":
            r.unforwardable += 1
        b.pending -= 1
        b.finished += 1
        if not b.room.is_set() and b.submitted - b.finished <= WINDOW // 2:
            b.room.set()
        if b.pending == 0:
            self._check_batch(b)

    def _fail_batch(self, batch: Batch, err: ForwardError) -> None:
        if batch.error is not None or batch.done.is_set():
            return
        batch.error = err
        batch.result.seconds = time.monotonic() - batch.started
        if batch in self.batches:
            self.batches.remove(batch)
        log.error("AMQP forwarding failed after %.1fs: %s", batch.result.seconds, err)
        batch.room.set()
        batch.done.set()
        # drop the batch's queued items; in-flight ones are ignored when they end
        for link in self.links.values():
            if any(i.batch is batch for i in link.queue):
                link.queue = collections.deque(i for i in link.queue if i.batch is not batch)
                if not link.queue and not link.inflight:
                    self._went_idle(link)  # a lane waiting for a link may take its place

    def _trouble(self, batch: Batch, cause: str, *, logged: bool = False) -> None:
        """A failed attempt in ``batch``: the first one is logged (one WARNING
        line per batch, however many messages fail; ``logged``: the caller
        logged it already), later ones are counted and go to DEBUG; the
        batch's ``on_trouble`` hears of it (at once for the first, then at most
        once per ``TROUBLE_REPORT_S``), so its report stays fresh while it lasts."""
        batch.troubles += 1
        first = not batch.trouble
        if first:
            batch.trouble_since = time.time()
            if not logged:
                log.warning("AMQP forwarding trouble: %s; resending (each message up to %d times, "
                            "the batch fails after that)", cause, self.cfg.max_retries)
        batch.trouble = cause
        now = time.monotonic()
        if batch.on_trouble is not None and (first or now - batch.trouble_told >= TROUBLE_REPORT_S):
            batch.trouble_told = now
            try:
                batch.on_trouble(cause, batch.trouble_since)
            except Exception as exc:  # noqa: BLE001 - reporting must not stop forwarding
                log.debug("on_trouble callback failed: %s", exc)
