"""The AMQP 1.0 forwarding engine: :class:`Forwarder`.

A Forwarder owns one AMQP connection (python-qpid-proton's reactor
``Container``, run on a daemon thread of its own) and keeps, per target
address, the seed's two sender links: ``qos01`` (QoS 0 and 1) and ``qos2``
(QoS 2 PUBLISH and its PUBREL). Both are attached with snd-settle-mode
*unsettled*; rcv-settle-mode *first*, except the QoS 2 link under a profile
(or ``amqp.qos2_rcv_settle_mode``) that says *second*. Links stay attached
between batches and are detached after ``amqp.link_idle_s`` without traffic.

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
checkpoint). Nothing is dropped silently: expired messages are counted, and
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
``_Engine._send_in_order``), so that a peer handling a session's transfers
in order keeps one MQTT connection's order per topic across QoS levels
(more than [MQTT-4.6.0-5] asks: per topic and QoS level).
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
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote, urlsplit

from proton import Delivery, Handler, Link, SSLDomain, Terminus, symbol
from proton.reactor import ApplicationEvent, Container, EventInjector

from bridge.amqp.mapping import (
    LINK_QOS01,
    LINK_QOS2,
    PROFILES,
    MappingError,
    Outgoing,
    encode_row,
    wire_bytes,
)
from bridge.amqp.unforwardable import ENCODING_FAILURES, NOT_THE_ROWS_FAULT, Unforwardable, unforwardable
from bridge.config import AmqpConfig

__all__ = ["ForwardError", "ForwardResult", "Forwarder", "Unforwardable", "peer_url", "qos2_rcv_second"]

log = logging.getLogger("bridge.amqp")

#: Conditions that no retry can cure: fail at once.
PERMANENT_CONDITIONS = frozenset({
    "amqp:unauthorized-access",
    "amqp:not-implemented",
    "amqp:not-allowed",
    "amqp:invalid-field",
    "amqp:precondition-failed",
})
MAX_BACKOFF_S = 30.0
#: Mapped rows handed to the engine at a time, and the most not yet done.
CHUNK = 1000
WINDOW = 20000
#: Seconds between two ``on_trouble`` calls of one batch (a failed attempt may come per message).
TROUBLE_REPORT_S = 1.0
_TICK_BUSY_S = 0.05
_TICK_IDLE_S = 1.0


class ForwardError(RuntimeError):
    """A batch could not be forwarded: names the address and the outcome."""

    def __init__(self, message: str, *, address: str | None = None, outcome: str | None = None,
                 attempts: int = 0, key: str | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.outcome = outcome
        self.attempts = attempts
        self.key = key


@dataclass
class ForwardResult:
    """Counts for one :meth:`Forwarder.forward` call."""

    rows: int = 0  # rows given
    accepted: int = 0  # QoS 1/2 messages (and PUBRELs) the peer accepted
    qos0: int = 0  # QoS 0 messages handed to their link (not awaited)
    expired: int = 0  # not sent: the Message Expiry Interval had passed
    unroutable: int = 0  # not sent: no topic (logged with its lakegate-id; also unforwardable)
    unforwardable: int = 0  # not sent: mapping or encoding failed (see ``failures``)
    transfers: int = 0  # deliveries sent, resends included
    retried: int = 0  # resends after a failed attempt
    reconnects: int = 0  # connections (re)established during the batch
    seconds: float = 0.0
    #: the unforwardable rows (not a count: left out of :meth:`as_dict`)
    failures: list[Unforwardable] = field(default_factory=list)

    def add(self, other: "ForwardResult") -> None:
        for k, v in self.as_dict().items():
            setattr(self, k, v + getattr(other, k))
        self.failures.extend(other.failures)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "failures"}


def peer_url(config: AmqpConfig) -> tuple[str, str | None, str | None]:
    """(URL without credentials, user, password): the URL's user wins."""
    parts = urlsplit(config.url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    user = unquote(parts.username) if parts.username else (config.username or None)
    password = unquote(parts.password) if parts.password is not None else (config.password or None)
    if parts.username is None and not config.username:
        password = None
    return f"{parts.scheme}://{hostport}", user, password


def qos2_rcv_second(config: AmqpConfig) -> bool:
    """Whether the QoS 2 link attaches with rcv-settle-mode *second*:
    ``amqp.qos2_rcv_settle_mode`` when it names a mode, else the profile's."""
    mode = config.qos2_rcv_settle_mode
    if mode == "profile":
        return bool(PROFILES[config.profile].qos2_rcv_settle_mode)
    return mode == "second"


def _backoff(config: AmqpConfig, n: int) -> float:
    return min(config.retry_backoff_s * (2 ** max(n - 1, 0)), MAX_BACKOFF_S)


def _cond(c: Any) -> str:
    if c is None:
        return "no condition given"
    return f"{c.name}: {c.description}" if c.description else str(c.name)


# ------------------------------------------------------------------ state
class _Batch:
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


class _Item:
    __slots__ = ("out", "batch", "seq", "attempts", "delivery", "sent_at", "not_before", "done")

    def __init__(self, out: Outgoing, batch: _Batch, seq: int) -> None:
        self.out = out
        self.batch = batch
        self.seq = seq
        self.attempts = 0  # failed attempts so far
        self.delivery: Delivery | None = None
        self.sent_at = 0.0
        self.not_before = 0.0
        self.done = False


class _Link:
    __slots__ = ("key", "address", "cls", "sender", "state", "queue", "inflight", "last_used",
                 "not_before", "attach_failures", "attach_started", "last_condition", "name")

    def __init__(self, address: str, cls: str) -> None:
        self.key = (address, cls)
        self.address = address
        self.cls = cls
        self.sender: Any = None
        self.state = "idle"  # idle | attaching | up
        self.queue: collections.deque[_Item] = collections.deque()
        self.inflight: dict[int, _Item] = {}  # item.seq -> item
        self.last_used = time.monotonic()
        self.not_before = 0.0
        self.attach_failures = 0
        self.attach_started = 0.0
        self.last_condition = ""
        self.name = ""


class _Tick(Handler):
    def __init__(self, engine: "_Engine") -> None:
        super().__init__()
        self.engine = engine

    def on_timer_task(self, event: Any) -> None:
        self.engine.tick()


# ------------------------------------------------------------------ engine
class _Engine(Handler):
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
        self.links: dict[tuple[str, str], _Link] = {}
        self.by_name: dict[str, _Link] = {}
        self.dirty: set[_Link] = set()
        self.inflight_order: collections.deque[tuple[float, _Item, Any]] = collections.deque()
        self.batches: list[_Batch] = []
        self.good: set[tuple[str, str]] = set()
        self.careful = False
        self.link_seq = itertools.count(1)
        self.idle_since = time.monotonic()
        self.stopping = False
        self.tick_task: Any = None
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
        self.tick_task = self.container.schedule(_TICK_BUSY_S if busy else _TICK_IDLE_S, _Tick(self))

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
        self.injector.close()
        if self.conn is None:
            self.container.stop()

    # ---------------------------------------------------------- batches
    def _submit(self, batch: _Batch, items: list[_Item]) -> None:
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
                link = self.links[key] = _Link(*key)
            link.queue.append(item)
            batch.pending += 1
            self.dirty.add(link)

    def _check_batch(self, batch: _Batch) -> None:
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

    def _item_done(self, item: _Item, how: str) -> None:
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

    def _fail_batch(self, batch: _Batch, err: ForwardError) -> None:
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

    def _trouble(self, batch: _Batch, cause: str, *, logged: bool = False) -> None:
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

    # ---------------------------------------------------------- connection
    def _connect(self) -> None:
        kwargs: dict[str, Any] = dict(
            handler=self,
            reconnect=False,
            heartbeat=self.cfg.idle_timeout_s or None,
            container_id=self.container_id,
            allowed_mechs=self.cfg.sasl_mechanisms,
            allow_insecure_mechs=True,
            properties={symbol("product"): "lakegate"},
        )
        if self.user is not None:
            kwargs["user"] = self.user
            if self.password is not None:
                kwargs["password"] = self.password
        if self.url.startswith("amqps://"):
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if self.cfg.tls_ca_file:
                domain.set_trusted_ca_db(self.cfg.tls_ca_file)
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, self.cfg.tls_ca_file or None)
            kwargs["ssl_domain"] = domain
        log.info("AMQP connecting to %s (attempt %d)", self.url, self.conn_failures + 1)
        self.conn = self.container.connect(url=self.url, **kwargs)
        self.conn_up = False
        self.conn_started = time.monotonic()
        self.conn_condition = ""
        self.session = None

    def on_connection_remote_open(self, event: Any) -> None:
        if event.connection != self.conn:
            return
        self.conn_up = True
        self.progress = False
        self.opened += 1
        if self.opened > 1:
            for b in self.batches:
                b.result.reconnects += 1
        props = event.connection.remote_properties or {}
        self.peer_info = " ".join(str(props.get(symbol(k), "")) for k in ("product", "version")).strip()
        log.info("AMQP connected to %s (%s); idle time-out ours %.0fs, peer's %.0fs",
                 self.url, self.peer_info or "peer", self.cfg.idle_timeout_s,
                 event.transport.remote_idle_timeout or 0.0)
        self.dirty.update(self.links.values())

    def on_connection_remote_close(self, event: Any) -> None:
        if event.connection == self.conn:
            self.conn_condition = _cond(event.connection.remote_condition)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        if event.connection == self.conn and event.transport.condition is not None and not self.conn_condition:
            self.conn_condition = _cond(event.transport.condition)

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is None or event.connection != self.conn:
            return
        self._connection_lost(self.conn_condition or "connection closed")

    def _connection_lost(self, condition: str) -> None:
        was_up = self.conn_up
        self.conn = None
        self.conn_up = False
        self.session = None
        if self.stopping:
            self.container.stop()
            return
        # each batch logs its first trouble once (WARNING), before its messages fail
        verb = "lost" if was_up else "failed"
        for b in list(self.batches):
            self._trouble(b, f"connection to {self.url} {verb}: {condition}")
        requeue: dict[_Link, list[_Item]] = {}
        for link in list(self.links.values()):
            self._drop_sender(link)
            if link.inflight:
                requeue[link] = list(link.inflight.values())
                link.inflight.clear()
        for link, items in requeue.items():
            for item in items:
                self._fail_item(item, link, f"connection lost with no disposition ({condition})", requeue=False)
            self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        if not self.batches:
            if was_up:
                log.info("AMQP connection to %s closed: %s", self.url, condition)
            return
        if was_up and self.progress:
            # it worked for a while: try again at once, the count starts over
            self.conn_failures = 0
            self.reconnect_at = time.monotonic()
            log.info("AMQP connection to %s lost: %s; reconnecting", self.url, condition)
            return
        # refused, or lost before anything was accepted: counts as a failed attempt
        self.conn_failures += 1
        permanent = ":".join(condition.split(":", 2)[:2]) in PERMANENT_CONDITIONS
        if permanent or self.conn_failures > self.cfg.max_retries:
            err = ForwardError(
                f"AMQP connection to {self.url} failed: {condition} "
                f"({self.conn_failures} attempt{'s' if self.conn_failures != 1 else ''})",
                address=self.url, outcome=condition, attempts=self.conn_failures)
            for b in list(self.batches):
                self._fail_batch(b, err)
            return
        delay = _backoff(self.cfg, self.conn_failures)
        self.reconnect_at = time.monotonic() + delay
        log.info("AMQP connection to %s failed: %s; retry %d/%d in %.2fs",
                 self.url, condition, self.conn_failures, self.cfg.max_retries, delay)

    def _ensure_session(self) -> Any:
        if self.session is None:
            self.session = self.conn.session()
            self.session.open()
        return self.session

    def on_session_remote_close(self, event: Any) -> None:
        ssn = event.session
        condition = _cond(ssn.remote_condition)
        ssn.close()
        if self.stopping or self.session is None or ssn != self.session:
            return
        self.session = None
        members = [link for link in self.links.values() if link.sender is not None]
        attaching = [link for link in members if link.state == "attaching"]
        suspects = [link for link in attaching if link.key not in self.good] or attaching
        log.warning("AMQP session ended by the peer: %s (%d links, %d attaching)",
                    condition, len(members), len(suspects))
        for link in members:
            items = list(link.inflight.values())
            link.inflight.clear()
            self._drop_sender(link)
            if link in suspects:
                self._attach_failed(link, condition)
            for item in items:
                if suspects:  # the attaching link is to blame: resend, uncounted
                    item.delivery = None
                else:
                    self._fail_item(item, link, f"session ended: {condition}", requeue=False)
            self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        if len(suspects) > 1:
            self.careful = True
        self.dirty.update(self.links.values())

    # ---------------------------------------------------------- links
    def _attach(self, link: _Link) -> None:
        ssn = self._ensure_session()
        link.name = f"lakegate-{link.cls}-{next(self.link_seq)}:{link.address}"
        s = ssn.sender(link.name)
        s.target.address = link.address
        s.source.address = self.container_id
        s.snd_settle_mode = Link.SND_UNSETTLED
        s.rcv_settle_mode = Link.RCV_SECOND if (link.cls == LINK_QOS2 and self.qos2_rcv) else Link.RCV_FIRST
        s.open()
        link.sender = s
        link.state = "attaching"
        link.attach_started = time.monotonic()
        self.by_name[link.name] = link

    def _drop_sender(self, link: _Link) -> None:
        if link.name:
            self.by_name.pop(link.name, None)
        link.sender = None
        link.state = "idle"
        link.name = ""

    def on_link_remote_open(self, event: Any) -> None:
        link = self.by_name.get(event.link.name)
        if link is None or link.sender is None:
            return
        s = event.link
        if s.remote_target.type == Terminus.UNSPECIFIED:
            # refused at link level (a null target): a detach with the reason follows
            return
        link.state = "up"
        link.attach_failures = 0
        self.good.add(link.key)
        if s.rcv_settle_mode != s.remote_rcv_settle_mode:
            log.warning("AMQP peer attached %s link to %r with rcv-settle-mode %s, not %s",
                        link.cls, link.address, _mode(s.remote_rcv_settle_mode), _mode(s.rcv_settle_mode))
        if self.careful and not any(lk.state == "attaching" for lk in self.links.values()) \
                and all(lk.key in self.good or not lk.queue for lk in self.links.values()):
            self.careful = False
        self.dirty.add(link)

    def on_link_remote_close(self, event: Any) -> None:
        self._link_ended(event)

    def on_link_remote_detach(self, event: Any) -> None:
        self._link_ended(event)

    def _link_ended(self, event: Any) -> None:
        s = event.link
        link = self.by_name.get(s.name)
        s.close()
        if link is None:
            return
        condition = _cond(s.remote_condition)
        was_attaching = link.state == "attaching"
        items = list(link.inflight.values())
        link.inflight.clear()
        self._drop_sender(link)
        if was_attaching:
            self._attach_failed(link, condition)
        else:
            log.warning("AMQP peer detached %s link to %r: %s", link.cls, link.address, condition)
        for item in items:
            self._fail_item(item, link, f"link detached by the peer: {condition}", requeue=False)
        self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        self.dirty.add(link)

    def _attach_failed(self, link: _Link, condition: str) -> None:
        link.attach_failures += 1
        link.last_condition = condition
        name = condition.split(":", 2)
        cname = ":".join(name[:2]) if len(name) >= 2 else condition
        hint = ""
        if "rcv-settle-mode" in condition or "rcv_settle_mode" in condition:
            hint = ' (this peer cannot do rcv-settle-mode second: set amqp.qos2_rcv_settle_mode = "first")'
        if cname in PERMANENT_CONDITIONS or link.attach_failures > self.cfg.max_retries:
            err = ForwardError(
                f"AMQP peer refused the {link.cls} link to address {link.address!r}: {condition}{hint} "
                f"({link.attach_failures} attempt{'s' if link.attach_failures != 1 else ''})",
                address=link.address, outcome=condition, attempts=link.attach_failures)
            for b in {i.batch for i in link.queue} | {i.batch for i in link.inflight.values()}:
                self._fail_batch(b, err)
            return
        delay = _backoff(self.cfg, link.attach_failures)
        link.not_before = time.monotonic() + delay
        for b in {i.batch for i in link.queue}:
            self._trouble(b, f"the peer refused the {link.cls} link to {link.address!r}: {condition}")
        log.info("AMQP peer refused the %s link to %r: %s; retry %d/%d in %.2fs",
                 link.cls, link.address, condition, link.attach_failures, self.cfg.max_retries, delay)

    def on_link_flow(self, event: Any) -> None:
        link = self.by_name.get(event.link.name)
        if link is not None:
            self.dirty.add(link)
            self.pump()

    # ---------------------------------------------------------- deliveries
    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        lnk = dlv.link
        if not lnk.is_sender or not dlv.updated:
            return
        state = dlv.remote_state
        terminal = state in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED, Delivery.MODIFIED)
        if not terminal and not dlv.settled:
            return  # e.g. RECEIVED: not an outcome
        item = getattr(dlv, "lg_item", None)
        outcome = "accepted" if state == Delivery.ACCEPTED else _outcome(dlv)
        current = item is not None and item.delivery is not None and item.delivery == dlv
        link = self.by_name.get(lnk.name)
        dlv.settle()  # first: frees it; second: lets the receiver settle
        if not current:
            if item is None and state != Delivery.ACCEPTED:
                log.debug("AMQP QoS 0 message not accepted: %s", outcome)
            return
        item.delivery = None
        if link is not None:
            link.inflight.pop(item.seq, None)
            link.last_used = time.monotonic()
        if item.batch.error is not None:
            return
        if state == Delivery.ACCEPTED:
            self.progress = True
            self._item_done(item, "accepted")
        else:
            self._fail_item(item, link, outcome)
        self.pump()

    def _fail_item(self, item: _Item, link: _Link | None, outcome: str, requeue: bool = True) -> None:
        if item.done or item.batch.error is not None:
            return
        item.attempts += 1
        if item.delivery is not None:
            item.delivery = None
        if item.attempts > self.cfg.max_retries:
            out = item.out
            self._fail_batch(item.batch, ForwardError(
                f"AMQP peer did not accept {out.kind} {out.key} sent to address {out.address!r}: "
                f"{outcome} ({item.attempts} attempts)",
                address=out.address, outcome=outcome, attempts=item.attempts, key=out.key))
            return
        delay = _backoff(self.cfg, item.attempts)
        item.not_before = time.monotonic() + delay
        log.debug("AMQP %s to %r: %s; retry %d/%d in %.2fs",
                  item.out.key, item.out.address, outcome, item.attempts, self.cfg.max_retries, delay)
        self._trouble(item.batch, f"{outcome} (address {item.out.address!r})")
        if requeue and link is not None:
            self._requeue(link, [item])

    def _requeue(self, link: _Link, items: list[_Item]) -> None:
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
        """Attach, connect and send whatever can go now."""
        if self.stopping or not self.dirty and (self.conn is not None or not self.batches):
            return
        now = time.monotonic()
        if self.conn is None:
            if self.batches and now >= self.reconnect_at:
                self._connect()
            else:
                return
        dirty, self.dirty = self.dirty, set()
        attaching = -1
        for link in dirty:
            if not link.queue:
                continue
            if link.state == "idle":
                if now < link.not_before:
                    continue
                if self.careful and link.key not in self.good:
                    if attaching < 0:
                        attaching = sum(1 for lk in self.links.values() if lk.state == "attaching")
                    if attaching:
                        continue
                    attaching += 1
                self._attach(link)
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
        while links:
            link = links[0] if len(links) == 1 or links[0].queue[0].seq < links[1].queue[0].seq else links[1]
            item = link.queue[0]
            if link.state != "up" or link.sender.credit <= 0 or item.not_before > now:
                return
            link.queue.popleft()
            self._transfer(link, item, now, wall)
            if self._head(link) is None:
                links.remove(link)

    @staticmethod
    def _head(link: _Link) -> "_Item | None":
        """The link's next message to send (dropping those already done or of a failed batch)."""
        q = link.queue
        while q:
            item = q[0]
            if not item.done and item.batch.error is None:
                return item
            q.popleft()
        return None

    def _transfer(self, link: _Link, item: _Item, now: float, wall: float) -> None:
        out = item.out
        try:
            data = wire_bytes(out, wall)
        except ENCODING_FAILURES as exc:  # the row's fault: set aside, the batch goes on
            if isinstance(exc, NOT_THE_ROWS_FAULT):
                raise
            item.batch.result.failures.append(unforwardable(out, exc))
            self._item_done(item, "unforwardable")
            return
        if data is None:
            self._item_done(item, "expired")
            return
        s = link.sender
        dlv = s.delivery(str(item.seq))
        s.stream(data)
        s.advance()
        r = item.batch.result
        r.transfers += 1
        if item.attempts:
            r.retried += 1
        link.last_used = now
        if out.qos == 0:
            self._item_done(item, "qos0")
            return
        dlv.lg_item = item
        item.delivery = dlv
        item.sent_at = now
        link.inflight[item.seq] = item
        self.inflight_order.append((now, item, dlv))

    def tick(self) -> None:
        try:
            now = time.monotonic()
            timeout = self.cfg.disposition_timeout_s
            # deliveries without a disposition
            order = self.inflight_order
            while order:
                sent_at, item, dlv = order[0]
                if item.delivery is None or item.delivery != dlv or item.done:
                    order.popleft()
                    continue
                if now - sent_at < timeout:
                    break
                order.popleft()
                link = self.by_name.get(dlv.link.name)
                dlv.settle()  # abandon: a later disposition is ignored
                if link is not None:
                    link.inflight.pop(item.seq, None)
                self._fail_item(item, link, f"no disposition within {timeout:g}s")
            # connecting or attaching for too long
            if self.conn is not None and not self.conn_up and now - self.conn_started > timeout:
                self.conn_condition = f"no open from the peer within {timeout:g}s"
                t = self.conn.transport
                if t is not None:
                    t.close_tail()
                    t.close_head()
            for link in list(self.links.values()):
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
                    "snd_settle_mode": _mode_snd(lk.sender.snd_settle_mode) if lk.sender else None,
                    "rcv_settle_mode": _mode(lk.sender.rcv_settle_mode) if lk.sender else None,
                    "remote_rcv_settle_mode": _mode(lk.sender.remote_rcv_settle_mode)
                    if lk.sender is not None and lk.state == "up" else None,
                }
                for lk in self.links.values()
            ],
        }


def _mode(m: int) -> str:
    return "second" if m == Link.RCV_SECOND else "first"


def _mode_snd(m: int) -> str:
    return {Link.SND_UNSETTLED: "unsettled", Link.SND_SETTLED: "settled"}.get(m, "mixed")


def _outcome(dlv: Any) -> str:
    state = dlv.remote_state
    if state == Delivery.REJECTED:
        c = dlv.remote.condition
        return f"rejected ({_cond(c)})" if c is not None else "rejected"
    if state == Delivery.RELEASED:
        return "released"
    if state == Delivery.MODIFIED:
        r = dlv.remote
        return f"modified (delivery-failed={str(bool(r.failed)).lower()}, undeliverable-here={str(bool(r.undeliverable)).lower()})"
    if state == Delivery.ACCEPTED:
        return "accepted"
    return "settled without an outcome"


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
        self._engine = _Engine(config, cid)
        self._container = Container(self._engine)
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
            c.timeout = _TICK_IDLE_S
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
                    out = encode_row(row, profile, cfg.address_template, chunk_now)
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
        batch = _Batch()
        batch.on_trouble = on_trouble
        chunk: list[_Item] = []
        try:
            for out in items:
                chunk.append(_Item(out, batch, next(self._seq)))
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

    def _submit(self, batch: _Batch, chunk: list[_Item]) -> None:
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

    def _wait(self, batch: _Batch) -> None:
        self._wait_event(batch.done)
