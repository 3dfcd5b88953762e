"""The forwarding engine's AMQP connection and session.

:func:`peer_url` splits ``amqp.url`` into the URL given to proton (never
with credentials: proton logs it) and the user and password.
:class:`ConnectionEvents` connects (SASL, TLS, the AMQP idle time-out as
heartbeat), hears the peer open or close the connection and the transport
fail, and on a lost connection resends what was in flight: at once after a
connection that worked, else with backoff, up to ``amqp.max_retries``
failed connections (a permanent condition fails at once). When the peer
ends the session (RabbitMQ 3.x, over an unusable address), it begins a new
one: the links that were fine attach again (their messages resent, not
counted as attempts), the links that were attaching are blamed. The peer's
open frame decides whether the connection rides the anonymous relay
(:func:`~bridge.amqp.links.relay_choice`).

:class:`ConnectionEvents` is a part of :class:`~bridge.amqp.engine.Engine` and works on
its attributes; it runs only on the Forwarder's thread.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from proton import SSLDomain, symbol

from bridge.amqp.links import relay_choice
from bridge.amqp.results import ForwardError
from bridge.amqp.retry import PERMANENT_CONDITIONS, backoff, condition_text
from bridge.config import AmqpConfig

if TYPE_CHECKING:  # pragma: no cover
    from bridge.amqp.batches import Item
    from bridge.amqp.links import AddressLink

__all__ = ["ConnectionEvents", "peer_url"]

log = logging.getLogger("bridge.amqp")


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


class ConnectionEvents:
    """Connect, connection and transport events, a lost connection, the session."""

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
        self.relay_on, self.relay_to, why = relay_choice(self.cfg, event.connection.remote_offered_capabilities)
        if self.relay_on:
            log.info("AMQP forwarding over the anonymous relay: %s", why)
        elif self.cfg.anonymous_relay == "on":
            log.warning("AMQP amqp.anonymous_relay is on but %s: a link per address, at most %d", why, self.max_links)
        else:
            log.info("AMQP forwarding over a link per address, at most %d open (amqp.max_links): %s",
                     self.max_links, why)
        self.dirty.update(self.links.values())
        self.pump()

    def on_connection_remote_close(self, event: Any) -> None:
        if event.connection == self.conn:
            self.conn_condition = condition_text(event.connection.remote_condition)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        if event.connection == self.conn and event.transport.condition is not None and not self.conn_condition:
            self.conn_condition = condition_text(event.transport.condition)

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
        requeue: dict[AddressLink, list[Item]] = {}
        for link in list(self.links.values()):
            self._drop_sender(link)
            if link.inflight:
                requeue[link] = list(link.inflight.values())
                link.inflight.clear()
        self._drop_relays()
        self._forget_closing()
        self.relay_on = None
        for link, items in requeue.items():
            for item in items:
                self._fail_item(item, link, f"connection lost with no disposition ({condition})", requeue=False)
            self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        self._forget_all()  # QoS 0 deliveries still held
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
        delay = backoff(self.cfg, self.conn_failures)
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
        condition = condition_text(ssn.remote_condition)
        ssn.close()
        if self.stopping or self.session is None or ssn != self.session:
            return
        self.session = None
        for relay in list(self.relays.values()):  # its lanes' messages in flight go again
            self._relay_ended(relay, f"session ended: {condition}", refused=relay.state == "attaching")
        self._forget_closing()
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
                    self._forget(item)
                else:
                    self._fail_item(item, link, f"session ended: {condition}", requeue=False)
            self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        if len(suspects) > 1:
            # one of them is to blame: each attaches again alone, first (LinkEvents._careful_check)
            self.careful = True
            self.suspects = {link.key for link in suspects}
            if self.waiting:
                for link in reversed(suspects):
                    self.waiting[link] = None
                    self.waiting.move_to_end(link, last=False)
        self.dirty.update(self.links.values())
