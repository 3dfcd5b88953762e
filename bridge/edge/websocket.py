"""MQTT over WebSockets (MQTT 5.0 section 6): a thin transport in front of
the same :class:`~bridge.edge.connection.Connection` and sans-IO session
as TCP and TLS (``edge.ws_port``, ``edge.wss_port``; ``docs/edge.md``).

The WebSocket handshake and framing are wsproto's (a sans-IO
implementation of RFC 6455 on h11): :class:`WsConnection` is the asyncio
protocol of a WebSocket listener. It answers the HTTP upgrade on
``edge.ws_path`` when the client offers the subprotocol ``mqtt`` (or
``mqttv3.1``, what MQTT 3.1 clients offer), echoing it [MQTT-6.0.0-4], and
when its ``Origin`` is allowed (``edge.ws_origins``); then it hands the
connection to a :class:`Connection` whose transport is a
:class:`WsTransport`: what the session writes leaves as binary messages,
and the payload of every binary frame is fed to the session as it comes,
so an MQTT packet may span frames and a frame may hold several
[MQTT-6.0.0-2, -3]. Sizes stay bounded: the HTTP request at h11's 16 KiB,
frame payloads never gathered (the session's Maximum Packet Size,
``edge.max_packet_bytes``, bounds a packet as on TCP).

What closes a connection, each with its WebSocket close code and one log
line: a text frame (1003 Unsupported Data) [MQTT-6.0.0-1]; a frame that
breaks RFC 6455 (unmasked, a fragmented or oversized control frame, ...:
1002 Protocol Error, wsproto's finding); a handshake that does not
complete within ``edge.connect_timeout_s`` (no answer: the TCP connection
is aborted). A request for another path gets 404, one without the
``mqtt`` subprotocol 400 and a refused origin 403, with one line each
[LG-edge-ws-handshake]. Ping is answered with Pong; a close is answered
and ends the session's connection like a TCP close.

Behind a reverse proxy (nginx, HAProxy in HTTP mode) every connection
comes from the proxy: when its address is in ``edge.ws_trusted_proxies``,
the client's address is the last entry of ``X-Forwarded-For`` (the one
that proxy appended), and it is what the logs, the capture record's
``remote`` and the per-address limits see.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from typing import TYPE_CHECKING

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, RejectConnection,
                            RejectData, Request, TextMessage)
from wsproto.utilities import RemoteProtocolError

from bridge.edge import rules as edge_rules
from bridge.edge.connection import Connection, remote_address

if TYPE_CHECKING:
    from bridge.edge.server import EdgeServer

__all__ = ["WsConnection", "WsTransport", "SUBPROTOCOLS"]

log = logging.getLogger("bridge.edge")

#: The subprotocols of MQTT over WebSockets (MQTT 5.0 section 6; 3.1 clients offer "mqttv3.1").
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
#: WebSocket close codes (RFC 6455 section 7.4.1; 1002 Protocol Error comes from wsproto's findings).
CLOSE_NORMAL, CLOSE_UNSUPPORTED = 1000, 1003


@functools.lru_cache(maxsize=16)
def _listed(value: str) -> frozenset[str]:
    """A comma-separated setting (edge.ws_origins, edge.ws_trusted_proxies) as a set, parsed once."""
    return frozenset(v.strip() for v in value.split(",") if v.strip())


class WsTransport(asyncio.Transport):
    """The transport a WebSocket connection's :class:`Connection` writes
    to: each write leaves as one binary message; the rest is the TCP (or
    TLS) transport's."""

    def __init__(self, raw: asyncio.Transport, ws: WSConnection, peer: tuple | None = None) -> None:
        super().__init__()
        self._raw = raw
        self._ws = ws
        self._closing = False
        self._peer = peer  # the client's address a trusted proxy gave (X-Forwarded-For), or None

    def write(self, data) -> None:
        if self._closing or self._raw.is_closing():
            return
        self._raw.write(self._ws.send(Message(data=bytes(data))))

    def writelines(self, list_of_data) -> None:
        self.write(b"".join(list_of_data))

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """A close the edge decides on: a WebSocket Close, then the TCP close."""
        if self._closing:
            return
        self._closing = True
        try:
            self._raw.write(self._ws.send(CloseConnection(code=code)))
        except Exception:  # noqa: BLE001 - the WebSocket is closing already (a close crossed ours)
            pass
        self._raw.close()

    def abort(self) -> None:
        self._closing = True
        self._raw.abort()

    def closed_by_peer(self) -> None:
        """The client's Close was answered: nothing more is written."""
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def get_extra_info(self, name, default=None):
        if name == "peername" and self._peer is not None:
            return self._peer
        return self._raw.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()


class WsConnection(asyncio.Protocol):
    """The asyncio protocol of a WebSocket listener (module docstring)."""

    def __init__(self, server: EdgeServer, tls: bool) -> None:
        self.server = server
        self.tls = tls
        self.ws = WSConnection(ConnectionType.SERVER)
        self.raw: asyncio.Transport | None = None
        self.inner: Connection | None = None  # after the handshake
        self.transport: WsTransport | None = None
        self.remote = "-"
        self._timer: asyncio.TimerHandle | None = None
        self._pending = False  # counted in server.ws_handshakes

    @property
    def kind(self) -> str:
        return "wss" if self.tls else "ws"

    # ------------------------------------------------------------ asyncio
    def connection_made(self, transport) -> None:
        self.raw = transport
        self.remote = remote_address(transport.get_extra_info("peername"))
        self.server.ws_handshakes += 1
        self._pending = True
        if self.server.ws_handshakes > self.server.edge.max_connections:
            self._refuse(503, "too many WebSocket handshakes at once (edge.max_connections)")
            return
        self._timer = self.server.loop.call_later(self.server.edge.connect_timeout_s, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        try:
            self.ws.receive_data(data)
        except RemoteProtocolError as exc:
            self._refuse(400, f"not a WebSocket upgrade ({exc})")
            return
        self._events()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self._handshake_over()
        inner = self.inner
        if inner is not None and inner.transport is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # ------------------------------------------------------------ events
    def _events(self) -> None:
        raw = self.raw
        for event in self.ws.events():
            if isinstance(event, BytesMessage):
                inner = self.inner
                if inner is not None and inner.transport is not None and event.data:
                    inner.data_received(bytes(event.data))
            elif isinstance(event, Request):
                self._handshake(event)
            elif isinstance(event, Ping):
                if not raw.is_closing():
                    raw.write(self.ws.send(event.response()))
            elif isinstance(event, TextMessage):
                self._close(CLOSE_UNSUPPORTED, "a text frame: MQTT travels in binary frames only "
                                               f"[{edge_rules.WS_BINARY}]")
                return
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.OPEN:  # wsproto's finding, not the peer's Close
                    self._close(event.code, f"WebSocket protocol error: {event.reason}")
                else:
                    self._remote_close(event)
                return
            if raw.is_closing():
                return

    def _handshake(self, req: Request) -> None:
        edge = self.server.edge
        path = req.target.split("?", 1)[0]
        if path != edge.ws_path:
            self._refuse(404, f"path {path[:100]!r} (edge.ws_path is {edge.ws_path!r})")
            return
        offered = [p.strip() for p in req.subprotocols]
        chosen = next((p for p in offered if p in SUBPROTOCOLS), None)
        if chosen is None:
            self._refuse(400, f"no MQTT subprotocol offered (offered: {', '.join(offered)[:100] or 'none'}; "
                              "needs mqtt or mqttv3.1) [MQTT-6.0.0-4]")
            return
        allowed = _listed(edge.ws_origins)
        if allowed:
            origin = next((v.decode("latin-1") for k, v in req.extra_headers if k.lower() == b"origin"), None)
            if origin is None or origin not in allowed:
                self._refuse(403, f"origin {origin!r} is not in edge.ws_origins")
                return
        peer = self._forwarded(req)
        self._handshake_over()
        self.raw.write(self.ws.send(AcceptConnection(subprotocol=chosen)))
        inner = self.inner = Connection(self.server, self.tls)
        inner.kind = self.kind
        self.transport = WsTransport(self.raw, self.ws, peer)
        inner.connection_made(self.transport)
        if peer is not None:
            log.info("%s: WebSocket through proxy %s for client address %s (X-Forwarded-For)", inner.conn_id,
                     self.remote, inner.remote)

    def _forwarded(self, req: Request) -> tuple | None:
        """The client's address from the last ``X-Forwarded-For`` entry, when
        the connection comes from a proxy in ``edge.ws_trusted_proxies``
        (what the proxy itself appended; earlier entries are the client's
        word). None: the TCP peer is the client."""
        trusted = _listed(self.server.edge.ws_trusted_proxies)
        peer = self.raw.get_extra_info("peername")
        if not trusted or not isinstance(peer, tuple) or str(peer[0]) not in trusted:
            return None
        values = [v.decode("latin-1") for k, v in req.extra_headers if k.lower() == b"x-forwarded-for"]
        hops = [h.strip() for v in values for h in v.split(",") if h.strip()]
        if not hops:
            return None
        try:
            addr = ipaddress.ip_address(hops[-1].strip("[]"))
        except ValueError:
            log.info("ws %s remote=%s: X-Forwarded-For %r is not an address; the proxy's address is used",
                     self.kind, self.remote, hops[-1][:60])
            return None
        return (str(addr), 0)

    # ------------------------------------------------------------ endings
    def _handshake_over(self) -> None:
        """The handshake phase ended (accepted, refused, timed out or lost): counted once."""
        if self._pending:
            self._pending = False
            self.server.ws_handshakes -= 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _handshake_timeout(self) -> None:
        self._timer = None
        self._handshake_over()
        log.info("ws %s remote=%s: the WebSocket handshake did not complete within edge.connect_timeout_s = "
                 "%g s [%s]; aborted", self.kind, self.remote, self.server.edge.connect_timeout_s,
                 edge_rules.WS_HANDSHAKE)
        self.raw.abort()

    def _refuse(self, status: int, why: str) -> None:
        self._handshake_over()
        log.info("ws %s remote=%s: handshake refused with HTTP %d: %s [%s]", self.kind, self.remote, status, why,
                 edge_rules.WS_HANDSHAKE)
        body = f"{why}\n".encode()
        try:
            self.raw.write(self.ws.send(RejectConnection(
                status_code=status, has_body=True,
                headers=[(b"content-type", b"text/plain; charset=utf-8"),
                         (b"content-length", str(len(body)).encode())])))
            self.raw.write(self.ws.send(RejectData(data=body)))
        except Exception:  # noqa: BLE001 - the request was not HTTP at all: nothing to answer with
            pass
        self.raw.close()

    def _close(self, code: int, why: str) -> None:
        """Close for a WebSocket-level fault: the session's connection ends with ``why``."""
        inner = self.inner
        cid = inner.session.client_id if inner is not None and inner.session is not None else None
        log.info("ws %s remote=%s client=%s: closed with WebSocket code %d: %s", self.kind, self.remote,
                 cid or "-", code, why)
        if inner is not None and inner.session is not None and inner.session.close_reason is None:
            inner.session.close_reason = f"WebSocket {code}: {why}"
        if self.transport is not None:
            self.transport.close(code)
        else:
            self.raw.close()

    def _remote_close(self, event: CloseConnection) -> None:
        """The client closed the WebSocket: answer, then close TCP (the session sees a lost connection,
        or its DISCONNECT if one came first)."""
        try:
            self.raw.write(self.ws.send(event.response()))
        except Exception:  # noqa: BLE001 - already closing
            pass
        if self.transport is not None:
            self.transport.closed_by_peer()
        self.raw.close()
