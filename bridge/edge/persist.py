"""Persistent sessions across edge restarts: a snapshot plus the capture log.

The capture log already holds, durably and in order, every fact the QoS 2
state is made of: the CONNECT of each session (Clean Start, Session Expiry
Interval), every QoS 2 PUBLISH (its capture coordinates, topic, Packet
Identifier), every PUBREL and every DISCONNECT. The edge acknowledges a
QoS 2 PUBLISH (PUBREC) only once its record is durable, and a PUBREL
(PUBCOMP) only once the PUBREL's record is durable. So the state recovered
from the log after a SIGKILL is exactly the state the client was told about:

* a PUBREL for an id the edge answered with PUBREC is still answered with
  PUBCOMP and carries ``rel_topic``/``rel_seq``;
* an id whose PUBCOMP was sent is free again, so a new QoS 2 PUBLISH reusing
  it is not mistaken for a re-send;
* a QoS 2 PUBLISH that reached the disk but whose PUBREC was not sent is
  known, so the client's re-send (DUP) is marked ``dup=1`` and the job
  delivers the message once.

To keep the replay short, the server writes a **snapshot**
(``<data_dir>/edge/sessions.json``) every :data:`SNAPSHOT_INTERVAL_S` seconds
and at shutdown: the persistent sessions plus the capture offsets up to which
they are reflected. A snapshot is renamed into place only once every record
below its offsets is durable, so it never claims state the log may lose. On
start the edge loads the snapshot and replays the capture log from its
offsets (from the start of the log when there is none).

No extra fsync is on the acknowledgement path: the capture log is the journal.

**Wills a crash left owed.** The same log says which Wills are still owed
when the edge dies: a connection's accepted CONNECT carries its Will; a
DISCONNECT with reason 0x00 drops it; a record with origin ``will`` means it
was captured; a later CONNECT with the same Client Identifier ends it (the
edge captured it then, or the new connection cancelled a delayed one). A
Will left over -- its connection was open when the edge died, or its Will
Delay Interval was still running -- is owed: the snapshot carries the owed
Wills too, and :func:`recover` returns them. The edge then captures each
after its delay counted from the restart (0: at once), unless the client
connects again first, exactly as for a connection that has just been lost.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import time
from pathlib import Path

from bridge.capture.errors import OffsetOutOfRangeError
from bridge.edge.actions import WillMessage, will_publish
from bridge.edge.journal import Replayer, hold_floor, record_headers, restore
from bridge.edge.router import Router
from bridge.edge.state import NEVER_EXPIRES, ClientSession, Qos2Entry, SessionStore
from bridge.mqtt import Connect, Disconnect, MqttError, Publish
from bridge.mqtt.codec import decode_packet

__all__ = ["SNAPSHOT_INTERVAL_S", "Snapshot", "hold_floor", "load_snapshot", "recover", "replay",
           "write_snapshot"]

log = logging.getLogger(__name__)

FORMAT = 1
SNAPSHOT_NAME = "sessions.json"
#: How often the server snapshots the persistent sessions (when anything was captured).
SNAPSHOT_INTERVAL_S = 10.0


class Snapshot:
    """Persistent sessions and the capture offsets (per partition, the next
    offset) below which every record is reflected in them."""

    def __init__(self, store: SessionStore, offsets: list[int] | None, stream: str = "",
                 wills: dict[str, WillMessage] | None = None, docs: dict | None = None) -> None:
        self.store = store
        #: the raw session entries (their subscriptions and outboxes, bridge.edge.journal)
        self.docs = docs or {}
        self.offsets = offsets
        self.stream = stream
        #: Wills owed at the snapshot, by Client Identifier.
        self.wills: dict[str, WillMessage] = {} if wills is None else wills


def snapshot_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / SNAPSHOT_NAME


def load_snapshot(state_dir: str | os.PathLike[str]) -> Snapshot:
    """The last snapshot, or an empty store with no offsets (replay everything).
    A snapshot that cannot be read is an error naming the file."""
    path = snapshot_path(state_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Snapshot(SessionStore(), None)
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
        wills = {cid: WillMessage.from_json(w) for cid, w in doc.get("wills", {}).items()}
        return Snapshot(SessionStore.from_json(doc["sessions"]), [int(o) for o in doc["offsets"]],
                        doc.get("stream", ""), wills, doc["sessions"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"edge session snapshot {path} cannot be read ({exc}); move it away to "
                         "recover the sessions from the whole capture log") from None


def write_snapshot(state_dir: str | os.PathLike[str], sessions: dict, offsets: list[int],
                   stream: str, wills: dict | None = None) -> Path:
    """Write the snapshot atomically (temporary file, fsync, rename, fsync of
    the directory). The caller guarantees every record below ``offsets`` is
    durable before calling (see the module docstring). ``sessions`` is
    ``SessionStore.to_json()``, ``wills`` the owed Wills as
    ``{client_id: WillMessage.to_json()}``."""
    d = Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / SNAPSHOT_NAME
    tmp = d / f".{SNAPSHOT_NAME}.{os.getpid()}.tmp"
    doc = {"format": FORMAT, "stream": stream, "offsets": list(offsets),
           "written_at": time.time(), "sessions": sessions, "wills": wills or {}}
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def replay(reader, store: SessionStore, start: list[int], end: list[int],
           now_wall: float | None = None, wills: dict[str, WillMessage] | None = None,
           router: Router | None = None, clock_offset: float = 0.0,
           max_inflight: int | None = None, own: list[int] | None = None) -> int:
    """Apply the capture records in ``[start, end)`` (per partition, in
    capture-sequence order across partitions) to ``store`` and, when given,
    to the owed ``wills`` and to the subscriptions and outboxes of
    ``router`` (see :mod:`bridge.edge.journal`; ``max_inflight``:
    ``edge.max_inflight_messages``); returns how many records were read.
    Sessions still connected when the log ends are closed (the connection
    died with the edge): clean ones are dropped; their Wills stay owed.
    ``own``: a cluster edge's partitions; the other edges' records only
    route their messages to this edge's sessions (their sessions, QoS 2
    state and Wills are those edges')."""
    own_set = None if own is None else frozenset(own)
    now_wall = time.time() if now_wall is None else now_wall
    live: dict[str, ClientSession] = {cid: s for cid, s in store.sessions.items()
                                      if s.disconnected_at is None}
    for s in live.values():
        s.connected = True
    subs = Replayer(router, live, clock_offset, max_inflight) if router is not None else None
    earliest = reader.earliest_offsets()
    streams = []
    for p in range(reader.partitions):
        lo = start[p]
        if lo < earliest[p]:
            log.warning("edge session recovery: partition %d offsets %d..%d were deleted by "
                        "retention; replaying from %d", p, lo, earliest[p], earliest[p])
            lo = earliest[p]
        if lo < end[p]:
            streams.append(((r.seq, r) for r in reader.records(p, lo, end[p])))
    count = 0
    wanted = _SUBSCRIBER_TYPES if subs is not None else _TYPES
    for _seq, r in heapq.merge(*streams, key=lambda t: t[0]):
        count += 1
        v = r.value
        if not v:
            continue
        ptype = v[0] >> 4
        if ptype not in wanted:
            continue
        if own_set is not None and r.partition not in own_set:
            if ptype == 3 and subs is not None:
                h = record_headers(r)
                if "reject" not in h and h.get("origin", b"client") in (b"client", b"will"):
                    subs.record(r, ptype, h, r.key.decode("utf-8", "replace"))
            continue
        if ptype == 3 and (v[0] >> 1) & 3 != 2 and subs is None:
            # QoS 0/1 PUBLISH: only a captured Will matters, and only when one is owed
            if wills and r.key.decode("utf-8", "replace") in wills:
                h = record_headers(r)
                if h.get("origin") == b"will" and "reject" not in h:
                    del wills[r.key.decode("utf-8", "replace")]
            continue
        h = record_headers(r)
        if "reject" in h:
            continue
        cid = r.key.decode("utf-8", "replace")
        origin = h.get("origin", b"client")
        if origin == b"will":
            if wills is not None:
                wills.pop(cid, None)
            if subs is not None:
                subs.record(r, ptype, h, cid)
            continue
        if origin != b"client":
            continue
        try:
            if subs is not None and ptype != 1:
                subs.record(r, ptype, h, cid)
            if ptype == 3 and (v[0] >> 1) & 3 != 2 or ptype in (4, 5, 7, 8, 10):
                continue
            _apply(store, live, cid, v, ptype, h, r, now_wall, wills, subs)
        except (MqttError, ValueError) as exc:  # not expected: the edge captured it as valid
            log.warning("edge session recovery: partition %d offset %d: %s", r.partition,
                        r.offset, exc)
    for s in live.values():
        store.close(s, now_wall)
        if router is not None and not s.persistent:
            router.drop(s.client_id)
    for cid in store.expire(now_wall):
        if router is not None:
            router.drop(cid)
    if router is not None:
        for cid in [c for c in router.sessions if c not in store.sessions]:
            router.drop(cid)  # clean sessions that ended during the replay
        subs.finish()
    return count


_TYPES = frozenset((1, 3, 6, 14))
#: with subscriber state: PUBACK, PUBREC, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE too
_SUBSCRIBER_TYPES = frozenset((1, 3, 4, 5, 6, 7, 8, 10, 14))


#: Capture headers of a CONNECT that its Will's record repeats (then origin ``will``).
_WILL_HEADERS = ("conn_id", "proto", "remote", "username")


def _apply(store: SessionStore, live: dict, cid: str, v: bytes, ptype: int, h: dict, r,
           now_wall: float, wills: dict[str, WillMessage] | None = None,
           subs: Replayer | None = None) -> None:
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
        del live[cid]
        if subs is not None and not s.persistent:
            subs.router.drop(cid)


def recover(state_dir: str | os.PathLike[str], reader, end: list[int], stream: str,
            router: Router | None = None, clock_offset: float = 0.0,
            max_inflight: int | None = None, own: list[int] | None = None
            ) -> tuple[SessionStore, dict[str, WillMessage], int]:
    """The persistent sessions and the owed Wills after a (re)start: the
    snapshot plus the capture log from its offsets to ``end``; with
    ``router``, their subscriptions and outboxes too (``clock_offset``: wall
    clock minus the server's clock, for message arrival times). Returns
    (store, owed Wills by Client Identifier, records replayed). ``max_inflight``:
    ``edge.max_inflight_messages`` (None: its default), the in-flight
    window recovery assumes for the sends the log does not journal (see
    :mod:`bridge.edge.journal`). ``own``: a cluster edge's partitions (see
    :func:`replay`); without a snapshot it starts at ``end`` on the others'."""
    snap = load_snapshot(state_dir)
    start = snap.offsets
    if start is None or len(start) != len(end) or (snap.stream and snap.stream != stream):
        if start is not None:
            log.warning("edge session snapshot is for another capture log layout; "
                        "replaying the whole capture log")
            snap = Snapshot(SessionStore(), None)
        start = [0 if own is None or p in own else end[p] for p in range(len(end))]
    start = [min(s, e) for s, e in zip(start, end)]
    if router is not None and snap.docs:
        restore(snap.store, router, snap.docs, reader, clock_offset)
    try:
        n = replay(reader, snap.store, start, end, wills=snap.wills, router=router,
                   clock_offset=clock_offset, max_inflight=max_inflight, own=own)
    except OffsetOutOfRangeError as exc:
        log.warning("edge session recovery stopped early: %s", exc)
        n = 0
    return snap.store, snap.wills, n
