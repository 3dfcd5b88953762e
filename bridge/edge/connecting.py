"""The edge server's CONNECT decision, and the Client Identifiers it hands out.

A :class:`~bridge.edge.actions.ConnectRequest` from a session is decided
here: the password check (off the event loop, admitted, bounded or refused
at once with 0x89 by :class:`~bridge.edge.admission.AuthQueue`), anonymous
access (:mod:`bridge.edge.exposure`), then take-over of an older connection
with the same Client Identifier [MQTT-3.1.4-3], a delayed Will the session
left (cancelled; captured now on Clean Start), the session from the store
(nothing of an earlier one survives a new session [MQTT-3.1.2-4]), and
``Session.accept``. On a cluster edge, a CONNECT that resumes a session
first waits for it (``ClusterFeed.move_in``: from the edge it is connected
on, and whatever the other edges captured of it). When the connection ends, its session goes back to the
store (:meth:`ConnectDecision._end_client`). :class:`ConnectDecision` is a
part of :class:`~bridge.edge.server.EdgeServer` and works on its attributes
(``clients``, ``store``, ``pending_wills``, ``passwords``, ``auth``, ...).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from bridge.edge import rules as edge_rules
from bridge.edge.handshake import version_name

if TYPE_CHECKING:
    from bridge.edge.actions import ConnectRequest
    from bridge.edge.connection import Connection

__all__ = ["ConnectDecision"]

log = logging.getLogger("bridge.edge")


class ConnectDecision:
    """The CONNECT decision of the :class:`~bridge.edge.server.EdgeServer`."""

    def _connect(self, conn: Connection, req: ConnectRequest) -> None:
        if conn.tls and self.edge.cert_identity != "none":  # the certificate names the user (bridge.edge.tls)
            ident = conn.cert_identity
            if ident is None:
                self.stats["refused"] += 1
                why = (f"no client certificate with a name for edge.cert_identity = {self.edge.cert_identity!r}"
                       f" [{edge_rules.CERT_IDENTITY}]")
                log.info("%s client=%s: %s", conn.conn_id, req.client_id, why)
                self.perform(conn, conn.session.refuse(edge_rules.CERT_IDENTITY, 0x87, why))
                return
            conn.session.authenticated_as(ident)  # (the ACL's user and the capture records' username)
            self._connect_checked(conn, dataclasses.replace(req, username=ident, password=None), None)
            return
        pw = self.passwords
        if pw is not None and req.username is not None:
            # The hash is slow on purpose: the AuthQueue runs it in a worker
            # thread, bounded (see bridge/edge/admission.py). Reading goes on
            # (up to connection._AUTH_READ_MAX) so that a client that hangs up meanwhile
            # is noticed and its check skipped.
            conn.auth_bytes = 0
            busy = self.auth.submit(
                conn.host, lambda: pw.check(req.username, req.password),
                lambda: conn.transport is not None and not conn.transport.is_closing(),
                lambda f: self._connect_checked(conn, req, f) if f is not None else None)
            if busy is not None:
                conn.auth_bytes = -1
                self.stats["refused"] += 1
                self.stats["auth_busy"] += 1
                self.perform(conn, conn.session.refuse(edge_rules.AUTH_BUSY, 0x89, busy))
        else:
            self._connect_checked(conn, req, None)

    def _connect_checked(self, conn: Connection, req: ConnectRequest, checked) -> None:
        session = conn.session
        if conn.transport is None or self._stopping:
            return
        conn.auth_bytes = -1
        conn.resume("auth")
        refusal = None
        if checked is not None:
            try:
                ok = bool(checked.result())
            except Exception as exc:  # a broken hash entry: refuse, say why in the log
                log.error("%s: password check failed: %s", conn.conn_id, exc)
                ok = False
            if not ok:  # (the AuthQueue has recorded the outcome for the address)
                refusal = (0x86, f"bad user name or password for user name of "
                                 f"{len(req.username or '')} characters")
        elif req.username is None and not self.allow_anonymous:
            refusal = (0x87, "anonymous access is off (edge.allow_anonymous = false)"
                       if not self.edge.allow_anonymous else
                       "anonymous access is off beyond loopback (edge.allow_anonymous not set) "
                       f"[{edge_rules.ANONYMOUS_BEYOND_LOOPBACK}]")
        if refusal is not None:
            self.stats["refused"] += 1
            self.perform(conn, session.refuse(edge_rules.AUTH_FAILED, *refusal))
            return
        if self.feed is not None:  # a cluster edge (bridge.edge.cluster)
            if self.fenced:
                self.stats["refused"] += 1
                self.perform(conn, session.refuse(edge_rules.CLUSTER_LEASE, 0x88,
                                                  "this edge has no confirmed lease in Kafka; use another"))
                return
            if not req.clean_start:  # the session may be on another edge, or not applied here yet
                self.loop.create_task(self._move_then_connect(conn, req))
                return
        self._connect_decided(conn, req)

    async def _move_then_connect(self, conn: Connection, req: ConnectRequest) -> None:
        try:
            ok = await self.move_in(conn, req.client_id)
        except Exception:  # noqa: BLE001 - refused below, the error logged with the client's id
            log.exception("%s client=%s: moving its session failed", conn.conn_id, req.client_id)
            ok = False
        if conn.transport is None or self._stopping or conn.session is None:
            return
        if not ok:
            self.stats["refused"] += 1
            self.perform(conn, conn.session.refuse(
                edge_rules.CLUSTER_MOVE, 0x88, "its session could not be moved from the edge it is "
                "connected on (neither released nor declared dead in time)"))
            return
        self._connect_decided(conn, req)

    def _connect_decided(self, conn: Connection, req: ConnectRequest) -> None:
        """The CONNECT may be accepted: take-over, Will, session, CONNACK."""
        session = conn.session
        cid = req.client_id
        old = self.clients.get(cid)
        if old is not None and old is not conn:
            self._take_over(old)
        self._new_connection_of(cid, req.clean_start)
        client, present = self.store.open(cid, req.clean_start, req.expiry_s, time.time(),
                                          req.protocol_level)
        if not present:  # a new session: nothing of an earlier one survives [MQTT-3.1.2-4]
            self.drop_session(cid, "replaced by a new session")
        conn.client = client
        self.clients[cid] = conn
        log.info("open %s client=%s v=%s remote=%s%s clean=%d keepalive=%d session_present=%d "
                 "user=%s", conn.conn_id, cid, version_name(req.protocol_level), conn.remote,
                 "" if conn.kind == "tcp" else " " + conn.kind, req.clean_start, session.keepalive, present,
                 "yes" if req.username is not None else "no")
        self.perform(conn, session.accept(client, present, self.loop.time()))
        conn.work_if_pending()  # a large SUBSCRIBE right behind the CONNECT
        if self.downlink is not None:
            self.downlink.connected(conn)
        self.account(conn)
        self._arm(conn)

    def _take_over(self, old: Connection) -> None:
        """A newer connection (here, or on another cluster edge) took the
        Client Identifier: the old one ends [MQTT-3.1.4-3]."""
        self._end_client(old)
        if old.transport is not None:
            self.perform(old, old.session.take_over())

    def _new_connection_of(self, cid: str, clean_start: bool) -> None:
        """A new connection of ``cid`` was accepted: its delayed Will pending
        here is cancelled, or captured now on Clean Start (the old session
        ends now, and with it the delay)."""
        pending = self.pending_wills.pop(cid, None)
        if pending is not None:
            pending[0].cancel()
            if clean_start:
                self._capture_will(pending[1])

    def _end_client(self, conn: Connection) -> None:
        """Hand the connection's ClientSession back to the store (once)."""
        if conn.client is None or conn.ended:
            return
        conn.ended = True
        cid = conn.session.client_id
        if self.clients.get(cid) is conn:
            del self.clients[cid]
        self.store.close(conn.client, time.time())
        if not conn.client.persistent:  # a clean session's subscriptions end with it
            self.drop_session(cid, "clean session closed")
