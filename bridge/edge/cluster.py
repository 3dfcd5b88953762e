"""The edge as one member of a cluster on Kafka (``cluster.edges`` > 1;
``docs/cluster.md``).

Every edge of a cluster has the same configuration but ``cluster.edge_id``
and writes only its own partitions of the shared capture topic (p %
``cluster.edges`` == ``edge_id``), so each partition keeps one writer and
its offsets stay predictable (``bridge.capture.kafka_log``). Each edge
follows the other edges' partitions (:class:`~bridge.capture.kafka_tail.KafkaTail`,
from the offsets its start-up replay ended at) and, on its event loop, for
each record:

* an accepted PUBLISH or Will (not rejected, not a QoS 2 re-send marked
  ``dup``): routed to this edge's sessions exactly as a local one (QoS
  downgrade, No Local by the publisher's Client Identifier, Retain As
  Published, Subscription Identifiers, one copy for overlapping
  subscriptions, the ACL's read check, expiry counted from the record's
  receive time), and, with RETAIN 1, taken by the retained store. A
  record reaches this edge only below Kafka's high watermark: every
  in-sync replica has it and its edge was told it is durable. Each edge
  delivers to its own sessions only, so no subscriber gets a message twice
  because two edges read it; a partition is read in order, so each
  publisher's order holds on every edge;
* an accepted CONNECT of a Client Identifier connected here: that
  connection is taken over [MQTT-3.1.4-3] (MQTT 5: DISCONNECT 0x8E), as
  when the new connection comes to this edge, unless this edge's CONNECT
  of it has the higher capture sequence (the later CONNECT wins, on every
  edge alike);
* the fence before a SUBSCRIBE: while retained messages are served, a
  SUBSCRIBE waits (its connection's reading paused) until this edge has
  applied every record the other edges' partitions held when it arrived
  (their high watermarks, read after it came; one read serves every
  SUBSCRIBE that came before it started). So a client that subscribes
  here after a retained publish on another edge was acknowledged gets it,
  and a topic cleared there is served by no edge. It costs the SUBSCRIBE
  one round trip to Kafka and the feed's lag; a read that fails opens the
  gate (said once per kind);
* the record's capture sequence moves this edge's clock past it
  (``KafkaCaptureLog.observe_seq``): a retained publish made here after
  seeing another edge's wins over it in the table and in every edge's
  store.

:class:`ClusterFeed` is a part of :class:`~bridge.edge.server.EdgeServer`
and works on its attributes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from bridge.edge.journal import message_of_record, record_headers

__all__ = ["ClusterFeed", "remote_partitions"]

log = logging.getLogger("bridge.edge")


def remote_partitions(config) -> list[int]:
    """The partitions of the shared topic the other edges write ([] outside a cluster)."""
    cl = config.cluster
    if cl.edges <= 1:
        return []
    return [p for p in range(config.capture.partitions) if p % cl.edges != cl.edge_id]


class ClusterFeed:
    """Delivery of the other edges' records (see the module docstring)."""

    def _start_feed(self, end: list[int]) -> None:
        """Follow the other edges' partitions from ``end`` (where the start-up replay ended)."""
        from bridge.capture.kafka_tail import KafkaTail

        remote = remote_partitions(self.config)
        #: partition -> the next offset this edge's loop has applied (snapshots record it)
        self.feed_done = {p: end[p] for p in remote}
        self.feed_stats = {"records": 0, "messages": 0, "takeovers": 0}
        self._feed_clock = time.time() - self.loop.time()
        loop = self.loop
        self.feed = KafkaTail(self.config, dict(self.feed_done),
                              lambda rs: loop.call_soon_threadsafe(self._feed, rs),
                              name=f"edge{self.config.cluster.edge_id}-cluster-tail")
        self.feed.start()
        self._fence_next: list = []   # connections whose SUBSCRIBE waits for the next watermark read
        self._fence_wait: list = []   # (watermarks, connections): read, not yet applied here
        self._fence_task: asyncio.Task | None = None
        self._fence_said: str | None = None
        log.info("cluster edge %d of %d: writing partitions %s, following partitions %s from offsets %s",
                 self.config.cluster.edge_id, self.config.cluster.edges, self.log.own, remote,
                 [self.feed_done[p] for p in remote])

    def _stop_feed(self) -> None:
        feed = self.feed
        if feed is not None:
            feed.close()

    def _feed(self, records: list) -> None:
        """Apply records of the other edges, on the loop (module docstring)."""
        if self._stopping:
            return
        router = self.router
        retained = self.retained
        done = self.feed_done
        targets: dict[int, object] = {}
        top = -1
        clock = self._feed_clock
        for r in records:
            done[r.partition] = r.offset + 1
            if r.seq > top:
                top = r.seq
            v = r.value
            if not v:
                continue
            ptype = v[0] >> 4
            if ptype == 3:
                retain = v[0] & 1 and retained is not None
                if not router.tree and not retain:
                    continue
                h = record_headers(r)
                if h.get("dup") == b"1" or h.get("origin", b"client") not in (b"client", b"will"):
                    continue
                msg = message_of_record(r, clock, h)
                if msg is None:
                    continue
                self.feed_stats["messages"] += 1
                if retain:
                    retained.capture(msg.topic, r.seq, (r.partition, r.offset), msg)
                if router.tree:
                    m = router.tree.match(msg.topic)
                    if m:
                        for t in router.deliver(msg, m, self._connected):
                            targets[id(t)] = t
            elif ptype == 1:
                self._feed_connect(r)
        self.feed_stats["records"] += len(records)
        if top >= 0:
            observe = getattr(self.log, "observe_seq", None)
            if observe is not None:
                observe(top)
        if targets:
            self._pump_all(targets.values())
        if self._fence_wait:
            self._fence_check()

    # ------------------------------------------------------------ the fence
    def subscribe_gate(self, conn):
        """The gate a session calls before each SUBSCRIBE (module docstring)."""
        def gate(_session) -> bool:
            if self.retained is None or self._stopping:
                return True  # no retained messages: nothing to wait for
            conn.pause("fence")
            self._fence_next.append(conn)
            if self._fence_task is None or self._fence_task.done():
                self._fence_task = self.loop.create_task(self._fence_rounds())
            return False
        return gate

    async def _fence_rounds(self) -> None:
        while self._fence_next:
            batch, self._fence_next = self._fence_next, []
            try:
                marks = await asyncio.to_thread(self.feed.watermarks)
                self._fence_said = None
            except Exception as exc:  # noqa: BLE001 - Kafka not answering: serve what this edge has
                said = f"{type(exc).__name__}: {exc}"
                if said != self._fence_said:
                    self._fence_said = said
                    log.warning("cluster fence: the other edges' watermarks could not be read (%s); "
                                "SUBSCRIBEs go on with the retained messages this edge has read", said)
                marks = {}
            self._fence_wait.append((marks, batch))
            self._fence_check()

    def _fence_check(self) -> None:
        done = self.feed_done
        keep = []
        for marks, batch in self._fence_wait:
            if all(done.get(p, 0) >= o for p, o in marks.items()):
                for conn in batch:
                    self._open_gate(conn)
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

    def _feed_connect(self, r) -> None:
        """Another edge accepted a CONNECT: a connection here with that
        Client Identifier is taken over [MQTT-3.1.4-3]."""
        h = record_headers(r)
        if "reject" in h:
            return
        cid = r.key.decode("utf-8", "replace")
        conn = self.clients.get(cid)
        if conn is None or conn.session is None or r.seq < conn.connect_seq:
            return  # (an older connection elsewhere: the later CONNECT wins on every edge)
        self.feed_stats["takeovers"] += 1
        log.info("%s client=%s: taken over by a connection to another edge (partition %d offset %d)",
                 conn.conn_id, cid, r.partition, r.offset)
        self.perform(conn, conn.session.take_over())

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
        """For ``lakegate status`` and ``/metrics``: this edge's place in
        the cluster and how far it is behind the other edges' partitions
        (None outside a cluster)."""
        feed = self.feed
        if feed is None:
            return None
        cl = self.config.cluster
        return {"edge_id": cl.edge_id, "edges": cl.edges, "own_partitions": list(self.log.own or ()),
                "followed": dict(self.feed_done), "lag_records": feed.lag(), **self.feed_stats}
