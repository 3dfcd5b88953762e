"""The delta-spark engine: used when delta-spark's JVM classes are on the
classpath (``scripts/bootstrap`` puts them on every local session's, with
``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension``:
:mod:`bridge.spark.jars`).

The delta-rs engine's behaviour, exactly (``tests/tables/test_engines*.py``
run every case on both and compare the tables version by version):

* appends use delta-spark's idempotent writes (``txnAppId``/``txnVersion``)
  and the retained MERGE runs as ``MERGE INTO`` with the session's
  ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` set; before
  either, the writer checks the table's last committed version for its app
  id itself (read with delta-rs, which reads any table these engines make),
  so a replayed batch is skipped the same way on both engines;
* a batch with no retained change commits an empty append recording its
  transaction (and coverage), as delta-rs does, instead of a MERGE;
* tables are created with :data:`~bridge.tables.engine.TABLE_PROPERTIES`
  (no deletion vectors, no column mapping: the edge reads the Parquet files);
* a version's time is its commit info's (:func:`~bridge.tables.engine.commits_of`);
* Parquet timestamps are INT64 microseconds as delta-rs writes them, not
  Spark's INT96; VACUUM takes lakegate's retention, not Delta's 7-day floor
  (``run_maintenance`` enforces its own minimum), runs only when there is
  something to delete and counts what it deleted
  (:func:`bridge.tables.deltars.vacuum_candidates`).

Writes run through a session of the engine's own (``spark.newSession()``:
the same SparkContext, its own SQL settings, :data:`WRITER_CONF`), one at a
time, so that the per-write settings (the app transaction, the commit's
``userMetadata``) never leak into the caller's session or another thread's
write. Reads (:meth:`DeltaSparkEngine.dataframe`) use the caller's session.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from bridge.tables.engine import (PARTITION_BY, SCHEMAS, TABLE_PROPERTIES, AsOfError, Commit, MergeResult,
                                   TableEngine, commits_of, conform, one_line)
from bridge.tables.retained_rule import SUPERSEDES_SQL, TOMBSTONE_NULLS
from schemas.spark import to_spark
from schemas.tables import TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DeltaSparkEngine", "LOCAL_CONF", "MAINTENANCE_KEY", "MAINTENANCE_TOKEN_PROPERTY", "WRITER_CONF"]

#: The session setting that exempts a session from the SQL endpoint's maintenance guard
#: (``bridge.sqlserve.catalog``): this engine's writing session carries the token the guard
#: holds, which the guard keeps in the JVM system property MAINTENANCE_TOKEN_PROPERTY (a Spark
#: Connect client sees neither): lakegate's own OPTIMIZE and VACUUM pass, a client's do not.
MAINTENANCE_KEY = "spark.lakegate.maintenance.token"
MAINTENANCE_TOKEN_PROPERTY = "lakegate.maintenance.token"

log = logging.getLogger(__name__)

#: Settings of the engine's writing session (module doc).
WRITER_CONF = {
    # the Parquet timestamp delta-rs writes (INT64 microseconds, UTC-adjusted), which
    # the edge's loader reads as is; Spark's default is the deprecated INT96
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # VACUUM below Delta's 7-day floor: lakegate enforces its own minimum
    # (maintenance.MIN_VACUUM_HOURS), as the delta-rs engine does
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # VACUUM START / VACUUM END commits, as delta-rs writes them
    "spark.databricks.delta.vacuum.logging.enabled": "true",
}

#: Settings for a local master, unless the Spark configuration sets them:
#: Delta sizes its jobs for a cluster (50 partitions to rebuild a snapshot's
#: state, 10,000 to list a table's directory for VACUUM) and on one machine
#: every task costs: a one-row append took 26 s, a VACUUM of ten files 48 s,
#: on 2 cores. The machine's parallelism instead. The first also applies to
#: the caller's session (its reads rebuild snapshots too).
LOCAL_CONF = ("spark.databricks.delta.snapshotPartitions",
              "spark.sql.sources.parallelPartitionDiscovery.parallelism")

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def _quoted(path: str) -> str:
    """``delta.`<path>``` for SQL (a backtick in the path doubled)."""
    return "delta.`" + path.replace("`", "``") + "`"


class DeltaSparkEngine(TableEngine):
    name = "delta-spark"

    def __init__(self, tables_dir, spark: "SparkSession") -> None:
        super().__init__(tables_dir)
        self.spark = spark
        self._writer: "SparkSession | None" = None
        self._lock = threading.RLock()  # one write at a time (the writing session's settings)
        partitions = self._local_conf().get(LOCAL_CONF[0])
        if partitions:
            spark.conf.set(LOCAL_CONF[0], partitions)

    # -- sessions ------------------------------------------------------------
    def _local_conf(self) -> dict[str, str]:
        """:data:`LOCAL_CONF` for a local master ({} otherwise, or for a Spark
        Connect session, which has no SparkContext to ask)."""
        try:
            sc = self.spark.sparkContext
            if not sc.master.startswith("local"):
                return {}
            conf = sc.getConf()
            parallelism = str(max(1, sc.defaultParallelism))
        except Exception:  # noqa: BLE001 - a Spark Connect session: its server's settings stand
            return {}
        return {k: parallelism for k in LOCAL_CONF if not conf.contains(k)}

    @property
    def writer(self) -> "SparkSession":
        """The session this engine writes through (module doc)."""
        with self._lock:
            if self._writer is None:
                try:
                    session = self.spark.newSession()
                except Exception:  # noqa: BLE001 - Spark Connect has no newSession: the caller's session then
                    session = self.spark
                for key, value in {**WRITER_CONF, **self._local_conf()}.items():
                    session.conf.set(key, value)
                self._writer = session
            return self._writer

    @contextlib.contextmanager
    def _settings(self, **settings: str | None) -> Iterator[None]:
        """The writing session with ``settings`` (None: unset), put back after."""
        conf = self.writer.conf

        def put(values: dict[str, str | None]) -> None:
            for k, v in values.items():
                if v is None:
                    conf.unset(k)
                else:
                    conf.set(k, v)

        before = {k: conf.get(k, None) for k in settings}
        try:
            put(settings)
            yield
        finally:
            put(before)

    # -- helpers -------------------------------------------------------------
    def _p(self, table: str) -> str:
        return str(self.path(table))

    def _delta_table(self, table: str):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.writer, self._p(table))

    def _log_table(self, table: str):
        """The table's log as delta-rs reads it (the transactions, history, commit times)."""
        from deltalake import DeltaTable as RsTable

        return RsTable(self._p(table))

    def _df(self, table: str, rows: pa.Table) -> "DataFrame":
        return self.writer.createDataFrame(rows.cast(SCHEMAS[table]), to_spark(TABLES[table]))

    def _already(self, table: str, app_id: str, version: int) -> bool:
        last = self.committed_version(table, app_id)
        if last is not None and last >= version:
            log.info("tables: %s already has batch %d of %s (last %d); skipped", table, version, app_id, last)
            return True
        return False

    def _append(self, table: str, rows: pa.Table, app_id: str, version: int, metadata: str | None = None) -> None:
        writer = self._df(table, rows).write.format("delta").mode("append")
        if metadata:
            writer = writer.option("userMetadata", metadata)
        writer.option("txnAppId", app_id).option("txnVersion", version).save(self._p(table))

    # -- interface -----------------------------------------------------------
    def ensure(self) -> None:
        from delta.tables import DeltaTable

        self.tables_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            for table in TABLES:
                p = self._p(table)
                if not DeltaTable.isDeltaTable(self.writer, p):
                    builder = DeltaTable.createIfNotExists(self.writer).location(p).addColumns(to_spark(TABLES[table]))
                    for key, value in TABLE_PROPERTIES.items():
                        builder = builder.property(key, value)
                    if PARTITION_BY[table]:
                        builder = builder.partitionedBy(*PARTITION_BY[table])
                    builder.execute()
                    log.info("tables: created %s at %s (delta-spark)", table, p)
                else:
                    self._add_missing_columns(table, p)

    def _add_missing_columns(self, table: str, p: str) -> None:
        """Schema evolution: add the columns a table made by an older lakegate
        lacks (nullable; old rows read null). Columns are only ever added."""
        have = {f.name for f in self._log_table(table).schema().fields}
        missing = [f for f in to_spark(TABLES[table]).fields if f.name not in have]
        if missing:
            cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            self.writer.sql(f"ALTER TABLE {_quoted(p)} ADD COLUMNS ({cols})")
            log.info("tables: %s: added columns %s (delta-spark)", table, ", ".join(f.name for f in missing))

    def committed_version(self, table: str, app_id: str) -> int | None:
        return self._log_table(table).transaction_version(app_id)

    def append(self, table: str, rows: pa.Table, app_id: str, version: int) -> bool:
        with self._lock:
            if self._already(table, app_id, version):
                return False
            self._append(table, rows, app_id, version)
        log.debug("tables: %s +%d rows (batch %d, delta-spark)", table, rows.num_rows, version)
        return True

    def merge_retained(self, changes: pa.Table, app_id: str, version: int,
                       metadata: str | None = None) -> MergeResult:
        with self._lock:
            if self._already("retained", app_id, version):
                return MergeResult(skipped=True, upserts=0, deletes=0)
            deletes = sum(1 for d in changes["deleted"].to_pylist() if d) if changes.num_rows else 0
            applied = 0
            if changes.num_rows:
                target = self._delta_table("retained")
                with self._settings(**{_TXN_APP: app_id, _TXN_VERSION: str(version), _USER_METADATA: metadata}):
                    metrics = (
                        target.alias("t")
                        .merge(self._df("retained", changes).alias("s"), "t.topic = s.topic")
                        .whenMatchedUpdateAll(condition=SUPERSEDES_SQL)
                        .whenNotMatchedInsertAll()
                        .execute()
                    )
                if metrics is not None:
                    row = metrics.first()
                    applied = int(row["num_inserted_rows"] or 0) + int(row["num_updated_rows"] or 0)
            if self.committed_version("retained", app_id) != version:
                # No change (an empty batch), or a MERGE that committed nothing:
                # record the transaction in an empty commit, as delta-rs does.
                self._append("retained", SCHEMAS["retained"].empty_table(), app_id, version, metadata)
        return MergeResult(skipped=False, upserts=changes.num_rows - deletes, deletes=deletes, applied=applied)

    def dataframe(self, spark: "SparkSession", table: str, as_of: int | str | None = None) -> "DataFrame":
        reader = spark.read.format("delta")
        if as_of is None:
            return reader.load(self._p(table))
        # A timestamp is resolved against the table's history first (the
        # newest version committed at or before it), as on delta-rs, so a
        # time before the first commit is one AsOfError line, not Delta's
        # exception, and both engines read the same version.
        version = self.resolve_as_of(table, as_of).version
        try:
            return reader.option("versionAsOf", version).load(self._p(table))
        except Exception as exc:  # Spark's errors span lines (plans, causes)
            rng = self.versions(table)
            raise AsOfError(f"{table}: cannot read version {version} (oldest {rng.oldest}, newest {rng.newest}): "
                            f"{one_line(exc)}") from None

    def arrow(self, table: str, as_of: int | str | None = None) -> pa.Table:
        return conform(self.dataframe(self.spark, table, as_of).toArrow(), SCHEMAS[table])

    def commits(self, table: str) -> list[Commit]:
        return commits_of(self._log_table(table))

    def _maintaining(self) -> None:
        """Lakegate's own OPTIMIZE and VACUUM pass the SQL endpoint's maintenance
        guard (``bridge.sqlserve.catalog``): the writing session carries the
        token the guard holds in this JVM, when there is a guard."""
        try:
            token = self.spark.sparkContext._jvm.java.lang.System.getProperty(MAINTENANCE_TOKEN_PROPERTY)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - a Spark Connect session: no JVM here, no guard of ours
            return
        if token:
            self.writer.conf.set(MAINTENANCE_KEY, token)

    def compact(self) -> dict[str, Any]:
        out = {}
        with self._lock:
            self._maintaining()
            for table in TABLES:
                m = self._delta_table(table).optimize().executeCompaction().first()["metrics"]
                out[table] = {"files_added": m["numFilesAdded"], "files_removed": m["numFilesRemoved"]}
        return out

    def vacuum(self, retention_hours: int) -> dict[str, int]:
        from bridge.tables.deltars import vacuum_candidates

        out = {}
        with self._lock:
            self._maintaining()
            for table in TABLES:
                # delta-rs lists what there is to delete (a few ms; Spark's VACUUM lists the
                # table's directory in a job): nothing, no VACUUM and no commit, as on delta-rs
                gone = vacuum_candidates(self._log_table(table), self.path(table), retention_hours)
                if gone:
                    self._delta_table(table).vacuum(float(retention_hours))
                out[table] = sum(1 for f in gone if not f.exists())
        return out

    def expire_retained(self, now_us: int) -> int:
        now = dt.datetime.fromtimestamp(now_us / 1e6, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        cond = f"NOT deleted AND expires_at IS NOT NULL AND expires_at <= TIMESTAMP '{now} UTC'"
        sets = ", ".join(["deleted = true", *(f"{c} = NULL" for c in TOMBSTONE_NULLS)])
        with self._lock:
            row = self.writer.sql(f"UPDATE {_quoted(self._p('retained'))} SET {sets} WHERE {cond}").first()
        return int(row["num_affected_rows"]) if row is not None else 0
