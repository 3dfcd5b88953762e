"""Capture records applied to the session state, one at a time: what the
start-up replay does with the log after the snapshot (``bridge.edge.persist``),
and what a cluster edge does with the other edges' records as they come
(``bridge.edge.cluster``). Sans-IO.

Per record, in capture order (see ``bridge.edge.persist`` and
``bridge.edge.journal`` for the facts each kind of record carries): a
CONNECT opens the session in the store (its Will becomes owed), QoS 2
PUBLISH and PUBREL keep the inbound QoS 2 state, DISCONNECT closes (and may
drop the Will), a captured Will ends it; with a router, SUBSCRIBE and
UNSUBSCRIBE change subscriptions, PUBLISH records are routed and the
subscriber's acknowledgements end deliveries.

**In a cluster** (``cluster.edges`` > 1, ``docs/cluster.md``) every edge
keeps the state of every *persistent* session of the cluster, from every
partition of the shared topic: a record's partition tells which edge wrote
it (``partition % edges``), and a session connected through another edge
is kept as connected there (``ClientSession.home``), so that the client
can resume it on any edge. The differences:

* another edge's CONNECT of a clean session (Clean Start, no Session
  Expiry) creates nothing here; it ends the session this edge kept for
  that Client Identifier, if any [MQTT-3.1.2-4];
* the Packet Identifier of every QoS 1/2 delivery to a persistent session
  is journaled when it is sent (a record with header ``edge`` = ``sent``
  and ``edge_refs``, durable before the PUBLISH leaves; the edges route in
  different orders, so numbering by push order, as one edge does, would
  differ between them): the record puts the delivery in flight with that
  identifier; nothing is assumed sent (``Replayer`` ``journaled``), and an
  acknowledgement ends the delivery of its message whatever its queued
  identifier (``by_ref``). A ``sent`` or acknowledgement of a message this
  edge has not routed yet (its partition read later than the other edge's)
  is kept and applied when the message comes (:meth:`LogApplier.routed`);
* records of a connection older than the client's newest CONNECT (by
  capture sequence; ``conn_id``) change nothing of the session: a client
  that moved leaves its old connection's last records behind, read in any
  order with the new edge's (:meth:`LogApplier._current`);
* a ``release`` record (``edge`` = ``release``) says the edge that had the
  client connected has closed that connection: the session is closed;
* another edge's Will is not this edge's to publish: it is kept in
  :attr:`LogApplier.remote_wills` until that connection ends, and is owed
  only if that edge is declared dead (``bridge.edge.cluster``).
"""

from __future__ import annotations

import logging

from bridge.edge.actions import WillMessage, will_publish
from bridge.edge.delivery import RELEASED, SENT
from bridge.edge.journal import Replayer, record_headers
from bridge.edge.state import NEVER_EXPIRES, ClientSession, Qos2Entry, SessionStore
from bridge.mqtt import Connect, Disconnect, MqttError, Publish
from bridge.mqtt.codec import decode_packet

__all__ = ["LogApplier", "edge_of_conn"]

log = logging.getLogger(__name__)

_TYPES = frozenset((1, 3, 6, 14))
#: with subscriber state: PUBACK, PUBREC, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE too
_SUBSCRIBER_TYPES = frozenset((1, 3, 4, 5, 6, 7, 8, 10, 14))
#: Capture headers of a CONNECT that its Will's record repeats (then origin ``will``).
_WILL_HEADERS = ("conn_id", "proto", "remote", "username")
#: an acknowledgement seen before its message (cluster): the message is done on arrival
ACKED = -1
#: ...a PUBREC: released on arrival, with the Packet Identifier this much below the value
RELEASED_BIAS = 1 << 16


def edge_of_conn(conn_id: str) -> int | None:
    """The cluster edge a connection id names (``e<k>-...``), or None."""
    if conn_id.startswith("e") and "-" in conn_id:
        head = conn_id[1:conn_id.index("-")]
        if head.isdigit():
            return int(head)
    return None


class LogApplier:
    """See the module docstring. ``live``: Client Identifier -> the sessions
    connected at the current point of the log (the caller's, filled as
    CONNECTs come); ``cluster``: (edges, this edge's id) or None."""

    def __init__(self, store: SessionStore, router=None, live: dict | None = None,
                 wills: dict[str, WillMessage] | None = None, clock_offset: float = 0.0,
                 max_inflight: int | None = None, cluster: tuple[int, int] | None = None,
                 now_wall: float = 0.0) -> None:
        self.store = store
        self.router = router
        self.live: dict[str, ClientSession] = {} if live is None else live
        self.wills = wills
        self.now_wall = now_wall
        self.cluster = cluster
        #: cluster: the Wills of connections on other edges: cid -> (edge, WillMessage)
        self.remote_wills: dict[str, tuple[int, WillMessage]] = {}
        #: cluster: per Client Identifier, {message ref: Packet Identifier, or ACKED} of sends and
        #: acknowledgements whose message was not routed here yet
        self.unmatched: dict[str, dict[tuple[int, int], int]] = {}
        self.subs = (Replayer(router, self.live, clock_offset, max_inflight, journaled=cluster is not None)
                     if router is not None else None)
        if self.subs is not None and cluster is not None:
            self.subs.on_unmatched_ack = self.acked_unmatched
            self.subs.on_routed = self.routed
        self.wanted = _SUBSCRIBER_TYPES if self.subs is not None else _TYPES
        #: records applied
        self.count = 0
        #: cluster: Client Identifier -> (capture sequence, conn_id) of its newest CONNECT
        self.conns: dict[str, tuple[int, bytes]] = {}

    # ------------------------------------------------------------ records
    def apply(self, r, route: bool = True) -> None:
        """One capture record. ``route``: route its message (False: the
        caller routes it, as a cluster edge's feed does)."""
        self.count += 1
        v = r.value
        if not v:
            if self.cluster is not None:
                self._edge_record(r)
            return
        ptype = v[0] >> 4
        if ptype not in self.wanted:
            return
        subs = self.subs
        wills = self.wills
        remote = self.cluster is not None and r.partition % self.cluster[0] != self.cluster[1]
        if ptype == 3 and (v[0] >> 1) & 3 != 2 and subs is None:
            # QoS 0/1 PUBLISH: only a captured Will matters, and only when one is owed
            if wills and r.key.decode("utf-8", "replace") in wills:
                h = record_headers(r)
                if h.get("origin") == b"will" and "reject" not in h:
                    del wills[r.key.decode("utf-8", "replace")]
            return
        h = record_headers(r)
        if "reject" in h:
            return
        cid = r.key.decode("utf-8", "replace")
        origin = h.get("origin", b"client")
        if origin == b"will":
            if wills is not None:
                wills.pop(cid, None)
            self.remote_wills.pop(cid, None)
            if subs is not None and route:
                subs.record(r, ptype, h, cid)
            return
        if origin != b"client":
            return
        try:
            if self.cluster is not None and not self._current(r, ptype, h, cid):
                # a record of a connection older than the client's newest CONNECT: its
                # message is still routed, its session state is not the session's
                if ptype == 3 and subs is not None and route:
                    subs.record(r, ptype, h, cid)
                return
            if ptype == 1 and self.cluster is not None and not self._cluster_connect(r, v, h, cid, remote):
                return  # another edge's clean session
            if subs is not None and ptype != 1 and (route or ptype != 3):
                subs.record(r, ptype, h, cid)
            if ptype == 3 and (v[0] >> 1) & 3 != 2 or ptype in (4, 5, 7, 8, 10):
                return
            self._apply(cid, v, ptype, h, r, None if remote else wills)
            if ptype == 14 and self.cluster is not None:
                self._cluster_disconnect(cid, v, h)
        except (MqttError, ValueError) as exc:  # not expected: the edge captured it as valid
            log.warning("edge sessions: partition %d offset %d: %s", r.partition, r.offset, exc)

    def _apply(self, cid: str, v: bytes, ptype: int, h: dict, r,
               wills: dict[str, WillMessage] | None) -> None:
        store = self.store
        live = self.live
        subs = self.subs
        if ptype == 1:
            p, _ = decode_packet(v, None)
            if not isinstance(p, Connect):
                return
            if p.protocol_level == 5:
                expiry = p.properties.session_expiry_interval or 0
            else:
                expiry = 0 if p.clean_start else NEVER_EXPIRES
            s, present = store.open(cid, p.clean_start, expiry, r.timestamp_us / 1e6,
                                    p.protocol_level)
            live[cid] = s
            if self.cluster is not None:  # where its connection is (None: this edge)
                edge = r.partition % self.cluster[0]
                s.home = edge if edge != self.cluster[1] else None
            if subs is not None:
                subs.connect(s, present, p, r.timestamp_us / 1e6 - subs.clock_offset)
            if wills is not None:
                wills.pop(cid, None)  # a new connection ends the previous one's Will [MQTT-3.1.3-9]
                if p.will is not None:
                    frame, delay = will_publish(p, expiry)
                    headers = [(k, h[k]) for k in _WILL_HEADERS if k in h] + [("origin", b"will")]
                    wills[cid] = WillMessage(cid, r.key, h.get("conn_id", b"").decode(), frame,
                                             headers, delay)
            return
        level = int(h.get("proto", b"4"))
        if ptype == 14 and wills is not None and cid in wills:
            p, _ = decode_packet(v, level)
            if isinstance(p, Disconnect):
                expiry = p.properties.session_expiry_interval
                if p.reason_code == 0:
                    del wills[cid]  # [MQTT-3.1.2-10]
                elif expiry is not None:
                    # the delay ends with the session (MQTT 5.0 3.1.3.2.2): exact when the
                    # interval shrinks, early at worst when it grows past the Will Delay
                    wills[cid].delay_s = min(wills[cid].delay_s, expiry)
        s = live.get(cid)
        if s is None:
            return
        if ptype == 3:
            if h.get("dup") == b"1":
                return
            p, _ = decode_packet(v, level)
            if isinstance(p, Publish) and p.packet_id is not None:
                topic = p.topic or h.get("alias_topic", b"").decode()
                s.qos2[p.packet_id] = Qos2Entry(topic, r.seq, r.partition, r.offset)
        elif ptype == 6:
            if len(v) >= 4:
                s.qos2.pop((v[2] << 8) | v[3], None)
        else:
            p, _ = decode_packet(v, level)
            if isinstance(p, Disconnect) and p.properties.session_expiry_interval is not None:
                store.set_expiry(s, p.properties.session_expiry_interval)
            store.close(s, r.timestamp_us / 1e6)
            live.pop(cid, None)

    # ------------------------------------------------------------ cluster
    def connected_as(self, cid: str, seq: int, conn_id: bytes) -> None:
        """``cid``'s CONNECT ``seq`` through connection ``conn_id`` (this
        edge's own, or a record's): the records of older connections of the
        client no longer change its session (:meth:`_current`)."""
        old = self.conns.get(cid)
        if old is None or seq > old[0]:
            self.conns[cid] = (seq, conn_id)

    def _current(self, r, ptype: int, h: dict, cid: str) -> bool:
        """False for a record of a connection older than the newest CONNECT
        of ``cid`` known here (another edge's records come in any order
        with this edge's own: a client that moved leaves records of its old
        connection behind, in the old edge's partitions, which must not
        change the new session)."""
        conn = h.get("conn_id", b"")
        if ptype == 1:
            known = self.conns.get(cid)
            if known is not None and r.seq < known[0]:
                return False
            self.conns[cid] = (r.seq, conn)
            return True
        known = self.conns.get(cid)
        return known is None or known[1] == conn

    def prune_conns(self, older_than_seq: int) -> None:
        """Forget the CONNECTs numbered below ``older_than_seq`` (a clock
        value: the caller keeps minutes of them, bounded by the clients)."""
        self.conns = {cid: c for cid, c in self.conns.items() if c[0] >= older_than_seq}

    def _cluster_connect(self, r, v: bytes, h: dict, cid: str, remote: bool) -> bool:
        """A CONNECT in a cluster: where the session is connected now; False
        when there is nothing more to do (another edge's clean session)."""
        edges, me = self.cluster
        edge = r.partition % edges
        self.remote_wills.pop(cid, None)  # a new connection ends the previous one's Will
        self.unmatched.pop(cid, None)
        if not remote:
            return True
        p, _ = decode_packet(v, None)
        if not isinstance(p, Connect):
            return False
        expiry = (p.properties.session_expiry_interval or 0) if p.protocol_level == 5 else \
            (0 if p.clean_start else NEVER_EXPIRES)
        if p.will is not None:
            frame, delay = will_publish(p, expiry)
            headers = [(k, h[k]) for k in _WILL_HEADERS if k in h] + [("origin", b"will")]
            self.remote_wills[cid] = (edge, WillMessage(cid, r.key, h.get("conn_id", b"").decode(), frame,
                                                        headers, delay))
        if self.wills is not None:
            self.wills.pop(cid, None)  # this edge's owed Will of the client ends [MQTT-3.1.3-9]
        if expiry == 0:  # a clean session elsewhere: nothing of it is kept here [MQTT-3.1.2-4]
            self.forget(cid)
            return False
        return True

    def _cluster_disconnect(self, cid: str, v: bytes, h: dict) -> None:
        p, _ = decode_packet(v, int(h.get("proto", b"4")))
        w = self.remote_wills.get(cid)
        if w is not None and isinstance(p, Disconnect) and p.reason_code == 0:
            del self.remote_wills[cid]  # [MQTT-3.1.2-10]

    def forget(self, cid: str) -> None:
        """Drop what this edge keeps of ``cid``'s session (another edge's clean session took it)."""
        self.live.pop(cid, None)
        self.unmatched.pop(cid, None)
        self.store.sessions.pop(cid, None)
        if self.router is not None:
            self.router.drop(cid)

    def _edge_record(self, r) -> None:
        """A cluster edge's own record (header ``edge``, no frame)."""
        h = record_headers(r)
        kind = h.get("edge")
        cid = r.key.decode("utf-8", "replace")
        if kind == b"sent":
            known = self.conns.get(cid)
            if known is None or known[1] == h.get("conn_id", b""):  # (an older connection's: not the session's)
                self._sent(cid, h.get("edge_refs", b""))
        elif kind == b"release":
            s = self.live.get(cid)
            if s is not None and s.home == r.partition % self.cluster[0]:
                self.store.close(s, r.timestamp_us / 1e6)
                del self.live[cid]
                self.remote_wills.pop(cid, None)  # the edge that released it owes its Will

    def _sent(self, cid: str, refs: bytes) -> None:
        s = self.store.sessions.get(cid)
        box = s.outbox if s is not None else None
        for item in refs.split():
            p, o, pid = (int(x) for x in item.split(b":"))
            if box is None or not put_in_flight(box, (p, o), pid):
                self.unmatched.setdefault(cid, {})[(p, o)] = pid

    def routed(self, cids) -> None:
        """Messages were routed to the sessions ``cids``: apply the sends and
        acknowledgements of other edges that came before them (cluster)."""
        um = self.unmatched
        for cid in cids:
            pending = um.get(cid)
            if not pending:
                continue
            s = self.store.sessions.get(cid)
            box = s.outbox if s is not None else None
            if box is None:
                continue
            for ref, pid in list(pending.items()):
                if pid == ACKED:
                    if drop_queued(box, ref):
                        del pending[ref]
                elif put_in_flight(box, ref, pid % RELEASED_BIAS, pid >= RELEASED_BIAS):
                    del pending[ref]
            if not pending:
                del um[cid]

    def acked_unmatched(self, cid: str, ref: tuple[int, int], released: int | None) -> None:
        """An acknowledgement of a message not routed here yet (cluster);
        ``released``: the Packet Identifier of a PUBREC < 0x80."""
        self.unmatched.setdefault(cid, {})[ref] = ACKED if released is None else released + RELEASED_BIAS

    # ------------------------------------------------------------ the end
    def finish(self) -> None:
        """End of the start-up replay: sessions still connected through this
        edge died with it (closed, clean ones dropped; their Wills stay
        owed); those connected through another edge stay connected there."""
        store = self.store
        router = self.router
        for cid, s in list(self.live.items()):
            if s.home is not None:  # connected through another edge (a cluster)
                continue
            store.close(s, self.now_wall)
            del self.live[cid]
            if router is not None and not s.persistent:
                router.drop(s.client_id)
        for cid in store.expire(self.now_wall):
            if router is not None:
                router.drop(cid)
        if router is not None:
            for cid in [c for c in router.sessions if c not in store.sessions]:
                router.drop(cid)  # clean sessions that ended during the replay
            self.subs.finish()


def put_in_flight(box, ref: tuple[int, int], pid: int, released: bool = False) -> bool:
    """Another edge sent the delivery of message ``ref`` with ``pid``: it is
    in flight with that Packet Identifier (``released``: PUBREL due) (False:
    not in ``box``'s queue)."""
    for d in box.queue:
        if d.msg.ref == ref:
            box.queue.remove(d)
            box.queued_bytes -= d.msg.size
            d.pid = pid
            d.state = RELEASED if released else SENT
            d.dup = True
            box.inflight[pid] = d
            return True
    d = box.inflight.get(pid)
    return d is not None and d.msg.ref == ref


def drop_queued(box, ref: tuple[int, int]) -> bool:
    for d in box.queue:
        if d.msg.ref == ref:
            box.queue.remove(d)
            box.queued_bytes -= d.msg.size
            return True
    return False
