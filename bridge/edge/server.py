"""The edge's network side: a thin asyncio TCP (and TLS) server.

For each connection an :class:`asyncio.Protocol` feeds the bytes it reads to
its :class:`~bridge.edge.session.Session` and performs the actions that come
back, in order:

* ``Capture``: ``CaptureLog.append`` (partition key: the connection id; key:
  the client id). A reply (PUBACK, PUBREC, PUBCOMP...) goes into the
  connection's outbound queue behind the record's durability (and, with
  ``edge.ack_after = "forward"``, behind the AMQP sink's forwarded mark for
  that record). The queue is written strictly in order, so acknowledgements
  leave in the order their packets arrived [MQTT-4.6.0-2, -3].
* ``Send`` / ``Close``: queued in order as well; a close waits until every
  record captured before it is durable.
* ``ConnectRequest``: password check (off the event loop: the hash is slow on
  purpose; admitted, bounded or refused at once with 0x89 by
  :class:`~bridge.edge.admission.AuthQueue`), connection limit, take-over of
  an older connection with the same Client Identifier [MQTT-3.1.4-3],
  session lookup; then ``Session.accept``.
* ``WillMessage``: appended now, or after the Will Delay Interval unless a
  connection resumes the session first.

No thread hop per packet: the capture log completes one future per group
commit; the server registers one callback per group future and wakes the
connections waiting on it from the event loop, which then write all their
ready acknowledgements with one ``write`` each.

Back-pressure: when the capture log has ``capture.max_pending_bytes``
waiting for the disk, connections stop reading their sockets until it has
room; a connection whose peer does not read its acknowledgements stops being
read as well (transport write-buffer limits).

Incomplete frames: the server counts the bytes each session holds of a frame
not yet complete. One that stays incomplete for ``edge.frame_timeout_s``
closes its connection [LG-edge-frame-timeout]; over
``edge.max_buffered_bytes`` across all connections, the connection whose
incomplete frame is the oldest is closed [LG-edge-buffer-budget].

Shutdown (:meth:`EdgeServer.shutdown`): stop accepting, stop reading, send
DISCONNECT 0x8B to MQTT 5 clients behind their pending acknowledgements,
capture the Wills (pending delayed Wills too), fsync the log, close the
connections (waiting at most ``edge.shutdown_grace_s``), write the session
snapshot, close the log.

One log line per connection open (client id, version, remote address) and
close (the same plus the reason); never payloads or passwords.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import threading
import time
from concurrent.futures import Future

from bridge.capture import CaptureLog, LogReader
from bridge.capture.errors import CaptureError
from bridge.config import Config, ConfigError
from bridge.edge import rules as edge_rules
from bridge.edge.admission import AuthQueue
from bridge.edge.auth import PasswordFile
from bridge.edge.persist import SNAPSHOT_INTERVAL_S, recover, write_snapshot
from bridge.edge.session import (
    CONNECTING, Capture, Close, ConnectRequest, Limits, Notice, Send, Session, WillMessage,
    version_name,
)
from bridge.edge.state import SessionStore

__all__ = ["EdgeServer", "EdgeThread", "ForwardWaiter"]

log = logging.getLogger("bridge.edge")

_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_WRITE_HIGH = 1 << 20  # transport write buffer: stop reading a peer that does not read
#: Bytes read from a client while its password is checked before reading pauses
#: (reading goes on so that a client that hangs up is noticed and not checked).
_AUTH_READ_MAX = 64 * 1024


def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
        if not n:
            return out


def _remote(peer) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer) if peer else "-"


class ForwardWaiter:
    """Holds acknowledgements until the AMQP sink forwarded their records
    (``edge.ack_after = "forward"``). Polls the forwarded marks of
    :class:`bridge.amqp.forwarded.ForwardedOffsets` only while something
    waits: every millisecond, backing off to 50 ms while nothing moves."""

    def __init__(self, data_dir, stream: str, partitions: int) -> None:
        from bridge.amqp.forwarded import ForwardedOffsets

        self.marks = ForwardedOffsets(data_dir, stream)
        self.seen = [-1] * partitions
        self._waiting: dict[int, list] = {}
        self._task: asyncio.Task | None = None

    def reached(self, partition: int, offset: int) -> bool:
        return self.seen[partition] >= offset

    def wait(self, partition: int, offset: int, conn) -> None:
        self._waiting.setdefault(partition, []).append((offset, conn))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        pause = 0.001
        while self._waiting:
            moved = False
            for p in list(self._waiting):
                mark = self.marks.get(p)
                if mark > self.seen[p]:
                    self.seen[p] = mark
                    moved = True
                    waiters = self._waiting.pop(p)
                    keep = [(o, c) for o, c in waiters if o > mark]
                    if keep:
                        self._waiting[p] = keep
                    for o, c in waiters:
                        if o <= mark:
                            c.fwd_waiting = False
                            c.drain()
            pause = 0.001 if moved else min(pause * 2, 0.05)
            await asyncio.sleep(pause)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class _Conn(asyncio.Protocol):
    """One client connection: transport, session, ordered outbound queue."""

    def __init__(self, server: EdgeServer, tls: bool) -> None:
        self.server = server
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.conn_id = ""
        self.remote = "-"
        #: (future or None, (partition, offset) or None, bytes or None, quota or close reason)
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
        actions = self.session.receive_data(data, srv.loop.time())
        if actions:
            srv.perform(self, actions)
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

    def pause(self, why: str) -> None:
        if not self.paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.paused_by.add(why)

    def resume(self, why: str) -> None:
        self.paused_by.discard(why)
        if not self.paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # ------------------------------------------------------------ output
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
        while q:
            fut, fwd, data, extra = q[0]
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
                    transport.write(b"".join(out))
                    out = []
                q.clear()
                transport.close()
                break
            out.append(data)
            quota += extra
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        if quota:
            self.session.quota_released(quota)


class EdgeServer:
    """The MQTT edge server (see the module docstring).

    ``log``: an open :class:`CaptureLog` to use (tests); by default the
    server opens ``config.capture_dir`` in :meth:`start` and closes it in
    :meth:`shutdown`.
    """

    def __init__(self, config: Config, *, log: CaptureLog | None = None) -> None:
        edge = config.edge
        if not edge.allow_anonymous and not edge.password_file:
            raise ConfigError("edge.allow_anonymous", config.sources.get("edge.allow_anonymous",
                                                                         "default"),
                              "false needs edge.password_file (there is nothing to check "
                              "credentials against)")
        if edge.ack_after == "forward" and not config.amqp.url:
            raise ConfigError("edge.ack_after", config.sources.get("edge.ack_after", "default"),
                              '"forward" needs amqp.url: with forwarding off no acknowledgement '
                              "would ever be sent")
        self.config = config
        self.edge = edge
        self.limits = Limits.from_config(edge)
        self.log = log
        self._own_log = log is None
        self.store = SessionStore()
        self.passwords: PasswordFile | None = None
        self.auth: AuthQueue | None = None
        self.forward: ForwardWaiter | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conns: set[_Conn] = set()
        self.clients: dict[str, _Conn] = {}
        self.pending_wills: dict[str, tuple[asyncio.TimerHandle, WillMessage]] = {}
        self.addresses: list[tuple[str, int, bool]] = []
        self.failed: BaseException | None = None
        self.stopped: asyncio.Event | None = None  # created in start()
        self.stats = {"connections": 0, "refused": 0, "auth_busy": 0}
        self._servers: list[asyncio.base_events.Server] = []
        self._watch: dict[Future, list[_Conn]] = {}
        self._throttled: set[_Conn] = set()
        #: connections holding an incomplete frame, and the bytes they hold
        self._partial: set[_Conn] = set()
        self.buffered_total = 0
        self._frame_task: asyncio.Task | None = None
        self._room_task: asyncio.Task | None = None
        self._snapshot_task: asyncio.Task | None = None
        self._snapshot_seq = -1
        self._stopping = False
        self._boot = _base36(int(time.time() * 1000))
        self._next_conn = 0
        self._idle: asyncio.Event | None = None

    # ------------------------------------------------------------ start
    async def start(self) -> list[tuple[str, int, bool]]:
        """Open the log, recover persistent sessions, listen. Returns the
        listening (host, port, tls) addresses (port 0 in the config picks one)."""
        cfg = self.config
        edge = self.edge
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        if edge.password_file:
            self.passwords = await asyncio.to_thread(PasswordFile, edge.password_file)
            self.auth = AuthQueue(edge.auth_workers, edge.auth_max_pending,
                                  edge.auth_max_pending_per_address, edge.auth_failure_backoff_s,
                                  self.loop.call_soon_threadsafe)
        if self.log is None:
            self.log = await asyncio.to_thread(CaptureLog.open, cfg.capture_dir, cfg.capture)
        t0 = time.monotonic()
        end = self.log.next_offsets()
        self.store, owed_wills, replayed = await asyncio.to_thread(
            recover, cfg.edge_state_dir, LogReader(self.log.root), end, self.log.stream)
        self._configure_store()
        self._expire_sessions()
        log.info("edge sessions recovered: %d persistent sessions, %d QoS 2 ids awaiting PUBREL, "
                 "%d Wills owed, %d capture records replayed in %.2f s", len(self.store),
                 sum(len(s.qos2) for s in self.store.sessions.values()), len(owed_wills), replayed,
                 time.monotonic() - t0)
        # Wills the last run owed when it died: as for connections lost just now
        for w in owed_wills.values():
            log.info("%s client=%s: will owed from before the restart (%d bytes), captured %s",
                     w.conn_id, w.client_id, len(w.frame),
                     "now" if w.delay_s <= 0 else f"in {w.delay_s} s unless the client connects")
            self._will(w)
        if edge.ack_after == "forward":
            self.forward = ForwardWaiter(cfg.data_path, self.log.stream, self.log.partitions)
        loop = self.loop
        srv = await loop.create_server(lambda: _Conn(self, False), edge.host, edge.port,
                                       reuse_address=True, backlog=1024)
        self._servers.append(srv)
        if edge.tls_port:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(edge.tls_cert_file, edge.tls_key_file or None)
            tls = await loop.create_server(lambda: _Conn(self, True), edge.host, edge.tls_port,
                                           ssl=ctx, reuse_address=True, backlog=1024)
            self._servers.append(tls)
        for s, is_tls in zip(self._servers, (False, True)):
            for sock in s.sockets:
                host, port = sock.getsockname()[:2]
                self.addresses.append((host, port, is_tls))
        self._snapshot_task = loop.create_task(self._snapshot_loop())
        self._frame_task = loop.create_task(self._frame_timeouts())
        return self.addresses

    @property
    def port(self) -> int:
        """The plain TCP listening port."""
        return next(p for _h, p, tls in self.addresses if not tls)

    @property
    def tls_port(self) -> int | None:
        return next((p for _h, p, tls in self.addresses if tls), None)

    # ------------------------------------------------------------ connections
    def _connection_made(self, conn: _Conn) -> None:
        now = self.loop.time()
        self._next_conn += 1
        conn.conn_id = f"{self._boot}-{_base36(self._next_conn)}"
        peer = conn.transport.get_extra_info("peername")
        conn.remote = _remote(peer)
        conn.host = str(peer[0]) if isinstance(peer, tuple) and peer else conn.remote
        busy = len(self.conns) >= self.edge.max_connections
        conn.session = Session(conn.conn_id, conn.remote, self.limits, now, busy=busy)
        self.conns.add(conn)
        self._idle.clear()
        self.stats["connections"] += 1
        if self._stopping:
            conn.transport.close()
            return
        self._arm(conn)

    def _connection_lost(self, conn: _Conn, exc) -> None:
        session = conn.session
        transport = conn.transport
        conn.transport = None
        if session is None:
            return
        if exc is not None and session.close_reason is None:
            session.close_reason = f"connection lost ({type(exc).__name__}: {exc})"
        actions = session.connection_lost(self.loop.time())
        if actions:
            self.perform(conn, actions)
        conn.queue.clear()
        self._unaccount(conn)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        self._end_client(conn)
        self.conns.discard(conn)
        self._throttled.discard(conn)
        if not self.conns:
            self._idle.set()
        log.info("close %s client=%s v=%s remote=%s%s reason=%s frames=%d bytes=%d",
                 conn.conn_id, session.client_id or "-", version_name(session.level), conn.remote,
                 " tls" if conn.tls else "", session.close_reason or "connection lost",
                 session.frames_in, session.bytes_in)
        del transport

    def _end_client(self, conn: _Conn) -> None:
        """Hand the connection's ClientSession back to the store (once)."""
        if conn.client is None or conn.ended:
            return
        conn.ended = True
        cid = conn.session.client_id
        if self.clients.get(cid) is conn:
            del self.clients[cid]
        self.store.close(conn.client, time.time())

    # ------------------------------------------------------------ actions
    def perform(self, conn: _Conn, actions: list) -> None:
        """Carry out a session's actions in order (see the module docstring)."""
        append = self.log.append
        q = conn.queue
        key = conn.session.key
        fwd_mode = self.forward is not None
        for a in actions:
            t = type(a)
            if t is Capture:
                try:
                    ack = append(conn.conn_id, key, a.frame,
                                 a.headers if a.release is None else a.final_headers())
                except CaptureError as exc:
                    self.log_failed(exc)
                    if conn.transport is not None:
                        conn.transport.abort()
                    return
                fut = ack.future
                conn.last_fut = fut
                if a.qos2 is not None:
                    a.captured(ack.partition, ack.offset, ack.seq)
                if a.reply is not None:
                    fwd = None
                    f = a.forward
                    if fwd_mode and f is not None:
                        if f is True:
                            fwd = (ack.partition, ack.offset)
                        elif f.partition is not None:
                            fwd = (f.partition, f.offset)
                    q.append((fut, fwd, a.reply, a.quota))
            elif t is Send:
                q.append((None, None, a.data, 0))
            elif t is Close:
                q.append((conn.last_fut, None, None, a.reason))
            elif t is ConnectRequest:
                self._connect(conn, a)
                key = conn.session.key
            elif t is WillMessage:
                self._will(a)
            elif t is Notice:
                log.info("%s client=%s: %s", conn.conn_id, conn.session.client_id or "-", a.message)
        conn.drain()

    def watch(self, fut: Future, conn: _Conn) -> None:
        """Drain ``conn`` once the group commit ``fut`` completes."""
        waiting = self._watch.get(fut)
        if waiting is None:
            self._watch[fut] = [conn]
            fut.add_done_callback(self._durable_threadsafe)
        else:
            waiting.append(conn)

    def _durable_threadsafe(self, fut: Future) -> None:
        # Runs on the capture log's flusher thread: one hop per group commit.
        try:
            self.loop.call_soon_threadsafe(self._durable, fut)
        except RuntimeError:  # the loop is closed (process ending)
            pass

    def _durable(self, fut: Future) -> None:
        for conn in self._watch.pop(fut, ()):
            if conn.watching is fut:
                conn.watching = None
            conn.drain()

    def log_busy(self) -> bool:
        return not self.log.has_room(0)

    def throttle(self, conn: _Conn) -> None:
        """Stop reading ``conn`` until the capture log has room again."""
        conn.pause("log")
        self._throttled.add(conn)
        if self._room_task is None or self._room_task.done():
            self._room_task = self.loop.create_task(self._wait_for_room())

    async def _wait_for_room(self) -> None:
        while self._throttled:
            await asyncio.to_thread(self.log.wait_for_room, 0, 1.0)
            if self.log.has_room(0):
                conns, self._throttled = self._throttled, set()
                now = self.loop.time()
                for c in conns:
                    c.resume("log")
                    # the edge stopped reading, not the client: its frame's clock restarts
                    c.partial_since = max(c.partial_since, now)

    def log_failed(self, exc: BaseException) -> None:
        """The capture log cannot write: nothing more may be acknowledged.
        The server stops (the supervisor restarts it, which reopens the log)."""
        if self.failed is None:
            self.failed = exc
            log.error("capture log failed, the edge stops: %s", exc)
            if self.stopped is not None:
                self.stopped.set()

    # ------------------------------------------------------------ incomplete frames
    def account(self, conn: _Conn) -> None:
        """Count the bytes ``conn``'s session holds of an incomplete frame and
        when that frame started; over ``edge.max_buffered_bytes`` in total,
        close the connections whose incomplete frames are the oldest."""
        session = conn.session
        transport = conn.transport
        n = session.buffered if transport is not None and not transport.is_closing() else 0
        if n != conn.buffered:
            self.buffered_total += n - conn.buffered
            conn.buffered = n
        if n:
            if conn not in self._partial or session.frames_in != conn.frames_at:
                # a new frame started in this chunk (none was pending, or one completed)
                conn.partial_since = self.loop.time()
                conn.frames_at = session.frames_in
                self._partial.add(conn)
            if self.buffered_total > self.edge.max_buffered_bytes:
                self._over_budget()
        elif conn in self._partial:
            self._partial.discard(conn)

    def _unaccount(self, conn: _Conn) -> None:
        self.buffered_total -= conn.buffered
        conn.buffered = 0
        self._partial.discard(conn)

    def _over_budget(self) -> None:
        budget = self.edge.max_buffered_bytes
        while self.buffered_total > budget and self._partial:
            worst = min(self._partial, key=lambda c: (c.partial_since, -c.buffered))
            self._limit_close(worst, edge_rules.BUFFER_BUDGET,
                              f"incomplete frames of all connections hold {self.buffered_total} "
                              f"bytes, over edge.max_buffered_bytes = {budget}; this "
                              f"connection's is the oldest ({worst.buffered} bytes, "
                              f"{self.loop.time() - worst.partial_since:.1f} s)")

    def _limit_close(self, conn: _Conn, rule: str, detail: str) -> None:
        """Close ``conn`` for a resource limit (its reason goes to the log's
        close line); its buffered bytes are released now."""
        why = f"[{rule}] {detail}"
        log.warning("%s client=%s remote=%s: closing: %s", conn.conn_id,
                    conn.session.client_id or "-", conn.remote, why)
        if conn.session.close_reason is None:
            conn.session.close_reason = why
        self._unaccount(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def _frame_timeouts(self) -> None:
        """Close connections whose incomplete frame is older than
        ``edge.frame_timeout_s`` (not those waiting for their password check,
        nor those the edge stopped reading for capture-log back-pressure)."""
        limit = self.edge.frame_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            cutoff = self.loop.time() - limit
            for conn in [c for c in self._partial if c.partial_since <= cutoff]:
                if conn.session.state == CONNECTING or "log" in conn.paused_by:
                    continue
                self._limit_close(conn, edge_rules.FRAME_TIMEOUT,
                                  f"a frame started {self.loop.time() - conn.partial_since:.1f} s "
                                  f"ago is still incomplete ({conn.buffered} bytes buffered, "
                                  f"edge.frame_timeout_s = {limit:g})")

    # ------------------------------------------------------------ CONNECT
    def _connect(self, conn: _Conn, req: ConnectRequest) -> None:
        pw = self.passwords
        if pw is not None and req.username is not None:
            # The hash is slow on purpose: the AuthQueue runs it in a worker
            # thread, bounded (see bridge/edge/admission.py). Reading goes on
            # (up to _AUTH_READ_MAX) so that a client that hangs up meanwhile
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

    def _connect_checked(self, conn: _Conn, req: ConnectRequest, checked) -> None:
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
            if ok:
                self.auth.succeeded(conn.host)
            else:
                self.auth.failed(conn.host)
                refusal = (0x86, f"bad user name or password for user name of "
                                 f"{len(req.username or '')} characters")
        elif req.username is None and not self.edge.allow_anonymous:
            refusal = (0x87, "anonymous access is off (edge.allow_anonymous = false)")
        if refusal is not None:
            self.stats["refused"] += 1
            self.perform(conn, session.refuse(edge_rules.AUTH_FAILED, *refusal))
            return
        cid = req.client_id
        old = self.clients.get(cid)
        if old is not None and old is not conn:
            self._end_client(old)
            if old.transport is not None:
                self.perform(old, old.session.take_over())
        pending = self.pending_wills.pop(cid, None)
        if pending is not None:
            pending[0].cancel()
            if req.clean_start:  # the old session ends now, and with it the delay
                self._capture_will(pending[1])
        client, present = self.store.open(cid, req.clean_start, req.expiry_s, time.time(),
                                          req.protocol_level)
        conn.client = client
        self.clients[cid] = conn
        log.info("open %s client=%s v=%s remote=%s%s clean=%d keepalive=%d session_present=%d "
                 "user=%s", conn.conn_id, cid, version_name(req.protocol_level), conn.remote,
                 " tls" if conn.tls else "", req.clean_start, session.keepalive, present,
                 "yes" if req.username is not None else "no")
        self.perform(conn, session.accept(client, present, self.loop.time()))
        self.account(conn)
        self._arm(conn)

    # ------------------------------------------------------------ wills
    def _will(self, w: WillMessage) -> None:
        if w.delay_s <= 0 or self._stopping:
            self._capture_will(w)
            return
        old = self.pending_wills.pop(w.client_id, None)
        if old is not None:
            old[0].cancel()
            self._capture_will(old[1])
        handle = self.loop.call_later(w.delay_s, self._will_due, w.client_id)
        self.pending_wills[w.client_id] = (handle, w)

    def _will_due(self, client_id: str) -> None:
        pending = self.pending_wills.pop(client_id, None)
        if pending is not None:
            self._capture_will(pending[1])

    def _capture_will(self, w: WillMessage) -> None:
        try:
            self.log.append(w.conn_id, w.key, w.frame, w.headers)
        except CaptureError as exc:
            self.log_failed(exc)
            return
        log.info("%s client=%s: will captured (%d bytes)", w.conn_id, w.client_id, len(w.frame))

    # ------------------------------------------------------------ timers
    def _arm(self, conn: _Conn) -> None:
        deadline = conn.session.deadline
        if deadline is None:
            if conn.timer is not None:
                conn.timer.cancel()
                conn.timer = None
            return
        if conn.timer is not None and conn.timer_at <= deadline:
            return  # fires earlier; re-armed then
        if conn.timer is not None:
            conn.timer.cancel()
        conn.timer_at = deadline
        conn.timer = self.loop.call_at(deadline, self._tick, conn)

    def _tick(self, conn: _Conn) -> None:
        conn.timer = None
        if conn.transport is None:
            return
        actions = conn.session.tick(self.loop.time())
        if actions:
            self.perform(conn, actions)
        self._arm(conn)

    # ------------------------------------------------------------ snapshots
    def _configure_store(self) -> None:
        e = self.edge
        self.store.configure(e.persistent_session_expiry_s, e.max_persistent_sessions,
                             e.max_stored_qos2_ids)

    def _expire_sessions(self) -> None:
        """Drop expired sessions, then those beyond the store's bounds (logged)."""
        gone = self.store.expire(time.time())
        if gone:
            log.info("%d persistent sessions expired (first: client=%s)", len(gone), gone[0])
        dropped = self.store.bound()
        if dropped:
            e = self.edge
            log.warning("%d persistent sessions dropped, the longest disconnected first, with %d "
                        "QoS 2 ids awaiting PUBREL: over edge.max_persistent_sessions = %d or "
                        "edge.max_stored_qos2_ids = %d (first: client=%s); a PUBREL for a "
                        "dropped id gets PUBCOMP 0x92 (MQTT 5), a re-sent PUBLISH is captured "
                        "again", len(dropped), sum(n for _c, n in dropped),
                        e.max_persistent_sessions, e.max_stored_qos2_ids, dropped[0][0])

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            self._expire_sessions()
            if self.log.next_seq != self._snapshot_seq:
                try:
                    await self.snapshot()
                except Exception as exc:  # keep serving; the next snapshot retries
                    log.error("edge session snapshot failed: %s", exc)

    def owed_wills(self) -> dict[str, dict]:
        """The Wills a crash now would leave owed, as the snapshot stores
        them: delayed Wills still pending, and the Will of every open
        connection (see ``bridge.edge.persist``)."""
        out = {cid: w.to_json() for cid, (_handle, w) in self.pending_wills.items()}
        for conn in self.conns:
            w = conn.session.owed_will() if conn.session is not None else None
            if w is not None:
                out[w.client_id] = w.to_json()
        return out

    async def snapshot(self) -> None:
        """Write the persistent sessions with the capture offsets they reflect,
        once everything appended so far is durable (expired sessions and
        those beyond the store's bounds dropped first)."""
        self._expire_sessions()
        doc = self.store.to_json()
        wills = self.owed_wills()
        offsets = self.log.next_offsets()
        seq = self.log.next_seq
        state_dir = self.config.edge_state_dir
        stream = self.log.stream

        def work() -> None:
            self.log.flush()
            write_snapshot(state_dir, doc, offsets, stream, wills)

        await asyncio.to_thread(work)
        self._snapshot_seq = seq

    # ------------------------------------------------------------ shutdown
    async def serve_until_stopped(self) -> None:
        """Wait until :meth:`stop` is called or the capture log fails."""
        await self.stopped.wait()

    def stop(self) -> None:
        """Ask :meth:`serve_until_stopped` to return (thread-safe via the loop)."""
        self.stopped.set()

    async def shutdown(self) -> None:
        """Graceful shutdown (see the module docstring). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        for srv in self._servers:
            srv.close()
        conns = list(self.conns)
        for c in conns:
            c.pause("shutdown")
        for c in conns:
            if c.transport is not None:
                self.perform(c, c.session.shutdown())
        for _cid, (handle, w) in list(self.pending_wills.items()):
            handle.cancel()
            self._capture_will(w)
        self.pending_wills.clear()
        if self.failed is None:
            try:
                await asyncio.to_thread(self.log.flush)
            except CaptureError as exc:
                self.log_failed(exc)
        for c in list(self.conns):
            c.drain()
        try:
            await asyncio.wait_for(self._idle.wait(), self.edge.shutdown_grace_s)
        except asyncio.TimeoutError:
            log.warning("edge shutdown: %d connections still open after %.1f s; aborting them",
                        len(self.conns), self.edge.shutdown_grace_s)
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.abort()
        for _ in range(100):  # let connection_lost callbacks run
            if not self.conns:
                break
            await asyncio.sleep(0.01)
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
        if self._frame_task is not None:
            self._frame_task.cancel()
        if self.auth is not None:
            self.auth.close()
        if self.forward is not None:
            self.forward.stop()
        if self.failed is None:
            try:
                await self.snapshot()
            except Exception as exc:
                log.error("edge session snapshot at shutdown failed: %s", exc)
        for srv in self._servers:
            await srv.wait_closed()
        if self._own_log and self.log is not None:
            await asyncio.to_thread(self.log.close)
        log.info("edge stopped: %d connections served, %d refused",
                 self.stats["connections"], self.stats["refused"])


class EdgeThread:
    """Run an :class:`EdgeServer` on its own event loop in a thread (tests,
    benchmarks, embedding). ``with EdgeThread(config) as edge: edge.port``."""

    def __init__(self, config: Config, *, log: CaptureLog | None = None,
                 start_timeout: float = 30.0) -> None:
        self.config = config
        self.server = EdgeServer(config, log=log)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lakegate-edge", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._start_timeout = start_timeout

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._started.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        try:
            await self.server.start()
        finally:
            self._started.set()
        await self.server.serve_until_stopped()
        await self.server.shutdown()

    def start(self) -> EdgeThread:
        self._thread.start()
        if not self._started.wait(self._start_timeout):
            raise TimeoutError("the edge did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args, timeout: float = 30.0):
        """Run ``fn(*args)`` on the edge's loop (coroutine functions are awaited)."""
        async def run():
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self.server.stop)
            except RuntimeError:
                pass
            self._thread.join(timeout)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def tls_port(self) -> int | None:
        return self.server.tls_port

    def __enter__(self) -> EdgeThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

