"""The delta-rs engine (``deltalake``): the embedded default.

Writes happen on the driver from Arrow data. Spark reads a snapshot by
listing its active Parquet files (``DeltaTable.file_uris``) with the table's
schema; a table whose protocol needs deletion vectors (written by another
engine) is read through Arrow instead.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from bridge.tables.engine import (PARTITION_BY, SCHEMAS, TABLE_PROPERTIES, AsOfError, Commit, MergeResult,
                                   TableEngine, commits_of, conform, one_line)
from bridge.tables.retained_rule import SUPERSEDES_SQL, TOMBSTONE_NULLS
from schemas.spark import to_spark
from schemas.tables import TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DeltaRsEngine", "vacuum_candidates"]

log = logging.getLogger(__name__)
_COMMIT_RETRIES = 5


def _commit(app_id: str, version: int, metadata: str | None = None) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, version)], max_commit_retries=_COMMIT_RETRIES,
                            custom_metadata={"userMetadata": metadata} if metadata else None)


def _local_path(uri: str) -> str:
    """A data file's path as the file system spells it, from delta-rs's percent-encoded form."""
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(uri).path) if "://" in uri else unquote(uri)


def vacuum_candidates(dtable: DeltaTable, root: Path, retention_hours: int) -> list[Path]:
    """The files a VACUUM of ``dtable`` (at ``root``) would delete and that are
    still there: files the current version does not reference, removed (or,
    for strays a failed write left, written) more than ``retention_hours``
    ago (``full``: delta-spark's VACUUM takes strays too); the retention is
    lakegate's own (``run_maintenance`` enforces its minimum), not the table's.

    Both engines vacuum only when this is not empty, and count what it named
    and is gone after: delta-rs lists a file its log marks removed at every
    VACUUM until the log forgets it, deleted or not (and commits VACUUM START
    / END for it each time), delta-spark's VACUUM commits START / END when it
    deletes nothing; so an idle maintenance commits nothing on either."""
    listed = dtable.vacuum(retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False, full=True)
    files = [root / _local_path(f) for f in listed]
    # not a hidden file: Hadoop's checksum of a data file (.part-....crc, next to
    # what delta-spark wrote) goes with its file, and is no data file of its own
    return [f for f in files if not f.name.startswith((".", "_")) and f.exists()]


class DeltaRsEngine(TableEngine):
    name = "delta-rs"

    def ensure(self) -> None:
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            p = self.path(table)
            if not DeltaTable.is_deltatable(str(p)):
                DeltaTable.create(str(p), schema=SCHEMAS[table], partition_by=PARTITION_BY[table] or None,
                                  mode="ignore", name=table, configuration=dict(TABLE_PROPERTIES))
                log.info("tables: created %s at %s", table, p)
            else:
                self._add_missing_columns(table)

    def _add_missing_columns(self, table: str) -> None:
        """Schema evolution: add the columns a table made by an older lakegate
        lacks (nullable; its old rows read null). Columns are only ever added."""
        from deltalake.schema import Field

        dtable = DeltaTable(str(self.path(table)))
        have = {f.name for f in dtable.schema().fields}
        missing = [f for f in SCHEMAS[table] if f.name not in have]
        if missing:
            dtable.alter.add_columns([Field.from_arrow(f) for f in missing])
            log.info("tables: %s: added columns %s", table, ", ".join(f.name for f in missing))

    def _table(self, table: str) -> DeltaTable:
        try:
            return DeltaTable(str(self.path(table)))
        except TableNotFoundError:
            self.ensure()
            return DeltaTable(str(self.path(table)))

    def _for_write(self, table: str) -> DeltaTable:
        """The table's current snapshot for the batch step's writes: one
        DeltaTable per table kept between batches and brought up to date
        with ``update_incremental`` (reads only the commits since: 2-3 ms,
        where opening the table again reads its log from the last checkpoint:
        5-17 ms, three times a batch). Anything odd (the table replaced, its
        log cleaned under it, a failed write) opens it afresh: a stat of the
        newest commit file tells a table deleted and made again. The step runs
        one batch at a time, so a cached object is never used by two threads
        at once; readers (``_table``, ``_at``) open their own."""
        cache = self.__dict__.setdefault("_writable", {})
        dtable = cache.get(table)
        if dtable is not None:
            try:
                dtable.update_incremental()
                # a table deleted and made again under the open one: its
                # newest commit is gone (update_incremental does not notice)
                if (self.path(table) / "_delta_log" / f"{dtable.version():020d}.json").exists():
                    return dtable
                log.info("tables: %s was replaced (commit %d gone); opened afresh", table, dtable.version())
            except Exception as exc:  # noqa: BLE001 - opened afresh below; the reason is logged
                log.debug("tables: %s: opened afresh (%s)", table, one_line(exc))
        dtable = cache[table] = self._table(table)
        return dtable

    def _forget(self, table: str) -> None:
        self.__dict__.get("_writable", {}).pop(table, None)

    def committed_version(self, table: str, app_id: str) -> int | None:
        return self._for_write(table).transaction_version(app_id)

    def _already(self, table: str, dtable: DeltaTable, app_id: str, version: int) -> bool:
        last = dtable.transaction_version(app_id)
        if last is not None and last >= version:
            log.info("tables: %s already has batch %d of %s (last %d); skipped", table, version, app_id, last)
            return True
        return False

    def append(self, table: str, rows: pa.Table, app_id: str, version: int) -> bool:
        dtable = self._for_write(table)
        if self._already(table, dtable, app_id, version):
            return False
        rows = rows.cast(SCHEMAS[table])
        try:
            write_deltalake(dtable, rows, mode="append", partition_by=PARTITION_BY[table] or None,
                            commit_properties=_commit(app_id, version))
        except Exception:
            self._forget(table)  # the next use opens it afresh
            raise
        log.debug("tables: %s +%d rows (batch %d)", table, rows.num_rows, version)
        return True

    def merge_retained(self, changes: pa.Table, app_id: str, version: int,
                       metadata: str | None = None) -> MergeResult:
        dtable = self._for_write("retained")
        if self._already("retained", dtable, app_id, version):
            return MergeResult(skipped=True, upserts=0, deletes=0)
        deletes = int(sum(1 for d in changes["deleted"].to_pylist() if d)) if changes.num_rows else 0
        upserts = changes.num_rows - deletes
        changes = changes.cast(SCHEMAS["retained"])
        try:
            return self._merge(dtable, changes, app_id, version, metadata, upserts, deletes)
        except Exception:
            self._forget("retained")  # the next use opens it afresh
            raise

    def _merge(self, dtable: DeltaTable, changes: pa.Table, app_id: str, version: int, metadata: str | None,
               upserts: int, deletes: int) -> MergeResult:
        for attempt in range(_COMMIT_RETRIES):
            try:
                before = dtable.version()
                applied = 0
                if changes.num_rows:
                    metrics = (
                        dtable.merge(changes, predicate="t.topic = s.topic", source_alias="s", target_alias="t",
                                     commit_properties=_commit(app_id, version, metadata))
                        .when_matched_update_all(predicate=SUPERSEDES_SQL)
                        .when_not_matched_insert_all()
                        .execute()
                    )
                    applied = int(metrics.get("num_target_rows_inserted", 0)) + int(metrics.get("num_target_rows_updated", 0))
                    dtable.update_incremental()
                if dtable.version() == before:
                    # Nothing changed (empty batch, or only late, older records):
                    # delta-rs made no commit, so record the app transaction in
                    # an empty one; the table's record of what it has applied
                    # never lags behind the other tables.
                    dtable.create_write_transaction([], mode="append", schema=dtable.schema(),
                                                    commit_properties=_commit(app_id, version, metadata))
                break
            except CommitFailedError:
                self._forget("retained")
                if attempt == _COMMIT_RETRIES - 1:
                    raise
                dtable = self._for_write("retained")
                if self._already("retained", dtable, app_id, version):
                    return MergeResult(skipped=True, upserts=0, deletes=0)
        return MergeResult(skipped=False, upserts=upserts, deletes=deletes, applied=applied)

    def _at(self, table: str, as_of: int | str | None) -> DeltaTable:
        dtable = self._table(table)
        if as_of is None:
            return dtable
        # Resolved against the history here (delta-rs itself loads version 0
        # for a timestamp before the first commit, without an error).
        version = self.resolve_as_of(table, as_of).version
        try:
            dtable.load_as_version(version)
        except Exception as exc:  # delta-rs's errors span lines (causes, paths)
            rng = self.versions(table)
            raise AsOfError(f"{table}: cannot read version {version} (oldest {rng.oldest}, newest {rng.newest}): "
                            f"{one_line(exc)}") from None
        return dtable

    def arrow(self, table: str, as_of: int | str | None = None) -> pa.Table:
        """The table as Arrow (driver memory; for tests and small tables)."""
        return conform(self._at(table, as_of).to_pyarrow_table(), SCHEMAS[table])

    def dataframe(self, spark: "SparkSession", table: str, as_of: int | str | None = None) -> "DataFrame":
        dtable = self._at(table, as_of)
        schema = to_spark(TABLES[table])
        features = set(getattr(dtable.protocol(), "reader_features", None) or [])
        if "deletionVectors" in features:
            return spark.createDataFrame(conform(dtable.to_pyarrow_table(), SCHEMAS[table]), schema)
        # delta-rs gives the log's percent-encoded paths (a space is %20), which Spark would
        # take literally: the file system's own spelling
        files = [_local_path(f) for f in dtable.file_uris()]
        if not files:
            return spark.createDataFrame([], schema)
        base = str(self.path(table))
        return spark.read.schema(schema).option("basePath", base).parquet(*files).select(*schema.fieldNames())

    def commits(self, table: str) -> list[Commit]:
        return commits_of(self._table(table))

    def compact(self) -> dict[str, Any]:
        out = {}
        for table in TABLES:
            metrics = self._table(table).optimize.compact()
            out[table] = {"files_added": metrics.get("numFilesAdded", 0), "files_removed": metrics.get("numFilesRemoved", 0)}
        return out

    def vacuum(self, retention_hours: int) -> dict[str, int]:
        out = {}
        for table in TABLES:
            dtable = self._table(table)
            gone = vacuum_candidates(dtable, self.path(table), retention_hours)
            if gone:  # nothing to delete: no VACUUM commits (vacuum_candidates says why)
                dtable.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False,
                              full=True)
            out[table] = sum(1 for f in gone if not f.exists())
        return out

    def expire_retained(self, now_us: int) -> int:
        dtable = self._table("retained")
        now = dt.datetime.fromtimestamp(now_us / 1e6, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        nulls = {c: "NULL" for c in TOMBSTONE_NULLS}
        metrics = dtable.update(
            predicate=f"NOT deleted AND expires_at IS NOT NULL AND expires_at <= arrow_cast('{now}', 'Timestamp(Microsecond, Some(\"UTC\"))')",
            updates={"deleted": "true", **nulls},
        )
        return int(metrics.get("num_updated_rows", 0))
