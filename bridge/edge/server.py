"""The edge's network side: a thin asyncio TCP (and TLS) server.

For each connection an :class:`asyncio.Protocol`
(:class:`~bridge.edge.connection.Connection`) feeds the bytes it reads to
its :class:`~bridge.edge.session.Session` and the server performs the
actions that come back, in order:

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
  session lookup; then ``Session.accept`` (:mod:`bridge.edge.connecting`).
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

Incomplete frames: one that stays incomplete for ``edge.frame_timeout_s``
closes its connection [LG-edge-frame-timeout]; over
``edge.max_buffered_bytes`` in all, the oldest one's [LG-edge-buffer-budget].

Shutdown (:meth:`EdgeServer.shutdown`): stop accepting, stop reading, send
DISCONNECT 0x8B to MQTT 5 clients behind their pending acknowledgements,
capture the Wills (pending delayed Wills too), fsync the log, close the
connections (waiting at most ``edge.shutdown_grace_s``), write the session
snapshot, close the log.

One log line per connection open (client id, version, remote address) and
close (the same plus the reason); never payloads or passwords.

Modules, along the data flow (this one holds the listeners, the connection
lifecycle, performing actions, back-pressure, the per-connection timers and
shutdown; :class:`EdgeServer` is composed of the parts below):

* :mod:`bridge.edge.connection` -- one connection: reading, pausing, the
  ordered outbound queue;
* :mod:`bridge.edge.connecting` -- the CONNECT decision
  (:class:`~bridge.edge.connecting.ConnectDecision`): password check,
  anonymous access, take-over, the session from the store, and back to it;
* :mod:`bridge.edge.acks` -- acknowledgements on group-commit futures
  (:class:`~bridge.edge.acks.DurableAcks`) and on forwarded marks
  (:class:`ForwardWaiter`);
* :mod:`bridge.edge.incomplete` -- incomplete frames: the frame time limit
  and the buffered-bytes budget;
* :mod:`bridge.edge.housekeeping` -- delayed Wills, session expiry and
  bounds, snapshots;
* :mod:`bridge.edge.retained.serving` -- the retained store (retained
  messages on SUBSCRIBE from the lakehouse): loaded at start, refreshed;
* :mod:`bridge.edge.thread` -- :class:`EdgeThread` (importable from here too).

One piece: with the parts above taken out, what is left is the server's
own life and the one place where actions are carried out. ``shutdown``
undoes what ``start`` set up (listeners, tasks, the auth queue, the
downlink, the forward waiter, the log it opened, the collector's tuning);
the connection's callbacks, the timers, the CONNECT decision and the
fan-out all end in :meth:`EdgeServer.perform`; and it, the connection
lifecycle and shutdown work on the same connection set, client table and
counters, set up in ``__init__``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import Future

from bridge.capture import CaptureLog, open_capture_log, open_reader
from bridge.capture.errors import CaptureError, RecordTooLargeError
from bridge.config import Config, ConfigError
from bridge.edge import rules as edge_rules
from bridge.edge.acks import DurableAcks, ForwardWaiter
from bridge.edge.acl import AclFileError, AclWatcher
from bridge.edge.admission import AuthQueue
from bridge.edge.auth import PasswordFile
from bridge.edge.cluster import ClusterFeed
from bridge.edge.connecting import ConnectDecision
from bridge.edge.connection import Connection, remote_address
from bridge.edge.fanout import FanOut
from bridge.edge.gc_tuning import tune_gc, untune_gc
from bridge.edge.housekeeping import SessionHousekeeping
from bridge.edge.incomplete import IncompleteFrames
from bridge.edge.persist import recover
from bridge.edge.downlink import DownlinkHub
from bridge.edge.exposure import anonymous_allowed, anonymous_note
from bridge.edge.retained.serving import RetainedServing
from bridge.edge.retained.store import RetainedStore
from bridge.edge.router import Router
from bridge.edge.session import (
    Capture, Close, ConnectRequest, Limits, Notice, Send, Session, WillMessage, version_name,
)
from bridge.edge.state import SessionStore
from bridge.edge.thread import EdgeThread
from bridge.edge.tls import TlsAcceptor, identity, server_context

__all__ = ["EdgeServer", "EdgeThread", "ForwardWaiter"]

#: bytes a capture record may need beyond its frame (client id as key, headers)
#: when the log limits records (``_fit_packets_to_records``)
RECORD_HEADROOM = 4096

log = logging.getLogger("bridge.edge")

_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _plain(a: Capture) -> bool:
    """A record with no reply and no state or delivery attached."""
    return a.reply is None and a.qos2 is None and a.release is None and a.deliver is None




def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
        if not n:
            return out


class EdgeServer(DurableAcks, IncompleteFrames, SessionHousekeeping, FanOut, RetainedServing,
                 ConnectDecision, ClusterFeed):
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
        #: anonymous access as it applies (bridge.edge.exposure: beyond loopback only
        #: when set explicitly; ConfigError when neither it nor a password file is)
        self.allow_anonymous = anonymous_allowed(config)
        self.config = config
        self.edge = edge
        self.limits = Limits.from_config(edge)
        self.log = log
        self._own_log = log is None
        self.store = SessionStore()
        #: subscriptions of every session, and fan-out (bridge.edge.router)
        self.router = Router(max_queued_messages=edge.max_queued_messages,
                             max_queued_bytes=edge.max_queued_bytes)
        self._fanout_wait: dict = {}
        self._drop_seen: dict = {}
        self.passwords: PasswordFile | None = None
        self.auth: AuthQueue | None = None
        self.forward: ForwardWaiter | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conns: set[Connection] = set()
        self.clients: dict[str, Connection] = {}
        self.pending_wills: dict[str, tuple[asyncio.TimerHandle, WillMessage]] = {}
        #: a SubscriptionTree.sweep is scheduled (housekeeping.drop_session)
        self._sweeping = False
        self.addresses: list[tuple[str, int, bool]] = []
        #: the WebSocket listeners' (host, port, tls) (edge.ws_port, edge.wss_port)
        self.ws_addresses: list[tuple[str, int, bool]] = []
        #: WebSocket connections whose handshake is not over (bounded by edge.max_connections)
        self.ws_handshakes = 0
        self.failed: BaseException | None = None
        self.stopped: asyncio.Event | None = None  # created in start()
        self.stats = {"connections": 0, "refused": 0, "auth_busy": 0}
        #: counters of connections that ended (bridge.metrics adds the open ones')
        self.closed_totals = {"bytes_in": 0, "bytes_out": 0, "packets_in": [0] * 16, "packets_out": [0] * 16}
        #: frames a session was ended for, by rule id
        self.rejected: dict[str, int] = {}
        #: QoS 1/2 acknowledgement latency (queued -> written) as 16 bridge.buckets.Buckets
        #: by packet type (4 PUBACK, 5 PUBREC); None: metrics off (nothing is timed or counted by type)
        self.ack_latency: list | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._watch: dict[Future, list[Connection]] = {}
        self._throttled: set[Connection] = set()
        #: connections holding an incomplete frame, and the bytes they hold
        self._partial: set[Connection] = set()
        self.buffered_total = 0
        self._frame_task: asyncio.Task | None = None
        self._room_task: asyncio.Task | None = None
        self._snapshot_task: asyncio.Task | None = None
        self._retained_task: asyncio.Task | None = None
        #: retained messages on SUBSCRIBE (bridge.edge.retained), from start()
        self.retained: RetainedStore | None = None
        #: AMQP -> MQTT (bridge.edge.downlink), from start() when amqp.downlink
        self.downlink: DownlinkHub | None = None
        self._snapshot_seq = -1
        self._stopping = False
        self._boot = _base36(int(time.time() * 1000))
        if config.cluster.edges > 1:  # connection ids unique across the cluster
            self._boot = f"e{config.cluster.edge_id}-{self._boot}"
        self._next_conn = 0
        self._idle: asyncio.Event | None = None
        self._gc_tuned = False
        #: a cluster edge's tail of the other edges' partitions (bridge.edge.cluster)
        self.feed = None
        #: a cluster edge's records of the other edges, applied (bridge.edge.applier)
        self.applier = None
        #: a cluster edge without a confirmed lease: it serves no client [LG-cluster-lease]
        self.fenced = False

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
        if edge.acl_file:
            try:
                watcher = await asyncio.to_thread(AclWatcher, edge.acl_file)
            except (OSError, AclFileError) as exc:
                raise ConfigError("edge.acl_file", self.config.sources.get("edge.acl_file",
                                                                           "default"),
                                  str(exc)) from None
            self.router.acl = lambda: watcher.current(time.monotonic())
            log.info("edge ACL: %s (%d entries)", edge.acl_file, len(watcher.current(
                time.monotonic())))
        if edge.password_file:
            self.passwords = await asyncio.to_thread(PasswordFile, edge.password_file)
            self.auth = AuthQueue(edge.auth_workers, edge.auth_max_pending,
                                  edge.auth_max_pending_per_address, edge.auth_failure_backoff_s,
                                  self.loop.call_soon_threadsafe)
        if self.log is None:
            self.log = await asyncio.to_thread(open_capture_log, cfg)  # local files or Kafka (capture.backend)
        self._fit_packets_to_records()
        # the event loop releases the GIL at every socket call: appends need
        # not yield it to the capture log's flusher
        self.log.yield_to_flusher = False
        if self.ack_latency is not None and self.log.fsync_latency is None:  # metrics on
            from bridge.buckets import FSYNC_BUCKETS_S, Buckets

            self.log.fsync_latency = Buckets(FSYNC_BUCKETS_S)
        await self._start_retained()
        t0 = time.monotonic()
        end = self.log.next_offsets()
        reader = open_reader(cfg)
        try:
            cluster = (cfg.cluster.edges, cfg.cluster.edge_id) if cfg.cluster.edges > 1 else None
            applier: list = []
            self.store, owed_wills, replayed = await asyncio.to_thread(
                recover, cfg.edge_state_dir, reader, end, self.log.stream,
                self.router, time.time() - self.loop.time(), edge.max_inflight_messages,
                cluster, applier)
        finally:
            reader.close()  # on Kafka: its consumers
        self._configure_store()
        self._expire_sessions()
        log.info("edge sessions recovered: %d persistent sessions, %d QoS 2 ids awaiting PUBREL, "
                 "%d subscriptions, %d queued or unacknowledged deliveries, %d Wills owed, "
                 "%d capture records replayed in %.2f s", len(self.store),
                 sum(len(s.qos2) for s in self.store.sessions.values()), len(self.router.tree),
                 sum(len(s.outbox) for s in self.store.sessions.values() if s.outbox is not None),
                 len(owed_wills), replayed, time.monotonic() - t0)
        # Wills the last run owed when it died: as for connections lost just now
        for w in owed_wills.values():
            log.info("%s client=%s: will owed from before the restart (%d bytes), captured %s",
                     w.conn_id, w.client_id, len(w.frame),
                     "now" if w.delay_s <= 0 else f"in {w.delay_s} s unless the client connects")
            self._will(w)
        if cfg.cluster.edges > 1:  # the other edges' records, from where the replay ended
            self._start_feed(end, applier[0] if applier else None)
        tune_gc()
        self._gc_tuned = True
        if edge.ack_after == "forward":
            self.forward = ForwardWaiter(cfg.data_path, self.log.stream, self.log.partitions)
        note = anonymous_note(cfg)
        if note is not None:
            log.info("edge: %s", note)
        loop = self.loop
        srv = await loop.create_server(lambda: Connection(self, False), edge.host, edge.port,
                                       reuse_address=True, backlog=1024)
        self._servers.append(srv)
        ctx = None
        if edge.tls_port or edge.wss_port:  # (bridge.edge.tls: client certificates, the handshake seen)
            ctx = server_context(edge)

        def tls(make, kind: str):
            return lambda: TlsAcceptor(loop, ctx, make, kind, edge.connect_timeout_s)

        if edge.tls_port:
            tls_srv = await loop.create_server(tls(lambda: Connection(self, True), "tls"), edge.host,
                                               edge.tls_port, reuse_address=True, backlog=1024)
            self._servers.append(tls_srv)
        for s, is_tls in zip(self._servers, (False, True)):
            for sock in s.sockets:
                host, port = sock.getsockname()[:2]
                self.addresses.append((host, port, is_tls))
        for port, wss in ((edge.ws_port, False), (edge.wss_port, True)):
            if port:  # MQTT over WebSockets (bridge.edge.websocket)
                from bridge.edge.websocket import WsConnection

                make = (lambda: WsConnection(self, False)) if not wss else \
                    tls(lambda: WsConnection(self, True), "wss")
                ws = await loop.create_server(make, edge.host, port, reuse_address=True, backlog=1024)
                self._servers.append(ws)
                for sock in ws.sockets:
                    self.ws_addresses.append((*sock.getsockname()[:2], wss))
        self._snapshot_task = loop.create_task(self._snapshot_loop())
        self._frame_task = loop.create_task(self._frame_timeouts())
        self._retained_task = loop.create_task(self._retained_refresh())
        if cfg.amqp.downlink and cfg.amqp.url:  # AMQP -> MQTT (bridge.edge.downlink)
            self.downlink = DownlinkHub(self, cfg.amqp)
            self.router.on_drop = self.downlink.session_ended
            self.router.on_subscribe = self.downlink.subscribed
            self.downlink.start()
        return self.addresses

    @property
    def port(self) -> int:
        """The plain TCP listening port."""
        return next(p for _h, p, tls in self.addresses if not tls)

    @property
    def tls_port(self) -> int | None:
        return next((p for _h, p, tls in self.addresses if tls), None)

    # ------------------------------------------------------------ connections
    def _connection_made(self, conn: Connection) -> None:
        now = self.loop.time()
        self._next_conn += 1
        conn.conn_id = f"{self._boot}-{_base36(self._next_conn)}"
        peer = conn.transport.get_extra_info("peername")
        conn.remote = remote_address(peer)
        conn.host = str(peer[0]) if isinstance(peer, tuple) and peer else conn.remote
        if conn.tls and self.edge.cert_identity != "none":  # (a verified client certificate's name)
            conn.cert_identity = identity(conn.transport.get_extra_info("peercert"), self.edge.cert_identity)
        busy = len(self.conns) >= self.edge.max_connections
        conn.session = Session(conn.conn_id, conn.remote, self.limits, now, busy=busy,
                               router=self.router)
        if self.feed is not None:  # a cluster edge: SUBSCRIBE waits for the others' records
            conn.session.subscribe_gate = self.subscribe_gate(conn)
            conn.session.journal_sends = True
        self.conns.add(conn)
        self._idle.clear()
        self.stats["connections"] += 1
        if self._stopping:
            conn.session.close_reason = f"server shutting down [{edge_rules.SERVER_SHUTDOWN}]"
            conn.transport.close()
            return
        self._arm(conn)

    def _connection_lost(self, conn: Connection, exc) -> None:
        session = conn.session
        transport = conn.transport
        conn.transport = None
        if session is None:
            return
        if session.close_reason is None and self.failed is not None:  # aborted for it
            session.close_reason = f"capture log failed [{edge_rules.CAPTURE_FAILED}]"
        if exc is not None and session.close_reason is None:
            session.close_reason = f"connection lost ({type(exc).__name__}: {exc})"
        actions = session.connection_lost(self.loop.time())
        if actions:
            self.perform(conn, actions)
        conn.queue.clear()
        self._unaccount(conn)
        self._add_closed(conn, session)
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
                 "" if conn.kind == "tcp" else " " + conn.kind, session.close_reason or "connection lost",
                 session.frames_in, session.bytes_in)
        del transport

    def _add_closed(self, conn: Connection, session) -> None:
        """A connection ended: its counters join the server's (metrics)."""
        tot = self.closed_totals
        tot["bytes_in"] += session.bytes_in
        tot["bytes_out"] += conn.bytes_out
        for i, n in enumerate(session.packets_in):
            tot["packets_in"][i] += n
        for i, n in enumerate(conn.packets_out):
            tot["packets_out"][i] += n
        if session.rejected_rule is not None:
            self.rejected[session.rejected_rule] = self.rejected.get(session.rejected_rule, 0) + 1

    # ------------------------------------------------------------ actions
    def perform(self, conn: Connection, actions: list) -> None:
        """Carry out a session's actions in order (see the module docstring)."""
        append = self.log.append
        q = conn.queue
        key = conn.session.key
        fwd_mode = self.forward is not None
        i = 0
        n = len(actions)
        while i < n:
            a = actions[i]
            i += 1
            t = type(a)
            if t is Capture and a.reply is None and _plain(a) and i < n \
                    and type(actions[i]) is Capture and _plain(actions[i]):
                # a run of records that nothing waits on (a subscriber's
                # acknowledgements, mostly): appended under one lock
                j = i
                while j < n and type(actions[j]) is Capture and _plain(actions[j]):
                    j += 1
                try:
                    acks = self.log.append_many(conn.conn_id, key, [
                        (c.frame, c.headers) for c in actions[i - 1:j]])
                except RecordTooLargeError as exc:  # this record only: the log is fine
                    self._too_large(conn, exc)
                    return
                except CaptureError as exc:
                    self.log_failed(exc)
                    conn.session.close_reason = f"capture log failed [{edge_rules.CAPTURE_FAILED}]"
                    if conn.transport is not None:
                        conn.transport.abort()
                    return
                conn.last_fut = acks[-1].future
                i = j
                continue
            if t is Capture:
                try:
                    ack = append(conn.conn_id, key, a.frame,
                                 a.headers if a.release is None else a.final_headers())
                except RecordTooLargeError as exc:  # this record only: the log is fine
                    self._too_large(conn, exc)
                    return
                except CaptureError as exc:
                    self.log_failed(exc)
                    conn.session.close_reason = f"capture log failed [{edge_rules.CAPTURE_FAILED}]"
                    if conn.transport is not None:
                        conn.transport.abort()
                    return
                fut = ack.future
                conn.last_fut = fut
                if a.frame[:1] == b"\x10":
                    conn.connect_seq = ack.seq
                    if self.applier is not None:  # a cluster: older connections' records change nothing now
                        self.applier.connected_as(conn.session.client_id, ack.seq, conn.conn_id.encode())
                if a.qos2 is not None:
                    a.captured(ack.partition, ack.offset, ack.seq)
                if a.deliver is not None and (self.router.tree or a.frame[0] & 1):
                    self._route(a.frame, conn.session.level, a.deliver, conn.session.client_id,
                                ack, a.matched)
                if a.reply is not None:
                    fwd = None
                    f = a.forward
                    if fwd_mode and f is not None:
                        if f is True:
                            fwd = (ack.partition, ack.offset)
                        elif f.partition is not None:
                            fwd = (f.partition, f.offset)
                    q.append((fut, fwd, a.reply, a.quota, self.loop.time() if self.ack_latency is not None else 0.0))
            elif t is Send:
                q.append((None, None, a.data, 0, 0.0))
            elif t is Close:
                q.append((conn.last_fut, None, None, a.reason, 0.0))
            elif t is ConnectRequest:
                self._connect(conn, a)
                key = conn.session.key
            elif t is WillMessage:
                self._will(a)
            elif t is Notice:
                log.info("%s client=%s: %s", conn.conn_id, conn.session.client_id or "-", a.message)
        conn.drain()
        client = conn.client
        if client is not None and client.outbox is not None and client.outbox.more:
            self.pump_soon(conn)  # a retained replay stopped at its per-pump budget


    # ------------------------------------------------------------ back-pressure
    def log_busy(self) -> bool:
        return not self.log.has_room(0)

    def throttle(self, conn: Connection) -> None:
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

    def _fit_packets_to_records(self) -> None:
        """A capture log with a record size limit (Kafka: the topic's
        ``max.message.bytes``): the Maximum Packet Size the edge allows and
        advertises stays below it, so that a larger PUBLISH is refused as
        too large for the edge (MQTT 5: 0x95 Packet too large) before it is
        accepted, never failed at the log."""
        cap = getattr(self.log, "max_record_bytes", None)
        if cap is None or self.limits.max_packet_bytes <= cap - RECORD_HEADROOM:
            return
        fit = max(1024, cap - RECORD_HEADROOM)
        log.info("edge: Maximum Packet Size %d bytes, not edge.max_packet_bytes = %d: a capture record may be at "
                 "most %d bytes (%s), and headers and client id need up to %d [LG-capture-kafka-too-large]",
                 fit, self.limits.max_packet_bytes, cap, getattr(self.log, "_limit_what", "the log's limit"),
                 RECORD_HEADROOM)
        self.limits = dataclasses.replace(self.limits, max_packet_bytes=fit)

    def _too_large(self, conn: Connection, exc: RecordTooLargeError) -> None:
        """A record the log refuses for its size (a frame within the Maximum
        Packet Size whose headers or client id made it too large): that
        connection closes with the rule; nothing of it was acknowledged."""
        log.warning("%s client=%s: a capture record of %d bytes is over the log's limit of %d [%s]; closing the "
                    "connection", conn.conn_id, conn.session.client_id, exc.size, exc.limit, exc.rule)
        conn.session.close_reason = f"capture record too large [{exc.rule}]"
        if conn.transport is not None:
            conn.transport.abort()

    def log_failed(self, exc: BaseException) -> None:
        """The capture log cannot write: nothing more may be acknowledged.
        The server stops (the supervisor restarts it, which reopens the log)."""
        if self.failed is None:
            self.failed = exc
            log.error("capture log failed, the edge stops: %s", exc)
            if self.stopped is not None:
                self.stopped.set()

    # ------------------------------------------------------------ timers
    def _arm(self, conn: Connection) -> None:
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

    def _tick(self, conn: Connection) -> None:
        conn.timer = None
        if conn.transport is None:
            return
        actions = conn.session.tick(self.loop.time())
        if actions:
            self.perform(conn, actions)
        self._arm(conn)

    # ------------------------------------------------------------ shutdown
    async def serve_until_stopped(self) -> None:
        """Wait until :meth:`stop` is called or the capture log fails."""
        await self.stopped.wait()

    @property
    def stopping(self) -> bool:
        """True once stop() was called (no new connections)."""
        return self._stopping

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
        self._stop_feed()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
        if self._frame_task is not None:
            self._frame_task.cancel()
        if self._retained_task is not None:
            self._retained_task.cancel()
        if self.auth is not None:
            self.auth.close()
        if self.downlink is not None:  # what is unsettled is the peer's to deliver again
            await asyncio.to_thread(self.downlink.stop)
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
        if self._gc_tuned:
            self._gc_tuned = False
            untune_gc()
        log.info("edge stopped: %d connections served, %d refused",
                 self.stats["connections"], self.stats["refused"])

