"""One interface over two Delta engines.

* ``delta-rs`` (``deltalake``, the embedded default): writes and reads Delta
  from Python with no JVM jars; Spark reads the snapshot's Parquet files.
* ``delta-spark`` (:mod:`bridge.spark.deltaspark`, chosen by
  :func:`bridge.spark.delta.make_engine`: this layer never loads Spark):
  used when delta-spark's JVM classes are on the classpath;
  ``spark.read.format("delta")`` and ``MERGE INTO``.

Both give the same semantics, and a table written by one is read, appended
to and merged by the other (``tests/tables/test_engines*.py`` run every case
on both and compare them version by version): appends and the retained MERGE
record the writer's application transaction (``app_id``, ``version`` = batch
id); a write whose batch the table already committed is skipped, so a re-run
batch never duplicates. The check is made by the writer itself: delta-rs
records an app transaction but does not refuse a replayed one. Every batch
is one commit on either engine (an empty one still records its
transaction), so the versions line up; a version's time is its commit info's
``timestamp`` on both (:func:`commits_of`), the one ``history`` shows.
"""

from __future__ import annotations

import abc
import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bridge.tables.schemas import PARTITION_BY, SCHEMAS
from schemas.tables import TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bridge.config import Config

__all__ = ["AsOf", "AsOfError", "Commit", "MergeResult", "TABLE_PROPERTIES", "TableEngine", "VersionRange",
           "commits_of", "conform", "make_engine", "one_line", "parse_as_of_time", "PARTITION_BY", "SCHEMAS"]

log = logging.getLogger(__name__)

#: The table properties both engines create every table with. The edge's
#: retained loader (``bridge/edge/retained/snapshot.py``) and the delta-rs
#: engine's Spark reads take a version's Parquet files as they are, so no
#: table may need a reader feature for them: no deletion vectors (a MERGE,
#: UPDATE or DELETE then rewrites the files it changes instead of marking
#: rows deleted in a side file) and no column mapping (the files' column
#: names are the table's). Delta 4.4 turns neither on by itself (a new
#: table is protocol 1/2, no features), but a session default
#: (``spark.databricks.delta.properties.defaults.enableDeletionVectors``,
#: ``...columnMapping.mode``) would: a table property wins over it.
TABLE_PROPERTIES: dict[str, str] = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}


class AsOfError(ValueError):
    """A time-travel version or timestamp that the table does not have (one line)."""


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` in ``schema``: a column it lacks (a version written before the
    column was added) reads null; columns in the schema's order, cast."""
    cols = [rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, names=schema.names).cast(schema)


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first non-empty line (engines' errors carry stacks and plans)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def parse_as_of_time(text: str) -> dt.datetime:
    """An ``--as-of`` timestamp (ISO 8601; no zone means UTC) as an aware UTC datetime."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise AsOfError(f"--as-of {text!r} is neither a version number nor an ISO timestamp") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc)


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp: dt.datetime  # the commit's time, UTC


@dataclass(frozen=True)
class AsOf:
    """What an ``as_of`` resolves to in one table."""

    version: int              # the version read
    committed_at: dt.datetime  # that version's commit time (UTC)
    moment: dt.datetime        # the moment the read stands for: the timestamp asked for, else committed_at


@dataclass(frozen=True)
class MergeResult:
    skipped: bool          # the table had committed this batch already
    upserts: int           # topics this batch sets or replaces
    deletes: int           # topics this batch clears (tombstones)
    applied: int = 0       # rows the MERGE changed (late, older changes are not applied)


@dataclass(frozen=True)
class VersionRange:
    oldest: int
    newest: int


def commits_of(dtable: Any) -> list[Commit]:
    """The versions a ``deltalake.DeltaTable`` can read, oldest first, dated by
    their commit info's ``timestamp`` (what ``history`` and the
    ``retained_versions`` view show; delta-spark's own ``DESCRIBE HISTORY``
    dates a version by its commit file's modification time, a few ms later,
    and an ``--as-of`` of the time ``retained_versions`` shows would then
    read the version before)."""
    out = {}
    for h in dtable.history():
        if h.get("version") is not None and h.get("timestamp") is not None:
            out[int(h["version"])] = Commit(int(h["version"]),
                                            dt.datetime.fromtimestamp(h["timestamp"] / 1000, tz=dt.timezone.utc))
    if not out:  # no commit info (a writer that leaves it out): the current version, at the table's creation
        created_ms = dtable.metadata().created_time or 0
        out[dtable.version()] = Commit(dtable.version(), dt.datetime.fromtimestamp(created_ms / 1000, tz=dt.timezone.utc))
    return [out[v] for v in sorted(out)]


class TableEngine(abc.ABC):
    """Delta tables under ``tables_dir``: messages, retained, quarantine."""

    name: str = "?"

    def __init__(self, tables_dir: str | Path) -> None:
        self.tables_dir = Path(tables_dir)

    def path(self, table: str) -> Path:
        if table not in TABLES:
            raise KeyError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        return self.tables_dir / table

    @abc.abstractmethod
    def ensure(self) -> None:
        """Create the three tables when missing (idempotent)."""

    @abc.abstractmethod
    def committed_version(self, table: str, app_id: str) -> int | None:
        """The last batch id ``app_id`` committed to ``table`` (None: never)."""

    @abc.abstractmethod
    def append(self, table: str, rows: pa.Table, app_id: str, version: int) -> bool:
        """Append rows under app transaction (app_id, version); False when skipped as a replay."""

    @abc.abstractmethod
    def merge_retained(self, changes: pa.Table, app_id: str, version: int,
                       metadata: str | None = None) -> MergeResult:
        """Apply ``retained_rule.retained_changes`` output: replace a topic's row only
        when the change has a higher capture sequence; insert otherwise.
        ``metadata``: the commit's ``userMetadata`` (the capture offsets the
        version covers, ``bridge.tables.coverage``)."""

    def history(self, table: str, limit: int | None = None) -> list[dict]:
        """Commit infos, newest first (``userMetadata`` among them)."""
        from deltalake import DeltaTable

        return DeltaTable(str(self.path(table))).history(limit)

    @abc.abstractmethod
    def dataframe(self, spark: "SparkSession", table: str, as_of: int | str | None = None) -> "DataFrame":
        """The table (optionally at a version or timestamp) as a Spark DataFrame;
        a version that cannot be read is one ``AsOfError`` line."""

    @abc.abstractmethod
    def arrow(self, table: str, as_of: int | str | None = None) -> pa.Table:
        """The table (optionally at a version or timestamp) as Arrow in the
        table's schema, read by this engine (driver memory: for tests, the
        demo and small tables)."""

    @abc.abstractmethod
    def commits(self, table: str) -> list[Commit]:
        """The versions that can be read, oldest first, with their commit times."""

    def versions(self, table: str) -> VersionRange:
        """Oldest and newest version that can be read."""
        commits = self.commits(table)
        return VersionRange(oldest=commits[0].version, newest=commits[-1].version)

    def resolve_as_of(self, table: str, as_of: int | str) -> AsOf:
        """The version ``as_of`` (a version number, or an ISO timestamp: the newest
        version committed at or before it) names in ``table``.

        Both engines time-travel by the version this returns, so they agree;
        raises ``AsOfError`` (one line naming the oldest and newest versions)
        when there is none.
        """
        commits = self.commits(table)
        first, last = commits[0], commits[-1]
        if isinstance(as_of, int):
            found = [c for c in commits if c.version == as_of]
            if not found:
                raise AsOfError(f"{table}: version {as_of} does not exist (oldest {first.version}, newest {last.version})")
            return AsOf(version=as_of, committed_at=found[0].timestamp, moment=found[0].timestamp)
        when = parse_as_of_time(as_of)
        before = [c for c in commits if c.timestamp <= when]
        if not before:
            raise AsOfError(f"{table}: no version at or before {_iso(when)} (oldest {first.version} "
                            f"committed {_iso(first.timestamp)}, newest {last.version} committed {_iso(last.timestamp)})")
        chosen = max(before, key=lambda c: c.version)
        return AsOf(version=chosen.version, committed_at=chosen.timestamp, moment=when)

    @abc.abstractmethod
    def compact(self) -> dict[str, Any]:
        """Compact small files of every table; returns metrics per table."""

    @abc.abstractmethod
    def vacuum(self, retention_hours: int) -> dict[str, int]:
        """Delete files no longer referenced and older than the retention (those
        a version removed, and strays a failed write left); counts per table."""

    @abc.abstractmethod
    def expire_retained(self, now_us: int) -> int:
        """Turn retained rows whose expires_at has passed into tombstones; returns how many."""


def make_engine(config: "Config") -> TableEngine:
    """The engine of a process without Spark (the live forwarder's
    quarantine): delta-rs, unless ``tables.engine = "delta-spark"`` asks for
    what only a SparkSession gives (ValueError). With a session:
    :func:`bridge.spark.delta.make_engine`."""
    if config.tables.engine == "delta-spark":
        raise ValueError("tables.engine = delta-spark needs a SparkSession")
    from bridge.tables.deltars import DeltaRsEngine

    engine = DeltaRsEngine(config.tables_dir)
    log.info("tables: engine=%s dir=%s", engine.name, config.tables_dir)
    return engine
