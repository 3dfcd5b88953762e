"""One version of the ``retained`` Delta table as the edge serves it.

Loaded in a worker thread: the version's rows with only their small columns
in memory (topic, deleted, QoS, Message Expiry Interval, set time, capture
stream/partition/offset/sequence) and, per row, where it lies (Parquet file
and row in it), indexed by topic level (:class:`~.index.LevelIndex`). The
bulky columns (payload, the other MQTT 5 properties) stay in the table's
files and are read per file on demand, kept in a byte-bounded cache
(``edge.retained_cache_bytes``), which loading fills first, so a table that
fits is served from memory.

The version's coverage of this edge's own capture stream comes from the
newest commit that records one (``bridge.tables.coverage``); none means
nothing of this stream is known to be in it (the overlay starts from the
log's earliest record).

Errors are one line each (:class:`SnapshotError`): no table yet is not an
error (an empty snapshot); a version that cannot be read, or a table whose
protocol needs reader features delta-rs (``deltalake``) does not support,
is; the edge then serves its overlay and says so.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.edge.message import Message
from bridge.edge.retained.index import LevelIndex
from bridge.mqtt.properties import Properties, Scope, encode_properties
from bridge.tables.coverage import covered_offsets

__all__ = ["Snapshot", "SnapshotError", "load_snapshot"]

log = logging.getLogger("bridge.edge")

_SMALL = ["topic", "deleted", "qos", "message_expiry_interval", "set_at", "stream", "partition",
          "offset", "seq", "client_id"]
_BULKY = ["payload", "payload_format_indicator", "content_type", "response_topic",
          "correlation_data", "user_properties"]
#: commits searched (newest first) for this stream's coverage
HISTORY_DEPTH = 1000


class SnapshotError(RuntimeError):
    """A retained table version the edge cannot serve from (one line)."""


class Snapshot:
    """The rows of one table version (see the module docstring)."""

    def __init__(self, version: int, covered: dict[int, int] | None, small: pa.Table,
                 frag: np.ndarray, frow: np.ndarray, fragments: list, stream: str,
                 cache_bytes: int) -> None:
        self.version = version
        #: per partition of this edge's stream, the first offset not in it
        #: (None: the version records none)
        self.covered = covered
        self.size = small.num_rows
        self.topics = pc.cast(small["topic"], pa.large_string()).combine_chunks() \
            if self.size else pa.array([], pa.large_string())
        self.deleted = _np(small["deleted"], bool, False)
        self.qos = _np(small["qos"], np.int8, 0)
        self.expiry = _np(small["message_expiry_interval"], np.int64, -1)
        self.set_at_us = _np(pc.cast(small["set_at"], pa.int64()) if self.size else small["set_at"],
                             np.int64, 0)
        self.seq = _np(small["seq"], np.int64, -1)
        self.own = _np(pc.equal(small["stream"], stream), bool, False) if self.size \
            else np.zeros(0, dtype=bool)
        self.partition = _np(small["partition"], np.int32, -1)
        self.offset = _np(small["offset"], np.int64, -1)
        self.client_ids = small["client_id"].combine_chunks() if self.size else None
        self.frag = frag
        self.frow = frow
        self.fragments = fragments
        self.index = LevelIndex(self.topics)
        self.cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, pa.Table] = collections.OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lookups
    def row_of(self, topic: str) -> int:
        """The row of ``topic`` (tombstones too), or -1."""
        if "+" in topic or "#" in topic:
            return -1
        rows = self.index.match(topic)
        return int(rows[0]) if rows.size else -1

    def live_rows(self, rows: np.ndarray, now_wall_us: int) -> np.ndarray:
        """``rows`` without tombstones and messages whose expiry passed."""
        if rows.size == 0:
            return rows
        keep = ~self.deleted[rows]
        exp = self.expiry[rows]
        keep &= (exp < 0) | (self.set_at_us[rows] + exp * 1_000_000 > now_wall_us)
        return rows[keep]

    # ------------------------------------------------------------ bulky columns
    def _bulky(self, f: int) -> pa.Table:
        with self._lock:
            t = self._cache.get(f)
            if t is not None:
                self._cache.move_to_end(f)
                return t
        t = self.fragments[f].to_table(columns=_BULKY)
        with self._lock:
            self._cache[f] = t
            self._cached += t.get_total_buffer_size()
            while self._cached > self.cache_bytes and len(self._cache) > 1:
                _k, old = self._cache.popitem(last=False)
                self._cached -= old.get_total_buffer_size()
        return t

    def warm(self, deadline: float) -> int:
        """Read files into the cache until it is full or ``deadline``
        (monotonic) passes; returns the bytes cached."""
        for f in range(len(self.fragments)):
            if self._cached >= self.cache_bytes or time.monotonic() > deadline:
                break
            self._bulky(f)
        return self._cached

    def messages(self, rows: list[int], clock_offset: float) -> list[Message | None]:
        """The message of each row (None where its file cannot be read: the
        caller counts and logs it), in the order given. ``clock_offset``:
        wall clock minus the server's clock (arrival times in the server's)."""
        out: list[Message | None] = [None] * len(rows)
        by_frag: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_frag.setdefault(int(self.frag[r]), []).append(i)
        for f, idxs in by_frag.items():
            try:
                t = self._bulky(f)
            except OSError as exc:  # the file went away (vacuumed): the caller decides
                log.warning("retained table version %d: file %s cannot be read (%s)", self.version,
                            getattr(self.fragments[f], "path", f), exc)
                continue
            cols = {c: t[c] for c in _BULKY}
            for i in idxs:
                r = rows[i]
                j = int(self.frow[r])
                out[i] = self._message(r, {c: col[j].as_py() for c, col in cols.items()},
                                       clock_offset)
        return out

    def _message(self, r: int, b: dict, clock_offset: float) -> Message:
        exp = int(self.expiry[r])
        props = Properties(payload_format_indicator=b["payload_format_indicator"],
                           message_expiry_interval=exp if exp >= 0 else None,
                           content_type=b["content_type"], response_topic=b["response_topic"],
                           correlation_data=b["correlation_data"],
                           user_properties=[(kv["key"], kv["value"]) if isinstance(kv, dict)
                                            else tuple(kv) for kv in b["user_properties"] or ()])
        raw = b""
        if props:
            block = encode_properties(props, Scope.PUBLISH)
            raw = block[_varint_len(block):]
        own = bool(self.own[r])
        return Message.from_properties(
            self.topics[r].as_py(), int(self.qos[r]), True, b["payload"] or b"", raw,
            origin=self.client_ids[r].as_py() or "" if self.client_ids is not None else "",
            received=self.set_at_us[r] / 1e6 - clock_offset,
            ref=(int(self.partition[r]), int(self.offset[r])) if own else None, ready=True)


def _varint_len(block: bytes) -> int:
    n = 0
    while block[n] & 0x80:
        n += 1
    return n + 1


def _np(col, dtype, null) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    if col.null_count:
        col = pc.fill_null(col, null)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=dtype)


def load_snapshot(table_path: Path, stream: str, cache_bytes: int,
                  warm_s: float = 5.0) -> Snapshot | None:
    """The table's latest version (None: there is no table yet). Raises
    :class:`SnapshotError` with one line when the version cannot be read."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        dt = DeltaTable(str(table_path))
    except TableNotFoundError:
        return None
    except Exception as exc:
        raise SnapshotError(f"retained table {table_path}: cannot be opened: {_line(exc)}") from None
    try:
        version = dt.version()
        covered = covered_offsets(dt.history(HISTORY_DEPTH), stream)
        dset = dt.to_pyarrow_dataset()
        fragments = list(dset.get_fragments())
        small = dset.scanner(columns=_SMALL + ["__fragment_index"], use_threads=False).to_table()
    except Exception as exc:  # unsupported reader features, a damaged log or file
        raise SnapshotError(f"retained table {table_path}: version cannot be read "
                            f"({_line(exc)}); serving the edge's own captures only") from None
    frag = _np(small["__fragment_index"], np.int32, 0) if small.num_rows else np.zeros(0, np.int32)
    # rows come file by file, in file order: each row's place in its file
    frow = np.zeros(len(frag), dtype=np.int64)
    if len(frag):
        starts = np.flatnonzero(np.r_[True, frag[1:] != frag[:-1]])
        run = np.diff(np.r_[starts, len(frag)])
        frow = np.arange(len(frag)) - np.repeat(starts, run)
    snap = Snapshot(version, covered, small.drop_columns(["__fragment_index"]), frag, frow,
                    fragments, stream, cache_bytes)
    snap.warm(time.monotonic() + warm_s)
    return snap


def _line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
