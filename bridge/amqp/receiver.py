"""Receiving from the AMQP network: :class:`DownlinkReceiver`, the edge's
receiver links (used by :mod:`bridge.edge.downlink`).

One proton ``Container`` on a thread of its own, one connection to
``amqp.url`` (the forward direction's :func:`~bridge.amqp.connection.peer_url`
and settings), receiver links attached and detached on request
(:meth:`attach`, :meth:`detach`; any thread). Each message received is
mapped with :func:`bridge.amqp.reverse.map_message` and handed to
``on_message(address, result, token)`` on the receiver's thread, where
``result`` is a :class:`~bridge.amqp.reverse.Downlink`, ``OWN`` (lakegate
forwarded it itself) or a :class:`~bridge.amqp.reverse.ReverseMappingError`;
the caller later settles ``token`` with one outcome (:meth:`settle`, any
thread):

* ``accepted`` -- the MQTT side has it (the seed: once the client's
  PUBACK / PUBREC / PUBCOMP came);
* ``released`` -- not delivered, the peer may deliver it again (a client
  that went away without acknowledging: the peer redelivers);
* ``modified`` -- delivery failed (``delivery-failed``), redeliver, counted
  (RabbitMQ 3.x's AMQP 1.0 plugin does not know this outcome and ends the
  session over it: use ``released`` there);
* ``rejected`` -- never deliverable; ``condition`` and ``description`` say
  why (a message without a usable topic: ``amqp:decode-error``).

Credit: each link is given ``credit`` (its window) at attach and one more
per delivery settled, so at most ``credit`` unsettled messages per link are
ever held (no unbounded buffering behind a slow MQTT client).

Detach: a link detached while deliveries on it are still unsettled gets no
more credit, but stays attached until the caller settled them (at most
``_DETACH_GRACE_S``), then goes: a disposition cannot follow the link's
detach (proton writes none), so a release the caller sends just after
:meth:`detach` (a client's clean session ended, its outbox releases what the
link left) would never reach the peer, which would hold the message
unsettled until the connection ends. What arrives on such a link in the
meantime is released at once.

Faults: a lost connection is reconnected with backoff, at most
``retry.RECONNECT_MAX_S`` between attempts, and every link
attached again; a link the peer refuses (or whose session it ends) is
attached again after a backoff of its own, logged each time; what was unsettled on the lost connection is the peer's to
redeliver (nothing was accepted that was not delivered). Tokens of a lost
connection are stale: settling one does nothing.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable

from proton import Condition, Delivery, Endpoint, Handler, symbol
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector

from bridge.amqp.reactor import container

from bridge.amqp.connection import peer_url
from bridge.amqp.retry import RECONNECT_MAX_S, backoff, condition_text, reconnect_backoff
from bridge.amqp.reverse import ReverseMappingError, map_message
from bridge.config import AmqpConfig
from bridge.peers import PEERS

__all__ = ["DownlinkReceiver", "OUTCOMES"]

log = logging.getLogger("bridge.amqp")

OUTCOMES = ("accepted", "released", "modified", "rejected")
_TICK_S = 0.5
#: how long a detached link waits for its unsettled deliveries to be settled
_DETACH_GRACE_S = 10.0
#: how long a stop waits for the peer to answer the connection's close
STOP_GRACE_S = 1.0


class _Token:
    """One received delivery, as the caller sees it."""

    __slots__ = ("delivery", "link", "epoch", "address")

    def __init__(self, delivery, link, epoch: int, address: str) -> None:
        self.delivery = delivery
        self.link = link
        self.epoch = epoch
        self.address = address


class DownlinkReceiver(MessagingHandler):
    """See the module docstring. ``on_message`` runs on the receiver's
    thread: keep it short (hand the message to the edge's loop)."""

    def __init__(self, config: AmqpConfig,
                 on_message: Callable[[str, Any, _Token], None],
                 container_id: str = "lakegate-downlink") -> None:
        # no prefetch (credit is ours: the window), nothing settled for us
        super().__init__(prefetch=0, auto_accept=False)
        self.cfg = config
        self.deliver = on_message
        self.url, self.user, self.password = peer_url(config)
        self.container_id = container_id
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.injector = EventInjector()
        self.container: Container | None = None
        self.thread: threading.Thread | None = None
        self.conn: Any = None
        self.conn_up = False
        self.failures = 0
        self.epoch = 0
        self.reconnect_at = 0.0
        #: address -> (credit, durable), every link wanted (attached again after a reconnect)
        self.wanted: dict[str, tuple[int, bool]] = {}
        self.links: dict[str, Any] = {}
        #: (link, deadline): detached by the caller, waiting for what it left
        #: unsettled to be settled before it goes (the module docstring)
        self.closing: list[tuple[Any, float]] = []
        self.stopping = False
        self._stopped = False
        self.names = itertools.count(1)
        self.stats = {"received": 0, "accepted": 0, "released": 0, "modified": 0, "rejected": 0,
                      "own": 0, "reconnects": 0, "leftover_queues": 0, "refused": 0}
        #: address -> (refusals in a row, when to attach again)
        self.refused: dict[str, tuple[int, float]] = {}
        self.ready = threading.Event()
        self._woken = False

    # ------------------------------------------------------------ any thread
    def start(self) -> DownlinkReceiver:
        self.thread = threading.Thread(target=self._run, name="amqp-downlink", daemon=True)
        self.thread.start()
        return self

    def _command(self, *cmd) -> None:
        self.commands.put(cmd)
        if not self._woken:  # one wake-up for a burst of commands (settlements mostly)
            self._woken = True
            self.injector.trigger(ApplicationEvent("lg_downlink_wake"))

    def attach(self, address: str, credit: int = 20, durable: bool = False) -> None:
        """Receive from ``address`` with ``credit`` unsettled at most.
        ``durable``: a durable terminus (RabbitMQ 3.x declares a
        ``/queue/<name>`` durable, so it keeps what arrives while no one
        receives, across its own restarts: a persistent MQTT session's
        address)."""
        self._command("attach", address, credit, durable)

    def detach(self, address: str) -> None:
        self._command("detach", address)

    def settle(self, token: _Token, outcome: str, condition: str | None = None,
               description: str | None = None) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        self._command("settle", token, outcome, condition, description)

    def stop(self, timeout: float = 10.0) -> None:
        self._command("stop")
        if self.thread is not None:
            self.thread.join(timeout)

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        self.container = container(self)
        try:
            self.container.run()
        except Exception:  # a bug must not pass silently
            log.exception("AMQP downlink receiver stopped unexpectedly")

    def on_start(self, event: Any) -> None:
        event.container.selectable(self.injector)
        self._connect()
        self.container.schedule(_TICK_S, _Tick(self))

    def _connect(self) -> None:
        kwargs: dict[str, Any] = dict(handler=self, reconnect=False,
                                      heartbeat=self.cfg.idle_timeout_s or None,
                                      container_id=self.container_id,
                                      allowed_mechs=self.cfg.sasl_mechanisms,
                                      allow_insecure_mechs=True,
                                      properties={symbol("product"): "lakegate"})
        if self.user is not None:
            kwargs["user"] = self.user
            if self.password is not None:
                kwargs["password"] = self.password
        self.epoch += 1
        self.conn = self.container.connect(url=self.url, **kwargs)
        self.conn_up = False
        self.links.clear()
        self.closing.clear()

    def on_connection_opened(self, event: Any) -> None:
        self.conn_up = True
        if self.failures:
            log.info("AMQP downlink: connected again to %s after %d failed attempts", self.url,
                     self.failures)
        self.failures = 0
        for address, (credit, durable) in self.wanted.items():
            self._open_link(address, credit, durable)
        self.ready.set()

    def _warn_leftover_queue(self, link: Any) -> None:
        """RabbitMQ 3.x gives each receiver on ``/topic/...`` or
        ``/exchange/...`` a server-named queue and leaves it behind when the
        link ends, still bound and filling (rabbitmq-server#2588): one more
        for every connection of this receiver. Said at each such link, with
        the remedy."""
        address = link.source.address or ""
        if not address.startswith(("/topic/", "/exchange/")):
            return
        props = link.connection.remote_properties or {}
        product = str(props.get(symbol("product"), ""))
        version = str(props.get(symbol("version"), ""))
        if product != "RabbitMQ" or not version[:1].isdigit() or int(version.split(".")[0]) >= 4:
            return
        self.stats["leftover_queues"] += 1
        log.warning("AMQP downlink: RabbitMQ %s leaves the queue of the receiver on %s behind when "
                    "the link ends, still bound (rabbitmq-server#2588): %d made by this receiver "
                    "since it started. Expire them with a policy (rabbitmqctl set_policy --apply-to queues "
                    "lakegate-amqp1-leftovers '^amq\\.gen-' '{\"expires\":60000}') or receive from a "
                    "queue of your own (docs/amqp-to-mqtt.md)", version, address,
                    self.stats["leftover_queues"])

    def _open_link(self, address: str, credit: int, durable: bool) -> None:
        from proton.reactor import DurableSubscription

        # a session per link: RabbitMQ 3.x keeps what a detached link left
        # unsettled until the link's session ends (one AMQP 0-9-1 channel
        # per session), so the session ends with the link and the peer
        # delivers it again to the next link (measured: with one shared
        # session the message stayed unacknowledged and never came again)
        ssn = self.conn.session()
        ssn.open()
        link = self.container.create_receiver(ssn, address, name=f"lakegate-dl-{next(self.names)}",
                                              handler=self,
                                              options=DurableSubscription() if durable else None)
        link.flow(credit)
        self.links[address] = link

    def on_link_opened(self, event: Any) -> None:
        log.info("AMQP downlink: receiving from %s", event.link.source.address)
        self.refused.pop(event.link.source.address, None)
        self._warn_leftover_queue(event.link)

    def on_link_error(self, event: Any) -> None:  # (MessagingHandler's name for a refused link)
        self._refused(event.link, condition_text(event.link.remote_condition))

    def on_session_error(self, event: Any) -> None:
        # RabbitMQ 3.x ends the whole session over a link it refuses (e.g.
        # PRECONDITION_FAILED, a queue of other durability); each link has a
        # session of its own, so this is that link
        why = condition_text(event.session.remote_condition)
        for link in [ln for ln in self.links.values() if ln.session == event.session]:
            self._refused(link, why)

    def _refused(self, link: Any, why: str) -> None:
        """The peer refused or ended a link: forget it (its address stays
        wanted) and attach it again after a backoff that grows per address."""
        address = link.source.address
        if self.links.get(address) != link:  # == compares the C link: each event has a new wrapper
            return
        del self.links[address]
        n = self.refused.get(address, (0, 0.0))[0] + 1
        wait = backoff(self.cfg, n)
        self.refused[address] = (n, time.monotonic() + wait)
        self.stats["refused"] += 1
        log.error("AMQP downlink: link on %s refused: %s; attaching it again in %.1f s", address, why,
                  wait)
        try:
            self._close(link)
        except Exception:  # already closed by the peer
            pass

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition
        log.warning("AMQP downlink: connection to %s failed: %s", self.url,
                    cond.description if cond is not None else "transport error")

    def on_disconnected(self, event: Any) -> None:
        if self.stopping:
            return
        self.failures += 1
        self.stats["reconnects"] += 1
        self.conn_up = False
        self.ready.clear()
        wait = reconnect_backoff(self.cfg, self.failures)
        self.reconnect_at = time.monotonic() + wait
        if self.failures == 1 or self.failures % 30 == 0:  # not one line every 2 s of an outage
            log.info("AMQP downlink: connection to %s lost (%d failed attempts in a row); trying "
                     "again every %.1f s at most", self.url, self.failures, RECONNECT_MAX_S)
        self.conn = None
        self.links.clear()
        self.closing.clear()

    def on_message(self, event: Any) -> None:
        delivery = event.delivery
        link = event.link
        address = link.source.address
        if self.links.get(address) != link and self._is_closing(link):
            # detached by the caller, still attached for what it left
            # unsettled: nothing new is taken on it, the peer keeps it
            delivery.update(Delivery.RELEASED)
            delivery.settle()
            self.stats["released"] += 1
            self._close_if_done(link)
            return
        self.stats["received"] += 1
        token = _Token(delivery, link, self.epoch, address)
        try:
            result = map_message(event.message, address, self.cfg.profile, time.time(),
                                 self.cfg.address_template, self.cfg.address_refuse,
                                 PEERS[self.cfg.peer].to_may_be_address)
        except ReverseMappingError as exc:
            result = exc
        self.deliver(address, result, token)

    # ------------------------------------------------------------ commands
    def on_lg_downlink_wake(self, event: Any = None) -> None:
        self._woken = False  # a command put from now on wakes the thread again
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            getattr(self, f"_do_{cmd[0]}")(*cmd[1:])

    def _do_attach(self, address: str, credit: int, durable: bool) -> None:
        self.wanted[address] = (credit, durable)
        if self.conn_up and address not in self.links:
            self._open_link(address, credit, durable)

    def _do_detach(self, address: str) -> None:
        self.wanted.pop(address, None)
        self.refused.pop(address, None)
        link = self.links.pop(address, None)
        if link is None:
            return
        if link.unsettled:
            # settled later (a release just after the detach): it stays
            # attached, without more credit, until they are (the module docstring)
            self.closing.append((link, time.monotonic() + _DETACH_GRACE_S))
        else:
            self._close(link)

    @staticmethod
    def _close(link: Any) -> None:
        link.close()
        link.session.close()

    def _is_closing(self, link: Any) -> bool:
        return any(ln == link for ln, _ in self.closing)  # == compares the C link

    def _close_if_done(self, link: Any) -> None:
        """A detached link goes once nothing on it is unsettled."""
        for i, (ln, _) in enumerate(self.closing):
            if ln == link:
                if not link.unsettled:
                    del self.closing[i]
                    self._close(link)
                return

    def _do_settle(self, token: _Token, outcome: str, condition: str | None,
                   description: str | None) -> None:
        if token.epoch != self.epoch or token.delivery.settled:
            return  # its connection is gone: the peer redelivers it
        d = token.delivery
        if outcome == "accepted":
            d.update(Delivery.ACCEPTED)
        elif outcome == "released":
            d.update(Delivery.RELEASED)
        elif outcome == "modified":
            d.local.failed = True
            d.update(Delivery.MODIFIED)
        else:
            d.local.condition = Condition(condition or "amqp:decode-error", description)
            d.update(Delivery.REJECTED)
        d.settle()
        self.stats[outcome] += 1
        if self.links.get(token.address) == token.link:  # not a detached link's (== compares the C link)
            token.link.flow(1)  # one more may come: the window stays the same
        elif self.closing:
            self._close_if_done(token.link)  # its disposition goes before the detach

    def _do_stop(self) -> None:
        """Close the links and the connection, and stop once the peer has
        answered the close (at most ``STOP_GRACE_S``): stopped in the same
        turn, the close frames were never written, and a broker (Artemis)
        kept the consumers until the process exited."""
        self.stopping = True
        for link in self.links.values():
            link.close()
        if self.conn is None or not (self.conn.state & Endpoint.REMOTE_ACTIVE):
            self._finish_stop()
            return
        self.conn.close()
        self.container.schedule(STOP_GRACE_S, _Later(self._finish_stop))

    def on_connection_closed(self, event: Any) -> None:  # the peer answered our close
        if self.stopping:
            self._finish_stop()

    def _finish_stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.injector.close()
        self.container.stop()

    def tick(self) -> None:
        if self.stopping:
            return
        now = time.monotonic()
        if self.closing:
            self._expire_closing(now)
        if self.conn is None and now >= self.reconnect_at:
            self._connect()
        elif self.conn_up and self.refused:
            for address, (_, at) in list(self.refused.items()):
                if now >= at and address in self.wanted and address not in self.links:
                    self._open_link(address, *self.wanted[address])
        self.container.schedule(_TICK_S, _Tick(self))

    def _expire_closing(self, now: float) -> None:
        """A detached link whose deliveries were not settled within the
        grace, or that the peer ended itself, goes now (what is unsettled
        is the peer's to deliver again)."""
        keep = []
        for link, deadline in self.closing:
            gone = (link.state | link.session.state) & Endpoint.REMOTE_CLOSED
            if not gone and now < deadline:
                keep.append((link, deadline))
                continue
            if not gone:
                log.warning("AMQP downlink: link on %s detached with %d deliveries still unsettled "
                            "after %.0f s; they are the peer's to deliver again", link.source.address,
                            link.unsettled, _DETACH_GRACE_S)
            try:
                self._close(link)
            except Exception:  # already closed
                pass
        self.closing = keep


class _Later(Handler):
    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__()
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        self.fn()


class _Tick(Handler):
    def __init__(self, receiver: DownlinkReceiver) -> None:
        super().__init__()
        self.receiver = receiver

    def on_timer_task(self, event: Any) -> None:
        self.receiver.tick()
