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

The edge reads the table's data files itself (the Parquet files delta-rs
lists for the version, by column name, every row of a listed file live), not
through a Delta reader: a table is served only when its protocol says that is
its content (:data:`EDGE_READS`, :func:`unreadable`). Deletion vectors, column
mapping and any other reader feature are refused, never misread.

Errors are one line each (:class:`SnapshotError`): no table yet is not an
error (an empty snapshot); a version that cannot be read, or a table whose
protocol the edge does not read (which table, which feature, what makes it
readable), is; the store then serves what it has and says so.
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
import pyarrow.parquet as pq

from bridge.edge.message import Message
from bridge.edge.retained.index import LevelIndex
from bridge.mqtt.properties import Properties, Scope, encode_properties
from bridge.tables.coverage import covered_offsets

__all__ = ["EDGE_READS", "Snapshot", "SnapshotError", "load_snapshot", "unreadable"]

log = logging.getLogger("bridge.edge")

_SMALL = ["topic", "deleted", "qos", "message_expiry_interval", "set_at", "stream", "partition",
          "offset", "seq"]
_BULKY = ["payload", "payload_format_indicator", "content_type", "response_topic",
          "correlation_data", "user_properties"]
#: commits searched (newest first) for this stream's coverage
HISTORY_DEPTH = 1000
#: What the edge reads of a Delta table's protocol. It reads the data files
#: delta-rs lists for a version with pyarrow, by column name, and serves every
#: row of a listed file as live, so it serves a table only where that is the
#: table's content: reader version 1 (no reader feature), 2 (the legacy
#: protocol of column mapping: only with ``delta.columnMapping.mode`` none,
#: i.e. files whose columns carry the table's names), 3 with these reader
#: features, none of which changes what rows or columns a listed file holds:
#:
#: * ``timestampNtz``: a column type (each column read is cast to the
#:   ``retained`` schema's type);
#: * ``v2Checkpoint``: the log's checkpoint format (delta-rs reads the log);
#: * ``vacuumProtocolCheck``: a rule for VACUUM (the edge never vacuums).
#:
#: Anything else is refused (:func:`unreadable`), in particular
#: ``deletionVectors`` (rows a vector deletes would be served as live),
#: ``columnMapping`` with mode ``name`` or ``id`` (files name columns by
#: physical names: a renamed or re-added column would be read wrong or as
#: null), ``typeWidening``, ``variantType`` and features newer than this list.
#: Writer features do not matter here: the edge never writes.
EDGE_READS = {"reader_versions": (1, 2, 3),
              "reader_features": frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"}),
              "column_mapping_modes": ("none",)}
#: why a refused feature would be misread (the refusal's line says it)
_WHY = {"deletionVectors": "rows a deletion vector deletes would be served as live",
        "columnMapping": "data files name columns by physical names, not the table's"}


class SnapshotError(RuntimeError):
    """A retained table version the edge cannot serve from (one line).
    ``remedy``: what makes the table readable, when known; ``version``: the
    version refused for its protocol (None for any other error: worth a retry)."""

    def __init__(self, problem: str, remedy: str | None = None, version: int | None = None) -> None:
        super().__init__(problem)
        self.remedy = remedy
        self.version = version

    def line(self, serving: str) -> str:
        """The log line: the problem, what the edge serves meanwhile, the remedy."""
        return "; ".join(p for p in (str(self), serving, self.remedy) if p)


class Snapshot:
    """The rows of one table version (see the module docstring)."""

    def __init__(self, version: int, covered: dict[int, int] | None, small: pa.Table,
                 frag: np.ndarray, frow: np.ndarray, files: list[str], stream: str,
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
        self.frag = frag
        self.frow = frow
        self.files = files
        self.index = LevelIndex(self.topics)
        #: topic -> row, for row_of (built here, on the loader's thread: a
        #: look-up through the level index took 69 us, and a replay over an
        #: overlay of thousands of topics makes one per topic on the loop)
        self._row = _row_table(self.topics)
        self.cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, pa.Table] = collections.OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lookups
    def row_of(self, topic: str) -> int:
        """The row of ``topic`` (tombstones too), or -1."""
        return self._row.get(topic, -1)

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
        t = _read(self.files[f], _BULKY)
        with self._lock:
            self._cache[f] = t
            self._cached += t.get_total_buffer_size()
            while self._cached > self.cache_bytes and len(self._cache) > 1:
                _k, old = self._cache.popitem(last=False)
                self._cached -= old.get_total_buffer_size()
        return t

    def warm(self, deadline: float) -> int:
        """Read into the cache the files whose payloads and properties fit
        in what is left of it, until ``deadline`` (monotonic); returns the
        bytes cached. A file larger than the cache is read only when a
        replay needs it (and then kept while it is the newest entry)."""
        for f in range(len(self.files)):
            if time.monotonic() > deadline or self._cached >= self.cache_bytes:
                break
            try:
                t = _read(self.files[f], _BULKY)
            except OSError:
                continue
            size = t.get_total_buffer_size()
            if self._cached + size > self.cache_bytes:
                continue
            with self._lock:
                self._cache[f] = t
                self._cached += size
        return self._cached

    def messages(self, rows, clock_offset: float) -> list[Message | None]:
        """The message of each row (None where its file cannot be read: the
        caller counts and logs it), in the order given. ``clock_offset``:
        wall clock minus the server's clock (arrival times in the server's).
        Vectorised per file: a replay builds thousands at a time."""
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        out: list[Message | None] = [None] * n
        if not n:
            return out
        topics = self.topics.take(pa.array(rows)).to_pylist()
        qos = self.qos[rows].tolist()
        expiry = self.expiry[rows].tolist()
        received = (self.set_at_us[rows] / 1e6 - clock_offset).tolist()
        own = self.own[rows].tolist()
        part = self.partition[rows].tolist()
        off = self.offset[rows].tolist()
        frags = self.frag[rows]
        groups = [(int(frags[0]), np.arange(n))] if (frags == frags[0]).all() else \
            [(int(f), np.flatnonzero(frags == f)) for f in np.unique(frags)]
        for f, idx in groups:
            try:
                t = self._bulky(f)
            except OSError as exc:  # the file went away (vacuumed): the caller counts it
                log.warning("retained table version %d: file %s cannot be read (%s)", self.version,
                            self.files[f], exc)
                continue
            sub = t.take(pa.array(self.frow[rows[idx]]))
            payloads = sub["payload"].to_pylist()
            props = [sub[c].to_pylist() if sub[c].null_count < len(sub) else None
                     for c in _BULKY[1:]]
            plain = all(c is None for c in props)
            for k, i in enumerate(idx.tolist()):
                ref = (part[i], off[i]) if own[i] else None
                if plain and expiry[i] < 0:
                    out[i] = Message(topics[i], qos[i], True, payloads[k] or b"",
                                     received=received[i], ref=ref, ready=True)
                else:
                    out[i] = self._message(topics[i], qos[i], expiry[i], payloads[k],
                                           *((c[k] if c is not None else None) for c in props),
                                           received=received[i], ref=ref)
        return out

    @staticmethod
    def _message(topic: str, qos: int, exp: int, payload, pfi, content_type, response_topic,
                 correlation_data, user_properties, *, received: float, ref) -> Message:
        props = Properties(payload_format_indicator=pfi,
                           message_expiry_interval=exp if exp >= 0 else None,
                           content_type=content_type, response_topic=response_topic,
                           correlation_data=correlation_data,
                           user_properties=[(kv["key"], kv["value"]) if isinstance(kv, dict)
                                            else tuple(kv) for kv in user_properties or ()])
        raw = b""
        if props:
            block = encode_properties(props, Scope.PUBLISH)
            raw = block[_varint_len(block):]
        return Message.from_properties(topic, qos, True, payload or b"", raw, received=received,
                                       ref=ref, ready=True)


def _read(path: str, columns: list[str]) -> pa.Table:
    """``columns`` of one Parquet file, a column the file lacks (written
    before the column was added) as nulls."""
    from bridge.tables.schemas import SCHEMAS

    f = pq.ParquetFile(path)
    have = set(f.schema_arrow.names)
    t = f.read(columns=[c for c in columns if c in have])
    schema = SCHEMAS["retained"]
    # the table's types (a writer may store views, or older types)
    return pa.table({c: pc.cast(t[c], schema.field(c).type) if c in have
                     else pa.nulls(t.num_rows, schema.field(c).type) for c in columns})


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


#: topics per step of :func:`_row_table`: each step is one C call that holds
#: the interpreter lock (about 1 ms here); the thread switch interval only
#: takes it away between steps
ROW_TABLE_STEP = 2048


def _row_table(topics: pa.Array) -> dict[str, int]:
    """``{topic: row}``, a step at a time. Built in one call
    (``dict(zip(topics.to_pylist(), ...))``), 200,000 topics held the
    interpreter lock 150 ms on an idle machine, and the edge's event loop
    with it (issue 38: bench hostile's retained scenario under ``lakegate
    run``, where the table is reloaded as the job commits)."""
    row: dict[str, int] = {}
    n = len(topics)
    for i in range(0, n, ROW_TABLE_STEP):
        j = min(i + ROW_TABLE_STEP, n)
        row.update(zip(topics.slice(i, j - i).to_pylist(), range(i, j)))
    return row


def load_snapshot(table_path: Path, stream: str, cache_bytes: int,
                  warm_s: float = 5.0) -> Snapshot | None:
    """The table's latest version (None: there is no table yet). Raises
    :class:`SnapshotError` with one line when the version cannot be read,
    or when its protocol needs what the edge does not read
    (:func:`unreadable`; checked before any data file is listed)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if not (Path(table_path) / "_delta_log").is_dir():
        return None  # no table yet (and no need to load deltalake for it)
    try:
        dt = DeltaTable(str(table_path))
    except TableNotFoundError:
        return None
    except Exception as exc:
        raise SnapshotError(f"retained table {table_path}: cannot be opened: {_line(exc)}") from None
    try:
        version = dt.version()
        protocol = dt.protocol()
        configuration = dt.metadata().configuration
        refused = unreadable(protocol.min_reader_version, protocol.reader_features, configuration)
        if refused:
            raise _refusal(table_path, version, refused, configuration)
        covered = covered_offsets(dt.history(HISTORY_DEPTH), stream)
        files = dt.file_uris()
        parts = [_read(u, _SMALL) for u in files]
    except SnapshotError:
        raise
    except Exception as exc:  # a damaged log or file
        raise SnapshotError(f"retained table {table_path}: version cannot be read "
                            f"({_line(exc)})") from None
    from bridge.tables.schemas import SCHEMAS

    small = pa.concat_tables(parts) if parts else \
        SCHEMAS["retained"].empty_table().select(_SMALL)
    frag = np.repeat(np.arange(len(parts), dtype=np.int32), [p.num_rows for p in parts]) \
        if parts else np.zeros(0, np.int32)
    frow = np.concatenate([np.arange(p.num_rows, dtype=np.int32) for p in parts]) \
        if parts else np.zeros(0, np.int32)
    snap = Snapshot(version, covered, small, frag, frow, files, stream, cache_bytes)
    del small, parts
    snap.warm(time.monotonic() + warm_s)
    _give_back()
    return snap


def unreadable(min_reader_version: int, reader_features, configuration) -> list[str]:
    """What of a table's protocol (its ``minReaderVersion``, ``readerFeatures``
    and table properties) the edge does not read (:data:`EDGE_READS`), as
    the reader features to name ("reader version N" for an unknown
    version); empty when the edge reads the table as it is."""
    features = set(reader_features or ())
    if min_reader_version == 2:
        features.add("columnMapping")  # the legacy protocol version's one feature
    elif min_reader_version not in EDGE_READS["reader_versions"]:
        return [f"reader version {min_reader_version}"]
    mode = ((configuration or {}).get("delta.columnMapping.mode") or "none").lower()
    if mode in EDGE_READS["column_mapping_modes"]:
        features.discard("columnMapping")  # files carry the table's column names
    else:
        features.add("columnMapping")
    return sorted(features - EDGE_READS["reader_features"])


def _refusal(table_path: Path, version: int, refused: list[str], configuration) -> SnapshotError:
    """The one-line refusal: which table, what of its protocol, why, what to do."""
    mode = (configuration or {}).get("delta.columnMapping.mode") or "none"
    named = []
    for f in refused:
        if f.startswith("reader version "):
            named.append(f)
        elif f == "columnMapping":
            named.append(f"reader feature columnMapping (delta.columnMapping.mode = {mode}: "
                         f"{_WHY[f]})")
        else:
            named.append(f"reader feature {f}" + (f" ({_WHY[f]})" if f in _WHY else ""))
    drop = [f for f in refused if not f.startswith("reader version ")]
    remedy = None
    if drop:
        remedy = "to serve it, drop with Spark (Delta 4): " + ", ".join(
            f"ALTER TABLE delta.`{table_path}` DROP FEATURE {f}" for f in drop)
    return SnapshotError(f"retained table {table_path}: needs {' and '.join(named)}, which the "
                         "edge does not read", remedy, version)


def _give_back() -> None:
    """Return what building a snapshot freed to the system: Arrow's pool
    (mimalloc) and glibc's malloc keep freed pages otherwise, and a million
    topics leave a few hundred MB of them behind."""
    pa.default_memory_pool().release_unused()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
