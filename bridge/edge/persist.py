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
from bridge.edge.actions import WillMessage
from bridge.edge.applier import LogApplier
from bridge.edge.journal import hold_floor, restore
from bridge.edge.router import Router
from bridge.edge.state import ClientSession, SessionStore

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
           max_inflight: int | None = None, cluster: tuple[int, int] | None = None,
           applier: list | None = None) -> int:
    """Apply the capture records in ``[start, end)`` (per partition, in
    capture-sequence order across partitions) to ``store`` and, when given,
    to the owed ``wills`` and to the subscriptions and outboxes of
    ``router`` (see :mod:`bridge.edge.journal`; ``max_inflight``:
    ``edge.max_inflight_messages``); returns how many records were read.
    Sessions still connected when the log ends are closed (the connection
    died with the edge): clean ones are dropped; their Wills stay owed.
    ``cluster``: (edges, this edge's id): every partition's sessions are
    kept, those connected through other edges as connected there
    (:mod:`bridge.edge.applier`); ``applier``: a list the
    :class:`~bridge.edge.applier.LogApplier` is appended to (a cluster edge
    goes on with it)."""
    now_wall = time.time() if now_wall is None else now_wall
    live: dict[str, ClientSession] = {cid: s for cid, s in store.sessions.items()
                                      if s.disconnected_at is None}
    for s in live.values():
        s.connected = True
    app = LogApplier(store, router, live, wills, clock_offset, max_inflight, cluster, now_wall)
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
    for _seq, r in heapq.merge(*streams, key=lambda t: t[0]):
        app.apply(r)
    app.finish()
    if applier is not None:
        applier.append(app)
    return app.count


def recover(state_dir: str | os.PathLike[str], reader, end: list[int], stream: str,
            router: Router | None = None, clock_offset: float = 0.0,
            max_inflight: int | None = None, cluster: tuple[int, int] | None = None,
            applier: list | None = None) -> tuple[SessionStore, dict[str, WillMessage], int]:
    """The persistent sessions and the owed Wills after a (re)start: the
    snapshot plus the capture log from its offsets to ``end``; with
    ``router``, their subscriptions and outboxes too (``clock_offset``: wall
    clock minus the server's clock, for message arrival times). Returns
    (store, owed Wills by Client Identifier, records replayed). ``max_inflight``:
    ``edge.max_inflight_messages`` (None: its default), the in-flight
    window recovery assumes for the sends the log does not journal (see
    :mod:`bridge.edge.journal`). ``cluster``, ``applier``: see :func:`replay`."""
    snap = load_snapshot(state_dir)
    start = snap.offsets
    if start is None or len(start) != len(end) or (snap.stream and snap.stream != stream):
        if start is not None:
            log.warning("edge session snapshot is for another capture log layout; "
                        "replaying the whole capture log")
            snap = Snapshot(SessionStore(), None)
        start = [0] * len(end)
    start = [min(s, e) for s, e in zip(start, end)]
    if router is not None and snap.docs:
        restore(snap.store, router, snap.docs, reader, clock_offset)
    try:
        n = replay(reader, snap.store, start, end, wills=snap.wills, router=router,
                   clock_offset=clock_offset, max_inflight=max_inflight, cluster=cluster,
                   applier=applier)
    except OffsetOutOfRangeError as exc:
        log.warning("edge session recovery stopped early: %s", exc)
        n = 0
    return snap.store, snap.wills, n
