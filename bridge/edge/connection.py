"""One client connection of the edge server: an :class:`asyncio.Protocol`
that feeds the bytes it reads to its sans-IO
:class:`~bridge.edge.session.Session` (the server performs the actions that
come back) and writes the connection's outbound queue strictly in order:
an acknowledgement leaves only once the record it answers is durable (and,
with ``edge.ack_after = "forward"``, forwarded), so acknowledgements leave
in the order their packets arrived [MQTT-4.6.0-2, -3]. Reading pauses for
any of several reasons at once (``paused_by``: the password check, the
capture log's back-pressure, a peer that does not read, shutdown).
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import Future
from typing import TYPE_CHECKING

from bridge.edge.session import Session

if TYPE_CHECKING:
    from bridge.edge.server import EdgeServer

__all__ = ["Connection", "remote_address"]

_WRITE_HIGH = 1 << 20  # transport write buffer: stop reading a peer that does not read
#: A close the edge decides on (keep-alive expiry, a protocol error, a take
#: over, shutdown) waits this long at most for its last bytes to be read by
#: the peer, then aborts the transport: the server "MUST disconnect the
#: Network Connection" [MQTT-3.1.2-22], and a peer that stopped reading
#: would otherwise hold it open (and its session queuing) for ever.
CLOSE_LINGER_S = 1.0
#: Bytes read from a client while its password is checked before reading pauses
#: (reading goes on so that a client that hangs up is noticed and not checked).
_AUTH_READ_MAX = 64 * 1024


def remote_address(peer) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a transport's peer name."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer) if peer else "-"


def count_frames(data: bytes, counts: list[int]) -> None:
    """Add the MQTT frames ``data`` holds (whole frames, back to back) to ``counts`` by type."""
    i, n = 0, len(data)
    while i < n:
        counts[data[i] >> 4] += 1
        j, mult, length = i + 1, 1, 0
        while j < n:  # Remaining Length: up to four 7-bit digits
            b = data[j]
            length += (b & 0x7F) * mult
            j += 1
            if not b & 0x80:
                break
            mult <<= 7
        i = j + length


def _abort_unread(transport) -> None:
    """The end of a close's linger: drop what the peer never read (see
    :data:`CLOSE_LINGER_S`)."""
    if transport.get_write_buffer_size():  # (0 once the transport has closed)
        transport.abort()


class Connection(asyncio.Protocol):
    """One client connection: transport, session, ordered outbound queue."""

    def __init__(self, server: EdgeServer, tls: bool) -> None:
        self.server = server
        self.tls = tls
        #: the transport, for logs and metrics: "tcp", "tls", "ws" or "wss" (bridge.edge.websocket)
        self.kind = "tls" if tls else "tcp"
        #: the user name its verified client certificate gives (edge.cert_identity; bridge.edge.tls)
        self.cert_identity: str | None = None
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.conn_id = ""
        self.remote = "-"
        #: (future or None, (partition, offset) or None, bytes or None, quota or close reason,
        #:  loop time a QoS 1/2 acknowledgement was queued or 0.0)
        self.queue: collections.deque = collections.deque()
        self.last_fut: Future | None = None
        self.ok_fut: Future | None = None
        self.watching: Future | None = None
        self.fwd_waiting = False
        self.client = None  # ClientSession once accepted
        self.ended = False  # the ClientSession was handed back to the store
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.paused_by: set[str] = set()
        self.host = "-"  # remote address without the port (per-address limits)
        self.auth_bytes = -1  # bytes read while the password is checked (-1: not checking)
        self.buffered = 0  # bytes of an incomplete frame the session holds (as last counted)
        self.partial_since = 0.0  # loop time the incomplete frame started (when buffered)
        self.frames_at = 0  # session.frames_in when partial_since was set
        self.pump_soon = False  # a pump is scheduled (EdgeServer.pump_soon)
        self.connect_seq = -1  # the capture sequence of its CONNECT (a cluster's take-over rule)
        self.working = False  # a slice of a large SUBSCRIBE / UNSUBSCRIBE is scheduled
        self.bytes_out = 0
        #: frames sent by packet type (counted only while the server's metrics are on)
        self.packets_out = [0] * 16

    # ------------------------------------------------------------ asyncio
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self.server._connection_made(self)

    def data_received(self, data: bytes) -> None:
        srv = self.server
        if self.auth_bytes >= 0:
            self.auth_bytes += len(data)
            if self.auth_bytes > _AUTH_READ_MAX:
                self.pause("auth")
        session = self.session
        actions = session.receive_data(data, srv.loop.time())
        if actions:
            srv.perform(self, actions)
        if session.work_pending:  # a large SUBSCRIBE, or frames left for the next turn
            self.work_if_pending()
        srv.account(self)
        if srv.log_busy():
            srv.throttle(self)

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.server._connection_lost(self, exc)

    def pause_writing(self) -> None:
        self.pause("write")

    def resume_writing(self) -> None:
        self.resume("write")
        self.server.pump(self)  # deliveries held while the peer did not read

    def work_if_pending(self) -> None:
        """The session handles a large SUBSCRIBE / UNSUBSCRIBE in slices,
        and received frames a turn's work at a time (``Session.work``,
        ``session.TURN_BUDGET``): one call per turn of the event loop, the
        connection's reading paused until the last."""
        if self.session.work_pending and not self.working and self.transport is not None:
            self.working = True
            self.pause("work")
            self.server.loop.call_soon(self._work_slice)

    def _work_slice(self) -> None:
        self.working = False
        if self.transport is None:
            return
        srv = self.server
        actions = self.session.work(srv.loop.time())
        if actions:
            srv.perform(self, actions)
        if self.session.work_pending:
            self.work_if_pending()
        else:
            self.resume("work")
            srv.account(self)

    def pause(self, why: str) -> None:
        if not self.paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.paused_by.add(why)

    def resume(self, why: str) -> None:
        self.paused_by.discard(why)
        if not self.paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # ------------------------------------------------------------ output
    def _written(self, items: list[bytes]) -> None:
        """Count what goes out: bytes always, frames by type while metrics are on."""
        counts = self.packets_out if self.server.ack_latency is not None else None
        for data in items:
            n = len(data)
            self.bytes_out += n
            if counts is not None:
                if n == 4:  # an acknowledgement (the commonest frame out): one frame, no walk
                    counts[data[0] >> 4] += 1
                else:
                    count_frames(data, counts)

    def drain(self) -> None:
        """Write every queued item whose conditions hold, in order."""
        q = self.queue
        transport = self.transport
        if not q or transport is None:
            return
        out = []
        quota = 0
        ok = self.ok_fut
        srv = self.server
        lat = srv.ack_latency  # None: metrics off
        now = srv.loop.time() if lat is not None else 0.0
        while q:
            fut, fwd, data, extra, t0 = q[0]
            if fut is not None and fut is not ok:
                if not fut.done():
                    if self.watching is not fut:
                        self.watching = fut
                        srv.watch(fut, self)
                    break
                if fut.exception() is not None:
                    srv.log_failed(fut.exception())
                    q.clear()
                    out.clear()
                    transport.abort()
                    return
                ok = self.ok_fut = fut
            if fwd is not None and not srv.forward.reached(*fwd):
                if not self.fwd_waiting:
                    self.fwd_waiting = True
                    srv.forward.wait(fwd[0], fwd[1], self)
                break
            q.popleft()
            if data is None:  # a Close
                if out:
                    self._written(out)
                    transport.write(b"".join(out))
                    out = []
                q.clear()
                transport.close()
                if transport.get_write_buffer_size():  # the peer is not reading
                    srv.loop.call_later(CLOSE_LINGER_S, _abort_unread, transport)
                break
            out.append(data)
            quota += extra
            if t0 and lat is not None:  # a QoS 1/2 acknowledgement, sent now that it is durable
                lat[data[0] >> 4].observe(now - t0)  # 16 Buckets, by packet type
        if out:
            self._written(out)
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        if quota:
            self.session.quota_released(quota)
