"""The AMQP 1.0 forwarding engine: :class:`Forwarder`.

A Forwarder owns one AMQP connection (python-qpid-proton's reactor
``Container``, run on a daemon thread of its own) and keeps, per target
address, the seed's two sender links: ``qos01`` (QoS 0 and 1) and ``qos2``
(QoS 2 PUBLISH and its PUBREL). Both are attached with snd-settle-mode
*unsettled*; rcv-settle-mode *first*, except the QoS 2 link under a profile
(or ``amqp.qos2_rcv_settle_mode``) that says *second*. Links stay attached
between batches and are detached after ``amqp.link_idle_s`` without traffic.
At most ``amqp.max_links`` are open: a new address takes the place of the
least recently used idle link, or waits for one; a peer offering
``ANONYMOUS-RELAY`` carries every address on one link per class instead
(``amqp.anonymous_relay``; the ``to`` property on it: :mod:`bridge.amqp.links`).

:meth:`Forwarder.forward` is synchronous: it maps the rows, pipelines them
(as many unsettled deliveries in flight as the peer's link credit allows),
and returns when every QoS 1 and 2 message has been *accepted* and every
QoS 0 message has been handed to its link (QoS 0 is at most once: never
awaited, never resent). Any other outcome -- rejected, released, modified
(whatever its flags), no disposition within ``amqp.disposition_timeout_s``,
a link or session the peer ended, a lost connection -- sends the message
again after ``amqp.retry_backoff_s * 2**(n-1)`` seconds (capped at 30 s),
up to ``amqp.max_retries`` times; then :class:`ForwardError` names the
address and the outcome, and the batch fails (Spark runs it again from the
checkpoint) -- unless every attempt was rejected for the message's own sake
(``amqp:decode-error``, ``amqp:link:message-size-exceeded``): that message is
set aside as ``LG-amqp-rejected``, like one over its link's max-message-size,
which is not sent. Nothing is dropped silently: expired messages are counted, and
a row no message can be made of (no topic, a value no AMQP field holds) is
set aside as unforwardable (:mod:`bridge.amqp.unforwardable`): counted,
logged and returned in ``ForwardResult.failures``, never retried.

Logs: a batch's first failed attempt is logged once, as a WARNING with its
cause, however many messages it concerns; later attempts go to INFO
(connections, links) or DEBUG (messages); a batch that succeeds after
trouble logs one INFO summary, one that fails one ERROR line. A peer that
goes silent (TCP open, no bytes) is noticed by the AMQP idle time-out
(``amqp.idle_timeout_s``: the peer must send something, heartbeats
included, in that time; proton declares the connection dead after at most
twice that) and handled as a lost connection.

Order: per address, messages go out in the order given (the sink gives
capture order) across its two links, QoS 0/1 and QoS 2 (see
``_send_in_order`` in :mod:`bridge.amqp.deliveries`), so that a peer
handling a session's transfers in order keeps one MQTT connection's order
per topic across QoS levels (more than [MQTT-4.6.0-5] asks: per topic and QoS level).
Different addresses do not wait for each other. A message sent again goes
out before anything not yet sent to its address, but after what was already
in flight when it failed.

RabbitMQ 3.x refuses an unusable address by ending the whole *session*
(``amqp:not-found``, ``amqp:invalid-field``), which takes the other links
with it. The engine then begins a new session, attaches the links that were
fine again (their messages are resent, not counted as attempts), blames the
links that were attaching, and attaches those one at a time until each
either attaches or fails the batch with the peer's error.

Credentials: the URL given to proton never carries them (proton logs the
URL); logs show addresses, counts and sizes only.

Modules, along the data flow: this one (:class:`Forwarder`, the API: maps
rows, hands them over in chunks, waits), :mod:`bridge.amqp.results`
(``ForwardResult``, ``ForwardError``), :mod:`bridge.amqp.engine` (the proton
handler on the Forwarder's thread, which composes
:mod:`bridge.amqp.batches`, :mod:`bridge.amqp.connection`,
:mod:`bridge.amqp.links` and :mod:`bridge.amqp.deliveries`) and
:mod:`bridge.amqp.retry` (permanent conditions, backoff, how outcomes read).
Every name imported from here before the split still is.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from proton.reactor import ApplicationEvent

from bridge.amqp.reactor import container

from bridge.amqp.batches import CHUNK, TROUBLE_REPORT_S, WINDOW, Batch, Item  # noqa: F401 - TROUBLE_REPORT_S re-exported
from bridge.amqp.connection import peer_url
from bridge.amqp.engine import TICK_IDLE_S, Engine
from bridge.amqp.links import qos2_rcv_second
from bridge.amqp.mapping import PROFILES, MappingError, Outgoing
from bridge.amqp.results import ForwardError, ForwardResult
from bridge.amqp.retry import MAX_BACKOFF_S, PERMANENT_CONDITIONS  # noqa: F401 - re-exported, as before the split
from bridge.amqp.unforwardable import ENCODING_FAILURES, NOT_THE_ROWS_FAULT, Unforwardable, unforwardable
from bridge.amqp.wire import encode_row
from bridge.config import AmqpConfig

__all__ = ["ForwardError", "ForwardResult", "Forwarder", "Unforwardable", "peer_url", "qos2_rcv_second"]

log = logging.getLogger("bridge.amqp")


# ------------------------------------------------------------------ the API
_ids = itertools.count(1)


class Forwarder:
    """Forwards mapped rows over one AMQP connection; see the module docstring.

    Thread-safe to call :meth:`forward` from any thread; the proton work runs
    on the Forwarder's own daemon thread. Runs on executors (the sink keeps
    one per Python worker process) or on the driver. Not picklable: build it
    where it is used, from an :class:`AmqpConfig` (which is).
    """

    def __init__(self, config: AmqpConfig, *, name: str | None = None) -> None:
        if not config.url:
            raise ValueError("amqp.url is empty: forwarding is off")
        if config.profile not in PROFILES:
            raise ValueError(f"unknown amqp.profile {config.profile!r}")
        self.config = config
        cid = name or f"{config.container_id}/{socket.gethostname()}/{os.getpid()}/{next(_ids)}"
        self.container_id = cid
        self._engine = Engine(config, cid)
        self._container = container(self._engine, fast_delivery=self._engine.fast_delivery)
        self._container.container_id = cid
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._broken: BaseException | None = None
        self._closed = False

    # ---------------------------------------------------------- lifecycle
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._closed:
                raise ForwardError("forwarder closed", outcome="closed")
            if self._broken is not None:
                raise ForwardError(f"forwarder stopped after an internal error: {self._broken!r}",
                                   outcome="internal error")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"amqp-{self.container_id}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        c = self._container
        try:
            c.timeout = TICK_IDLE_S
            c.start()
            while c.process():
                pass
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting batch
            log.exception("AMQP forwarder thread failed")
            self._broken = exc
            for b in list(self._engine.batches):
                b.error = ForwardError(f"forwarder internal error: {exc!r}", outcome="internal error")
                b.room.set()
                b.done.set()

    def _command(self, *cmd: Any) -> None:
        self._engine.commands.put(cmd)
        self._engine.injector.trigger(ApplicationEvent("lg_wakeup"))

    def close(self, timeout: float = 5.0) -> None:
        """Detach the links, close the connection and stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None and thread.is_alive():
            self._command("stop")
            thread.join(timeout)

    def __enter__(self) -> "Forwarder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return not self._closed and self._broken is None

    def link_stats(self) -> dict[str, Any]:
        """The engine's link counts (open, peak, attaches, detaches, evictions,
        waiting, lanes, max_links, relay), read without a call into its thread:
        cheap, for metrics and benchmarks (:meth:`Engine.link_stats`)."""
        return self._engine.link_stats()

    def reset_peak(self) -> None:
        """Start the ``peak`` of :meth:`link_stats` over from the links open now."""
        self._engine.peak_links = self._engine.open_links

    def describe(self, timeout: float = 5.0) -> dict[str, Any]:
        """Connection and link state (address, class, settle modes), for tests and logs."""
        self._ensure_thread()
        box: list[Any] = []
        ev = threading.Event()
        self._command("call", self._engine.describe, box, ev)
        if not ev.wait(timeout):
            raise TimeoutError("forwarder did not answer")
        return box[0]

    # ---------------------------------------------------------- forwarding
    def forward(self, rows: Iterable[Mapping[str, Any]], *, now: float | None = None,
                on_trouble: Callable[[str, float], None] | None = None) -> ForwardResult:
        """Forward FORWARD_DDL rows (dicts), in the order given. Blocks until done.

        Returns the counts; raises :class:`ForwardError` when a message could
        not be delivered within the retry bound. ``now`` (epoch seconds)
        fixes the clock used for expiry at mapping time (default: the time
        each chunk is mapped); the ttl is recomputed at each send.
        ``on_trouble(cause, since)`` is called, on the Forwarder's thread, at
        the batch's first failed attempt and then at later ones, at most once
        per ``TROUBLE_REPORT_S``; ``since``: epoch seconds of the first.
        """
        cfg = self.config
        profile = PROFILES[cfg.profile]
        pre = ForwardResult()

        def mapped() -> Iterable[Outgoing]:
            chunk_now = now
            for i, row in enumerate(rows):
                if i % CHUNK == 0 and now is None:
                    chunk_now = time.time()
                pre.rows += 1
                try:
                    out = encode_row(row, profile, cfg.address_template, chunk_now, cfg.address_refuse,
                                     cfg.property_refuse)
                except ENCODING_FAILURES as exc:
                    if isinstance(exc, NOT_THE_ROWS_FAULT):
                        raise
                    if isinstance(exc, MappingError):
                        pre.unroutable += 1
                    pre.unforwardable += 1
                    pre.failures.append(unforwardable(row, exc))
                    continue
                if out.expired:
                    pre.expired += 1
                    continue
                yield out

        result = self.forward_mapped(mapped(), on_trouble=on_trouble)
        result.rows += pre.rows
        result.unroutable += pre.unroutable
        result.unforwardable += pre.unforwardable
        result.failures[:0] = pre.failures
        result.expired += pre.expired
        return result

    def forward_mapped(self, items: Iterable[Outgoing], *,
                       on_trouble: Callable[[str, float], None] | None = None) -> ForwardResult:
        """Forward already mapped messages; see :meth:`forward`."""
        self._ensure_thread()
        batch = Batch()
        batch.on_trouble = on_trouble
        chunk: list[Item] = []
        try:
            for out in items:
                chunk.append(Item(out, batch, next(self._seq)))
                if len(chunk) >= CHUNK:
                    self._submit(batch, chunk)
                    chunk = []
            if chunk:
                self._submit(batch, chunk)
        finally:
            self._command("close_batch", batch)
        self._wait(batch)
        if batch.error is not None:
            raise batch.error
        return batch.result

    def _submit(self, batch: Batch, chunk: list[Item]) -> None:
        while batch.submitted - batch.finished >= WINDOW:
            batch.room.clear()
            if batch.submitted - batch.finished < WINDOW:  # the engine caught up meanwhile
                break
            self._wait_event(batch.room)
        if batch.error is not None:
            raise batch.error
        batch.submitted += len(chunk)
        self._command("submit", batch, chunk)

    def _wait_event(self, ev: threading.Event) -> None:
        while not ev.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                raise ForwardError("forwarder thread stopped", outcome="internal error")

    def _wait(self, batch: Batch) -> None:
        self._wait_event(batch.done)
