"""The edge as one member of a cluster on Kafka (``cluster.edges`` > 1;
``docs/cluster.md``).

Every edge of a cluster has the same configuration but ``cluster.edge_id``
and writes only its own partitions of the shared capture topic (p %
``cluster.edges`` == ``edge_id``), so each partition keeps one writer and
its offsets stay predictable (``bridge.capture.kafka_log``). Each edge
follows the other edges' partitions (:class:`~bridge.capture.kafka_tail.KafkaTail`,
from the offsets its start-up replay ended at) and applies each record on
its event loop:

* **messages**: an accepted PUBLISH or Will (not rejected, not a QoS 2
  re-send marked ``dup``) is routed to this edge's sessions exactly as a
  local one (QoS downgrade, No Local by the publisher's Client Identifier,
  Retain As Published, Subscription Identifiers, one copy for overlapping
  subscriptions, the ACL's read check, expiry counted from the record's
  receive time) and, with RETAIN 1, taken by the retained store. A record
  reaches this edge only below Kafka's high watermark: every in-sync
  replica has it and its edge was told it is durable. Each edge delivers
  to its own connections only, so no subscriber gets a message twice
  because two edges read it; a partition is read in order, so each
  publisher's order holds on every edge;
* **sessions**: every edge keeps every persistent session of the cluster
  (:mod:`bridge.edge.applier`): subscriptions, the outbox with the Packet
  Identifiers the connected edge journaled (``sent`` records), inbound QoS
  2 state, from the records of whichever edge the client is connected to;
* **take-over**: an accepted CONNECT of a Client Identifier connected here
  takes that connection over [MQTT-3.1.4-3] (MQTT 5: DISCONNECT 0x8E),
  unless this edge's CONNECT of it has the higher capture sequence (the
  later CONNECT wins, on every edge alike); a delayed Will of the client
  pending here is cancelled (Clean Start: published now), as on one edge;
* **moving a session** (Clean Start 0 on edge B while edge A holds the
  connection): B appends a ``claim`` record; A closes its connection (0x8E)
  and appends a ``release`` record after the connection's last record; B
  waits for it, then for the fence (below), and answers the CONNECT with
  the session as every record of it left it: nothing acknowledged is lost
  and QoS 2 stays exactly once. If A is dead (no beat for
  ``cluster.lease_s``), B goes on without it;
* **beats and the lease**: each edge appends a ``beat`` record every tenth
  of ``cluster.lease_s``; the others see who is alive, with their
  connections and lag. An edge that had no beat confirmed for half the
  lease closes every connection (0x9C Use another server) and refuses
  CONNECTs until one is, so it never serves a session that another edge
  may take once this one is declared dead [LG-cluster-lease]. The sessions
  of a dead edge are closed where they are kept, and its owed Wills are
  published by the live edge with the lowest id, after their delay;
* **shared subscriptions** ``$share/{group}/{filter}``: the edge that
  captured a message chooses, among the live edges with members of the
  group (itself if it serves one, the others as their beats say), one by
  the message's coordinates; another edge is named in a ``share`` record
  after the message in its partition. The chosen edge gives it to one of
  its members, round robin. So each message
  goes to one member across the cluster; a member's edge that dies takes
  no later message (its beats stop), and a persistent member's queued ones
  move with its session;
* **the fence**: a SUBSCRIBE, and a CONNECT that resumes a session, waits
  (its connection's reading paused) until this edge has applied every
  record the other edges' partitions held when it arrived (their high
  watermarks, read after it came; one read serves every request that came
  before it started). So a client that subscribes here after a retained
  publish on another edge was acknowledged gets it, and a topic cleared
  there is served by no edge. It costs one round trip to Kafka plus the
  feed's lag; a read that fails lets the request go on (said once);
* the record's capture sequence moves this edge's clock past it
  (``KafkaCaptureLog.observe_seq``): a retained publish made here after
  seeing another edge's wins over it in the table and in every edge's
  store.

:class:`ClusterFeed` is a part of :class:`~bridge.edge.server.EdgeServer`
and works on its attributes.

One piece: the feed, the fence, the claims and the beats are one protocol
over the same state -- the applied positions (``feed_done``), the members'
beats, the waiting requests -- and each step of a move depends on the
others': a claim is answered by a release only while the beats are
confirmed, the release is trusted only after the fence, and a dead edge's
sessions are taken only once its beats stopped.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
import zlib

from bridge.capture.errors import CaptureError
from bridge.edge import rules as edge_rules
from bridge.edge.actions import WillMessage
from bridge.edge.applier import LogApplier
from bridge.edge.journal import message_of_record, record_headers
from bridge.mqtt import Connect
from bridge.mqtt.codec import decode_packet

__all__ = ["ClusterFeed", "remote_partitions"]

log = logging.getLogger("bridge.edge")

#: a claimed session's edge gets this long past its lease to release it, then the CONNECT is refused
MOVE_GRACE_S = 5.0
#: messages of other edges kept for a Shared Subscription choice that may name this edge
SHARE_PENDING = 20000


def remote_partitions(config) -> list[int]:
    """The partitions of the shared topic the other edges write ([] outside a cluster)."""
    cl = config.cluster
    if cl.edges <= 1:
        return []
    return [p for p in range(config.capture.partitions) if p % cl.edges != cl.edge_id]


class ClusterFeed:
    """The cluster side of the :class:`~bridge.edge.server.EdgeServer` (module docstring)."""

    # ------------------------------------------------------------ start, stop
    def _start_feed(self, end: list[int], applier: LogApplier | None) -> None:
        """Follow the other edges' partitions from ``end`` (where the start-up
        replay ended), with the replay's ``applier`` (a new one when the
        replay made none)."""
        from bridge.capture.kafka_tail import KafkaTail

        cl = self.config.cluster
        remote = remote_partitions(self.config)
        clock = time.time() - self.loop.time()
        if applier is None:
            applier = LogApplier(self.store, self.router, clock_offset=clock,
                                 max_inflight=self.edge.max_inflight_messages, cluster=(cl.edges, cl.edge_id))
            for cid, s in self.store.sessions.items():
                if s.connected and s.home is not None:
                    applier.live[cid] = s
        applier.wills = None  # this edge's owed Wills are its timers (pending_wills)
        self.applier = applier
        #: partition -> the next offset this edge's loop has applied (snapshots record it)
        self.feed_done = {p: end[p] for p in remote}
        self.feed_stats = {"records": 0, "messages": 0, "takeovers": 0, "moves_in": 0, "moves_out": 0,
                           "dead_edges": 0, "shared_out": 0, "shared_in": 0, "shared_unserved": 0}
        self._feed_clock = clock
        #: edge id -> {"seen": wall time of its last beat, "info": what it said}
        self.members: dict[int, dict] = {}
        self._started_wall = time.time()
        self._dead: set[int] = set()
        self._beat_ok = time.monotonic()  # the last beat Kafka confirmed
        self._beat_version = -1  # the subscription tree's version the last beat described
        self._beat_clients = -1  # ...and the number of connected clients
        self.fenced = False
        self._fence_next: list = []   # callbacks: requests waiting for the next watermark read
        self._fence_wait: list = []   # (watermarks, callbacks): read, not yet applied here
        self._fence_task: asyncio.Task | None = None
        self._fence_said: str | None = None
        self._releases: dict[str, asyncio.Future] = {}  # client id -> the release this edge waits for
        #: other edges' messages that match a Shared Subscription here: ref -> message, until a
        #: ``share`` record names this edge for them (or SHARE_PENDING newer ones push them out)
        self._share_pending: collections.OrderedDict = collections.OrderedDict()
        self.router.share_here = self._share_here
        self.router.share_choose = self._share_choose
        loop = self.loop
        self.feed = KafkaTail(self.config, dict(self.feed_done),
                              lambda rs: loop.call_soon_threadsafe(self._feed, rs),
                              name=f"edge{cl.edge_id}-cluster-tail")
        self.feed.start()
        self._beat_task = loop.create_task(self._beats())
        log.info("cluster edge %d of %d: writing partitions %s, following partitions %s from offsets %s; "
                 "%d sessions of other edges kept", cl.edge_id, cl.edges, self.log.own, remote,
                 [self.feed_done[p] for p in remote], len(applier.live))

    def _stop_feed(self) -> None:
        if self.feed is not None:
            self._beat_task.cancel()
            self.feed.close()

    # ------------------------------------------------------------ records
    def _feed(self, records: list) -> None:
        """Apply records of the other edges, on the loop (module docstring)."""
        if self._stopping:
            return
        router = self.router
        retained = self.retained
        done = self.feed_done
        app = self.applier
        targets: dict[int, object] = {}
        top = -1
        clock = self._feed_clock
        for r in records:
            done[r.partition] = r.offset + 1
            if r.seq > top:
                top = r.seq
            v = r.value
            if not v:
                self._edge_record(r)
                continue
            ptype = v[0] >> 4
            if ptype == 3:
                h = record_headers(r)
                if h.get("dup") == b"1" or "reject" in h:
                    continue
                origin = h.get("origin", b"client")
                retain = v[0] & 1 and retained is not None
                if router.tree or retain:
                    msg = message_of_record(r, clock, h) if origin in (b"client", b"will") else None
                    if msg is not None:
                        self.feed_stats["messages"] += 1
                        if retain:
                            retained.capture(msg.topic, r.seq, (r.partition, r.offset), msg)
                        if router.tree:
                            m = router.tree.match(msg.topic)
                            if m:
                                # Shared Subscriptions: the publisher's edge chose (a share record)
                                got = router.deliver(msg, m, self._connected, shared=False)
                                for t in got:
                                    targets[id(t)] = t
                                if got and app.unmatched:
                                    app.routed([t.client_id for t in got])
                                if m.shared:
                                    pend = self._share_pending
                                    pend[(r.partition, r.offset)] = msg
                                    if len(pend) > SHARE_PENDING:
                                        pend.popitem(last=False)
                if origin == b"will" or (v[0] >> 1) & 3 == 2:
                    app.apply(r, route=False)  # a captured Will ends it; QoS 2: the inbound state
            elif ptype == 1:
                if self._feed_connect(r):
                    app.apply(r)
            elif r.key.decode("utf-8", "replace") in app.live:
                # acknowledgements, SUBSCRIBE, PUBREL, DISCONNECT: only those of a persistent
                # session connected through another edge change what this edge keeps (most
                # are a clean session's subscriber acknowledging: skipped without parsing)
                app.apply(r)
        self.feed_stats["records"] += len(records)
        if top >= 0:
            observe = getattr(self.log, "observe_seq", None)
            if observe is not None:
                observe(top)
        if targets:
            self._pump_all(targets.values())
        if self._fence_wait:
            self._fence_check()

    def _feed_connect(self, r) -> bool:
        """Another edge accepted a CONNECT: a connection here with that
        Client Identifier is taken over [MQTT-3.1.4-3]; a delayed Will of
        it pending here ends. False: the CONNECT changes nothing here (a
        refused one, or one older than this edge's connection of the
        client, which is the one that stays)."""
        h = record_headers(r)
        if "reject" in h:
            return False
        cid = r.key.decode("utf-8", "replace")
        conn = self.clients.get(cid)
        if conn is not None and conn.session is not None and r.seq < conn.connect_seq:
            return False
        if conn is not None and conn.session is not None and r.seq > conn.connect_seq:
            self.feed_stats["takeovers"] += 1
            log.info("%s client=%s: taken over by a connection to edge %d", conn.conn_id, cid,
                     r.partition % self.config.cluster.edges)
            self._take_over(conn)
        if cid in self.pending_wills:
            try:
                p, _ = decode_packet(r.value, None)
            except Exception:  # noqa: BLE001 - the other edge accepted it
                p = None
            self._new_connection_of(cid, isinstance(p, Connect) and p.clean_start)
        return True

    def _edge_record(self, r) -> None:
        """Another edge's own record (header ``edge``)."""
        h = record_headers(r)
        kind = h.get("edge")
        edge = r.partition % self.config.cluster.edges
        if kind == b"beat":
            try:
                info = json.loads(h.get("edge_info", b"{}"))
            except ValueError:
                info = {}
            self.members[edge] = {"seen": r.timestamp_us / 1e6, "info": info}
            if edge in self._dead:
                self._dead.discard(edge)
                log.info("cluster: edge %d beats again", edge)
            return
        if kind == b"claim":
            if h.get("claim_of") == str(self.config.cluster.edge_id).encode():
                self._release(r.key.decode("utf-8", "replace"), edge)
            return
        if kind == b"share":
            if h.get("share_to") == str(self.config.cluster.edge_id).encode():
                self._shared_in(h)
            return
        self.applier.apply(r)
        if kind == b"release":
            fut = self._releases.get(r.key.decode("utf-8", "replace"))
            if fut is not None and not fut.done() and h.get("release_to") == \
                    str(self.config.cluster.edge_id).encode():
                fut.set_result(True)

    # ------------------------------------------------------------ moving sessions
    def _release(self, cid: str, to: int) -> None:
        """Edge ``to`` claims ``cid``'s session: close the connection here (if
        any) and append the release after its last record."""
        conn = self.clients.get(cid)
        key = f"edge{self.config.cluster.edge_id}"
        if conn is not None and conn.session is not None:
            key = conn.conn_id
            log.info("%s client=%s: its session moves to edge %d", conn.conn_id, cid, to)
            self.feed_stats["moves_out"] += 1
            self._take_over(conn)
        self._edge_append(key, cid, b"release", [("release_to", str(to).encode())])

    def _edge_append(self, partition_key: str, cid: str, kind: bytes, extra: list):
        """Append one of this edge's own records (``edge`` = ``kind``); its ack, or None when the log failed."""
        headers = [("conn_id", f"edge{self.config.cluster.edge_id}".encode()), ("edge", kind),
                   ("edge_id", str(self.config.cluster.edge_id).encode()), *extra]
        try:
            return self.log.append(partition_key, cid.encode(), b"", headers)
        except CaptureError as exc:
            self.log_failed(exc)
            return None

    def needs_move(self, cid: str) -> int | None:
        """The edge ``cid``'s session is connected on, when not this one."""
        s = self.store.sessions.get(cid)
        if s is None or not s.connected or s.home is None:
            return None
        return s.home

    async def move_in(self, conn, cid: str) -> bool:
        """Before a CONNECT with Clean Start 0 is decided: this edge has
        applied everything of the session (module docstring, moving a
        session). False: it could not be had (refuse the CONNECT)."""
        conn.pause("move")
        try:
            await self.fence()  # what the other edges had captured when it came
            home = self.needs_move(cid)
            if home is not None:
                fut = self._releases.get(cid)
                if fut is None or fut.done():
                    fut = self._releases[cid] = self.loop.create_future()
                ack = self._edge_append(conn.conn_id, cid, b"claim", [("claim_of", str(home).encode())])
                if ack is None:
                    return False
                lease = self.config.cluster.lease_s
                deadline = time.monotonic() + lease + MOVE_GRACE_S
                while not fut.done():
                    if self.edge_dead(home):
                        log.warning("%s client=%s: edge %d is dead (no beat for %g s): its session is taken "
                                    "without a release", conn.conn_id, cid, home, lease)
                        self._declare_dead(home)
                        break
                    if time.monotonic() > deadline or conn.transport is None:
                        return False
                    try:
                        await asyncio.wait_for(asyncio.shield(fut), 0.25)
                    except asyncio.TimeoutError:
                        pass
                self._releases.pop(cid, None)
                await self.fence()  # the session's records on every partition of that edge
                self.feed_stats["moves_in"] += 1
                log.info("%s client=%s: session moved in from edge %d", conn.conn_id, cid, home)
            s = self.store.sessions.get(cid)
            if s is not None:
                self.applier.live.pop(cid, None)
                s.home = None
                if s.connected:
                    self.store.close(s, time.time())
                if s.outbox is not None:
                    s.outbox.renumber()
            return True
        finally:
            conn.resume("move")

    # ------------------------------------------------------------ shared subscriptions
    def _share_here(self, cid: str) -> bool:
        """A Shared Subscription member this edge serves: its session is
        connected here, or was last (not kept for another edge)."""
        s = self.router.sessions.get(cid)
        return s is not None and s.home is None

    def _share_choose(self, group, msg) -> bool:
        """Which edge gives a message captured here to a member of the
        shared ``group``: among the live edges with members of it (this one
        if it serves one, the others as their beats say), the one the
        message's coordinates pick. True: this edge; else that edge is
        named in a ``share`` record after the message in its partition."""
        ref = msg.ref
        own = self.log.own
        if ref is None or own is None or ref[0] not in own:
            return True  # not captured by this edge (a retained or AMQP message): its own members
        key = group.key
        me = self.config.cluster.edge_id
        here = self._share_here
        alive = [(e, m["info"]) for e, m in self.members.items() if e != me and not self.edge_dead(e)]
        # edges with a connected member first (MQTT 5.0 4.8.2: prefer those), else with any
        edges = [e for e, info in alive if key in info.get("shared", ())]
        if any(here(cid) and cid in self.clients for cid in group.members):
            edges.append(me)
        if not edges:
            edges = [e for e, info in alive if key in info.get("shared_offline", ())]
            if any(here(cid) for cid in group.members):
                edges.append(me)
        edges.sort()
        if not edges:
            self.feed_stats["shared_unserved"] += 1
            return False
        to = edges[zlib.crc32(b"%d:%d" % ref) % len(edges)]
        if to == me:
            return True
        try:
            self.log.append("", msg.origin.encode(), b"", [
                ("conn_id", f"edge{me}".encode()), ("edge", b"share"), ("edge_id", str(me).encode()),
                ("share_to", str(to).encode()), ("share_ref", b"%d:%d" % ref), ("share_group", key.encode())],
                partition=ref[0])
        except CaptureError as exc:
            self.log_failed(exc)
            return False
        self.feed_stats["shared_out"] += 1
        return False

    def _shared_in(self, h: dict) -> None:
        """Another edge chose this one for a shared message (``share`` record)."""
        p, o = (int(x) for x in h.get("share_ref", b"0:0").split(b":"))
        msg = self._share_pending.pop((p, o), None)
        key = h.get("share_group", b"").decode()
        if msg is None:
            self.feed_stats["shared_unserved"] += 1
            log.warning("cluster: a shared message (partition %d offset %d, group %s) for this edge is no "
                        "longer kept here (over %d newer ones); not delivered", p, o, key, SHARE_PENDING)
            return
        m = self.router.tree.match(msg.topic)
        for group in m.shared:
            if group.key == key:
                s = self.router.deliver_group(msg, group, self._connected)
                if s is not None:
                    self.feed_stats["shared_in"] += 1
                    self._pump_all([s])
                    return
        self.feed_stats["shared_unserved"] += 1  # its members left this edge meanwhile

    def shared_groups_here(self) -> tuple[list[str], list[str]]:
        """The shared groups with a member this edge serves: (those with a
        connected member, those with only disconnected ones); its beats
        say so."""
        live, offline = set(), set()
        router = self.router
        clients = self.clients
        for cid, s in router.sessions.items():
            if s.home is None:
                for sub in router.tree.subscriptions(cid):
                    tf = sub.topic_filter
                    if tf.startswith("$share/"):
                        (live if cid in clients else offline).add(tf[7:])
        return sorted(live), sorted(offline - live)

    # ------------------------------------------------------------ beats, the lease
    def edge_dead(self, edge: int) -> bool:
        """No beat from ``edge`` for ``cluster.lease_s`` (since this edge started, if none yet)."""
        m = self.members.get(edge)
        seen = m["seen"] if m is not None else self._started_wall
        return time.time() - seen > self.config.cluster.lease_s

    async def _beats(self) -> None:
        lease = self.config.cluster.lease_s
        every = max(lease / 10, 0.05)
        me = self.config.cluster.edge_id
        last_said = None
        while True:
            try:
                shared, shared_offline = self.shared_groups_here()
                self._beat_version = self.router.tree.version
                self._beat_clients = len(self.clients)
                info = json.dumps({"connections": len(self.clients), "lag": self.feed.lag(),
                                   "port": self.port if self.addresses else 0, "host": self.edge.host,
                                   "shared": shared, "shared_offline": shared_offline}).encode()
                ack = self._edge_append(f"edge{me}", "", b"beat", [("edge_info", info)])
                if ack is not None:
                    ack.future.add_done_callback(self._beat_confirmed)
                quiet = time.monotonic() - self._beat_ok
                if quiet > lease / 2 and not self.fenced:
                    self.fenced = True
                    log.error("cluster lease: no beat confirmed by Kafka for %.1f s (half of cluster.lease_s); "
                              "closing %d connections, refusing new ones until Kafka confirms one "
                              "[%s]", quiet, len(self.clients), edge_rules.CLUSTER_LEASE)
                    for conn in list(self.conns):
                        if conn.session is not None and conn.transport is not None:
                            self._end_client(conn)
                            self.perform(conn, conn.session.lease_lost())
                elif quiet <= lease / 2 and self.fenced:
                    self.fenced = False
                    log.info("cluster lease: beats confirmed again; accepting connections")
                for edge in range(self.config.cluster.edges):
                    if edge != me and edge not in self._dead and self.edge_dead(edge):
                        self._declare_dead(edge)
                # the newest CONNECT of each client is kept 10 minutes (the applier's stale-record rule)
                self.applier.prune_conns(int((time.time() - 600) * 1e6) << 8)
                last_said = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - supervised: the next beat tries again
                said = f"{type(exc).__name__}: {exc}"
                if said != last_said:
                    log.error("cluster beat failed (retried): %s", said)
                last_said = said
            # the next beat after ``every``, or sooner when the subscriptions changed (a new
            # shared member is known to the other edges within a tenth of a second)
            until = time.monotonic() + every
            while time.monotonic() < until:
                await asyncio.sleep(min(0.1, every))
                if self.router.tree.version != self._beat_version or len(self.clients) != self._beat_clients:
                    break

    def _beat_confirmed(self, fut) -> None:
        if fut.exception() is None:
            self._beat_ok = time.monotonic()  # (a float store: safe from the poller's thread)
            self.members[self.config.cluster.edge_id] = {"seen": time.time(), "info": {}}

    def _declare_dead(self, edge: int) -> None:
        """``edge`` is dead: the sessions connected through it are closed here,
        and its owed Wills are published by the live edge with the lowest id."""
        if edge in self._dead:
            return
        self._dead.add(edge)
        self.feed_stats["dead_edges"] += 1
        m = self.members.get(edge)
        seen = m["seen"] if m is not None else self._started_wall
        app = self.applier
        closed = 0
        for cid, s in list(app.live.items()):
            if s.home == edge:
                self.store.close(s, seen)
                del app.live[cid]
                closed += 1
        me = self.config.cluster.edge_id
        heir = min((e for e in range(self.config.cluster.edges) if e not in self._dead and
                    (e == me or not self.edge_dead(e))), default=me)
        wills = [(cid, w) for cid, (e, w) in app.remote_wills.items() if e == edge]
        for cid, _w in wills:
            del app.remote_wills[cid]
        if heir == me:
            for _cid, w in wills:
                self._will(WillMessage(w.client_id, w.key, w.conn_id, w.frame, w.headers,
                                       max(0, w.delay_s - (time.time() - seen))))
        log.warning("cluster: edge %d declared dead (no beat for %g s): %d of its sessions closed here, "
                    "%d Wills %s", edge, self.config.cluster.lease_s, closed, len(wills),
                    "published by this edge after their delay" if heir == me else f"left to edge {heir}")

    # ------------------------------------------------------------ the fence
    def fence(self) -> asyncio.Future:
        """A future done once this edge has applied what the other edges'
        partitions held now (module docstring)."""
        fut = self.loop.create_future()
        self._fence_request(lambda: fut.done() or fut.set_result(True))
        return fut

    def _fence_request(self, done) -> None:
        self._fence_next.append(done)
        if self._fence_task is None or self._fence_task.done():
            self._fence_task = self.loop.create_task(self._fence_rounds())

    def subscribe_gate(self, conn):
        """The gate a session calls before each SUBSCRIBE (module docstring)."""
        def gate(_session) -> bool:
            if self.retained is None or self._stopping:
                return True  # no retained messages: nothing to wait for
            conn.pause("fence")
            self._fence_request(lambda: self._open_gate(conn))
            return False
        return gate

    async def _fence_rounds(self) -> None:
        while self._fence_next:
            batch, self._fence_next = self._fence_next, []
            try:
                marks = await asyncio.to_thread(self.feed.watermarks)
                self._fence_said = None
            except Exception as exc:  # noqa: BLE001 - Kafka not answering: go on with what this edge has
                said = f"{type(exc).__name__}: {exc}"
                if said != self._fence_said:
                    self._fence_said = said
                    log.warning("cluster fence: the other edges' watermarks could not be read (%s); "
                                "requests go on with what this edge has read", said)
                marks = {}
            self._fence_wait.append((marks, batch))
            self._fence_check()

    def _fence_check(self) -> None:
        done = self.feed_done
        keep = []
        for marks, batch in self._fence_wait:
            if all(done.get(p, 0) >= o for p, o in marks.items()):
                for release in batch:
                    release()
            else:
                keep.append((marks, batch))
        self._fence_wait = keep

    @staticmethod
    def _open_gate(conn) -> None:
        session = conn.session
        if session is not None:
            session.open_gate()
        conn.resume("fence")
        conn.work_if_pending()

    # ------------------------------------------------------------ reporting
    def feed_offsets(self, offsets: list[int]) -> list[int]:
        """``offsets`` (the log's next offsets) with the followed partitions'
        applied positions in place of the log's (what a snapshot reflects)."""
        done = getattr(self, "feed_done", None)
        if not done:
            return offsets
        out = list(offsets)
        for p, o in done.items():
            out[p] = o
        return out

    def cluster_status(self) -> dict | None:
        """For ``lakegate status`` and ``/metrics``: this edge's place in the
        cluster, the members it sees and how far it is behind the other
        edges' partitions (None outside a cluster)."""
        feed = self.feed
        if feed is None:
            return None
        cl = self.config.cluster
        now = time.time()
        members = {}
        for e in range(cl.edges):
            m = self.members.get(e)
            members[e] = {"alive": e == cl.edge_id and not self.fenced or (e != cl.edge_id and not self.edge_dead(e)),
                          "beat_age_s": round(now - m["seen"], 3) if m else None,
                          **(m["info"] if m else {})}
        members[cl.edge_id].update({"connections": len(self.clients), "lag": feed.lag()})
        return {"edge_id": cl.edge_id, "edges": cl.edges, "own_partitions": list(self.log.own or ()),
                "followed": dict(self.feed_done), "lag_records": feed.lag(), "fenced": self.fenced,
                "members": members, "sessions_elsewhere": len(self.applier.live), **self.feed_stats}
