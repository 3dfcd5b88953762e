"""The edge's retained store: what a SUBSCRIBE is served from.

``RetainedStore`` = the ``retained`` table's latest version
(:mod:`~.snapshot`, indexed by topic level) + the overlay of this edge's own
retained PUBLISHes captured after the offsets that version covers
(:mod:`~.overlay`). Exact for this edge, whatever the job is doing: a
client that publishes a retained message and subscribes a millisecond
later gets it (the overlay takes it at append; it goes out once durable, as
every message); a cleared topic is not served. Other edges' retained
messages (other capture streams into the same lake) come from the table,
with the job's lag.

Lifecycle (the server drives it, ``bridge.edge.server``):

* start: :meth:`load` (worker thread) reads the latest version, then
  :meth:`replay_log` applies this edge's capture log from the version's
  coverage to its end (retained PUBLISHes only);
* live: :meth:`capture` for every accepted PUBLISH with RETAIN 1 (and a
  Will with it), at append;
* SUBSCRIBE: :meth:`replay` gives the subscription's
  :class:`~.replay.Replay` (Retain Handling decided by the caller);
* refresh: :meth:`newer` / :meth:`swap` every ``edge.retained_refresh_s``:
  a newer version is loaded in a worker thread, swapped in on the loop, and
  the overlay entries it covers are dropped.

Precedence between a table row and an overlay entry of the same topic is
the job's rule, :func:`bridge.tables.retained_rule.supersedes` (higher
capture sequence wins). Not thread-safe apart from the loading: the event
loop owns it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.edge.message import Message
from bridge.edge.retained.overlay import Entry, Overlay
from bridge.edge.retained.replay import Replay
from bridge.edge.retained.scan import EAGER_NODES, OverlayScan
from bridge.tables.retained_order import supersedes

if TYPE_CHECKING:
    from bridge.edge.retained.snapshot import Snapshot

__all__ = ["RetainedStore"]

log = logging.getLogger("bridge.edge")



class RetainedStore:
    """See the module docstring. ``table_path``: the ``retained`` table;
    ``stream``: this edge's capture stream; ``clock_offset``: wall clock
    minus the server's clock."""

    def __init__(self, table_path: Path, stream: str, clock_offset: float = 0.0,
                 cache_bytes: int = 32 << 20) -> None:
        self.table_path = Path(table_path)
        self.stream = stream
        self.clock_offset = clock_offset
        self.cache_bytes = cache_bytes
        self.snapshot: Snapshot | None = None
        self.overlay = Overlay()
        self._frozen: tuple[int, list[Entry]] | None = None  # (overlay version, entries)
        #: the last error loading a version (one line), None when the last load worked
        self.error: str | None = None
        self._problem: str | None = None  # that error's problem, logged once while it lasts
        #: the newest version refused for its protocol (a version does not change:
        #: the refresh loads again only when a newer one appears)
        self._refused: int | None = None
        self._dt = None  # the DeltaTable the refresh polls

    # ------------------------------------------------------------ loading
    def load(self) -> Snapshot | None:
        """Read the table's latest version (blocking: a worker thread).
        Returns it, or None when there is no table or it cannot be read
        (:attr:`error` says why, one line)."""
        if not (self.table_path / "_delta_log").is_dir():
            return None  # no table yet (Arrow's Parquet reader and deltalake stay unloaded)
        from bridge.edge.retained.snapshot import SnapshotError, load_snapshot

        try:
            snap = load_snapshot(self.table_path, self.stream, self.cache_bytes)
        except SnapshotError as exc:
            served = self.snapshot
            self.error = exc.line(
                "serving the edge's own captures only" if served is None else
                f"still serving table version {served.version} and the edge's own captures after it")
            if str(exc) != self._problem:  # one line per problem, not one per refresh
                log.error("%s", self.error)
            self._problem = str(exc)
            if exc.version is not None:
                self._refused = exc.version
            return None
        self.error = self._problem = None
        return snap

    def newer(self) -> bool:
        """Whether the table has a version newer than the one served
        (blocking, cheap: reads the new commit files only)."""
        if self._dt is None and not (self.table_path / "_delta_log").is_dir():
            return False  # no table yet
        from deltalake import DeltaTable

        try:
            if self._dt is None:
                self._dt = DeltaTable(str(self.table_path))
            else:
                self._dt.update_incremental()
            v = self._dt.version()
        except Exception:  # no table yet, or a log being written
            self._dt = None
            return False
        seen = max(-1 if self.snapshot is None else self.snapshot.version,
                   -1 if self._refused is None else self._refused)
        return v > seen

    def swap(self, snap: Snapshot | None, gradual: bool = False) -> None:
        """Serve ``snap`` from now on (on the loop); drop the overlay entries
        it covers: now, or with ``gradual`` a step at a time as the caller
        calls ``overlay.drop_step`` (the server's refresh, one per turn of
        the event loop)."""
        if snap is None:
            return
        self.snapshot = snap
        if gradual and snap.covered:
            self.overlay.begin_drop(snap.covered)
            dropped = "dropping those now in the table"
        else:
            dropped = "%d now in the table" % (
                self.overlay.drop_covered(snap.covered) if snap.covered else 0)
        log.info("retained: serving table version %d (%d topics, %d bytes of payloads cached), "
                 "overlay %d topics (%s)", snap.version, snap.size, snap._cached,
                 len(self.overlay), dropped)

    def start_offsets(self, earliest: list[int]) -> list[int]:
        """Per partition, where :meth:`replay_log` starts: the served
        version's coverage of this stream, else the log's earliest."""
        cov = self.snapshot.covered if self.snapshot is not None else None
        if not cov:
            return list(earliest)
        return [max(int(cov.get(p, 0)), earliest[p]) for p in range(len(earliest))]

    def replay_log(self, reader, start: list[int], end: list[int]) -> int:
        """Apply the retained PUBLISHes of this edge's capture log between
        ``start`` and ``end`` (per partition) to the overlay (blocking; at
        start-up). Returns the records read."""
        from bridge.edge.journal import record_headers

        n = 0
        for p in range(len(end)):
            if start[p] >= end[p]:
                continue
            for r in reader.records(p, start[p], end[p]):
                n += 1
                v = r.value
                if not v or v[0] >> 4 != 3 or not v[0] & 1:
                    continue  # not a PUBLISH with RETAIN 1
                h = record_headers(r)
                if "reject" in h or h.get("dup") == b"1":
                    continue  # refused, or a QoS 2 re-send applied once
                level = int(h.get("proto", b"4"))
                alias = h.get("alias_topic")
                msg = Message.from_frame(v, level, topic=alias.decode() if alias else None,
                                         origin=r.key.decode("utf-8", "replace"),
                                         received=r.timestamp_us / 1e6 - self.clock_offset,
                                         ref=(r.partition, r.offset), ready=True)
                self.capture(msg.topic, r.seq, (r.partition, r.offset), msg)
        return n

    # ------------------------------------------------------------ live
    def capture(self, topic: str, seq: int, pos: tuple[int, int], msg: Message) -> None:
        """An accepted PUBLISH with RETAIN 1 was appended at ``pos``: it
        replaces the topic's retained message, or clears it when its payload
        is empty [MQTT-3.3.1-5, MQTT-3.3.1-6, MQTT-3.3.1-7]."""
        self.overlay.apply(Entry(topic, seq, pos, msg if msg.size else None))

    # ------------------------------------------------------------ SUBSCRIBE
    def frozen(self) -> list[Entry]:
        """The overlay's entries as a list that nobody changes (one copy per
        version of the overlay, shared by the scans made meanwhile)."""
        cached = self._frozen
        if cached is None or cached[0] != self.overlay.version:
            cached = self._frozen = (self.overlay.version, list(self.overlay.entries.values()))
        return cached[1]

    def replay(self, topic_filter: str, qos_cap: int, sub_ids: tuple[int, ...],
               now: float, allowed=None, eager: bool = True) -> Replay | None:
        """The retained messages ``topic_filter`` matches, as a replay for
        one subscription (None: there are none). ``now``: the server's
        clock; ``allowed(topic)``: the ACL's read check, applied to each
        message as it goes out (None: every topic). The matching is done now
        while it is small (:data:`~bridge.edge.retained.scan.EAGER_NODES`
        of the overlay's trie), else as the replay goes (an overlay scan,
        the table's rows after it); ``eager`` false: always as it goes (a
        SUBSCRIBE of many filters, ``SubscriberFlows``), the table's rows too."""
        import numpy as np  # loaded with the first table version, not before

        snap = self.snapshot
        if not eager:
            if snap is None and not self.overlay.entries:
                return None
            scan = OverlayScan(self.frozen(), topic_filter, snap, now) \
                if self.overlay.entries else None
            return Replay(snap, None, [], qos_cap, sub_ids, self.clock_offset, allowed, scan,
                          (topic_filter, now))
        rows = snap.index.match(topic_filter) if snap is not None else np.zeros(0, dtype=np.int64)
        matched = self.overlay.match(topic_filter, EAGER_NODES)
        scan = None
        extra: list[Message] = []
        hidden: list[int] = []
        if matched is None:  # a large overlay: matched as the replay goes
            scan = OverlayScan(self.frozen(), topic_filter, snap, now)
        else:
            for e in matched:
                if snap is not None:
                    r = snap.row_of(e.topic)
                    if r >= 0:
                        if not supersedes(e.seq, int(snap.seq[r])):
                            continue  # the table holds a newer state of the topic
                        hidden.append(r)
                if e.msg is not None:
                    left = e.msg.remaining(now)
                    if left is None or left > 0:  # [MQTT-3.3.2-5]
                        extra.append(e.msg)
        if hidden:
            rows = np.setdiff1d(rows, np.asarray(hidden, dtype=np.int64), assume_unique=False)
        if snap is not None and rows.size:
            rows = snap.live_rows(rows, int((now + self.clock_offset) * 1e6))
        if not extra and not rows.size and scan is None:
            return None
        return Replay(snap, rows, extra, qos_cap, sub_ids, self.clock_offset, allowed, scan)

    def topics(self) -> int:
        """Topics known (table rows, tombstones included, plus overlay entries)."""
        return (self.snapshot.size if self.snapshot is not None else 0) + len(self.overlay)

