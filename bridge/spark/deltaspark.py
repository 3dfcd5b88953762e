"""The delta-spark engine: used when delta-spark's JVM classes are on the
classpath (e.g. ``spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.1``
with ``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension`` and
``spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog``).

Same semantics as the delta-rs engine: appends use delta-spark's idempotent
writes (``txnAppId``/``txnVersion``) and the retained MERGE runs as
``MERGE INTO`` with the session's ``spark.databricks.delta.write.txnAppId`` /
``txnVersion`` set; before either, the writer checks the table's last
committed version for its app id itself (read with delta-rs, which reads any
Delta table), so a replayed batch is skipped the same way on both engines.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bridge.tables.engine import PARTITION_BY, SCHEMAS, Commit, MergeResult, TableEngine
from bridge.tables.retained_rule import SUPERSEDES_SQL
from schemas.spark import to_spark
from schemas.tables import TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DeltaSparkEngine"]

log = logging.getLogger(__name__)


class DeltaSparkEngine(TableEngine):
    name = "delta-spark"

    def __init__(self, tables_dir, spark: "SparkSession") -> None:
        super().__init__(tables_dir)
        self.spark = spark

    # -- helpers -----------------------------------------------------------
    def _delta_table(self, table: str):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.spark, str(self.path(table)))

    def _df(self, table: str, rows: pa.Table) -> "DataFrame":
        return self.spark.createDataFrame(rows.cast(SCHEMAS[table]), to_spark(TABLES[table]))

    # -- interface ---------------------------------------------------------
    def ensure(self) -> None:
        from delta.tables import DeltaTable

        self.tables_dir.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            p = str(self.path(table))
            if not DeltaTable.isDeltaTable(self.spark, p):
                builder = DeltaTable.createIfNotExists(self.spark).location(p).addColumns(to_spark(TABLES[table]))
                if PARTITION_BY[table]:
                    builder = builder.partitionedBy(*PARTITION_BY[table])
                builder.execute()
                log.info("tables: created %s at %s (delta-spark)", table, p)
            else:
                self._add_missing_columns(table, p)

    def _add_missing_columns(self, table: str, p: str) -> None:
        """Schema evolution: add the columns a table made by an older lakegate
        lacks (nullable; old rows read null). Columns are only ever added."""
        have = set(self.spark.read.format("delta").load(p).columns)
        missing = [f for f in to_spark(TABLES[table]).fields if f.name not in have]
        if missing:
            cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            self.spark.sql(f"ALTER TABLE delta.`{p}` ADD COLUMNS ({cols})")
            log.info("tables: %s: added columns %s (delta-spark)", table, ", ".join(f.name for f in missing))

    def committed_version(self, table: str, app_id: str) -> int | None:
        from deltalake import DeltaTable as RsTable

        return RsTable(str(self.path(table))).transaction_version(app_id)

    def append(self, table: str, rows: pa.Table, app_id: str, version: int) -> bool:
        last = self.committed_version(table, app_id)
        if last is not None and last >= version:
            log.info("tables: %s already has batch %d of %s; skipped", table, version, app_id)
            return False
        (self._df(table, rows).write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", version).save(str(self.path(table))))
        return True

    def merge_retained(self, changes: pa.Table, app_id: str, version: int,
                       metadata: str | None = None) -> MergeResult:
        last = self.committed_version("retained", app_id)
        if last is not None and last >= version:
            return MergeResult(skipped=True, upserts=0, deletes=0)
        deletes = sum(1 for d in changes["deleted"].to_pylist() if d) if changes.num_rows else 0
        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", app_id)
        conf.set("spark.databricks.delta.write.txnVersion", str(version))
        if metadata:
            conf.set("spark.databricks.delta.commitInfo.userMetadata", metadata)
        try:
            target = self._delta_table("retained")
            metrics = (
                target.alias("t")
                .merge(self._df("retained", changes).alias("s"), "t.topic = s.topic")
                .whenMatchedUpdateAll(condition=SUPERSEDES_SQL)
                .whenNotMatchedInsertAll()
                .execute()
            )
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")
            conf.unset("spark.databricks.delta.commitInfo.userMetadata")
        applied = 0
        if metrics is not None:
            row = metrics.first()
            applied = int(row["num_inserted_rows"] or 0) + int(row["num_updated_rows"] or 0)
        if self.committed_version("retained", app_id) != version:
            # A MERGE that changed nothing commits nothing: record the transaction.
            empty = self._df("retained", SCHEMAS["retained"].empty_table()).write.format("delta").mode("append")
            if metadata:
                empty = empty.option("userMetadata", metadata)
            empty.option("txnAppId", app_id).option("txnVersion", version).save(str(self.path("retained")))
        return MergeResult(skipped=False, upserts=changes.num_rows - deletes, deletes=deletes, applied=applied)

    def dataframe(self, spark: "SparkSession", table: str, as_of: int | str | None = None) -> "DataFrame":
        reader = spark.read.format("delta")
        if as_of is not None:
            # A timestamp is resolved against the table's history first (the
            # newest version committed at or before it), as on delta-rs, so a
            # time before the first commit is one AsOfError line, not Delta's
            # exception, and both engines read the same version.
            reader = reader.option("versionAsOf", self.resolve_as_of(table, as_of).version)
        return reader.load(str(self.path(table)))

    def commits(self, table: str) -> list[Commit]:
        # unix_millis: collecting a TIMESTAMP would give a naive datetime in the
        # Python process's local zone.
        hist = self._delta_table(table).history().selectExpr("version", "unix_millis(timestamp) AS ms").collect()
        return sorted((Commit(int(r.version), dt.datetime.fromtimestamp(r.ms / 1000, tz=dt.timezone.utc)) for r in hist),
                      key=lambda c: c.version)

    def compact(self) -> dict[str, Any]:
        out = {}
        for table in TABLES:
            m = self._delta_table(table).optimize().executeCompaction().first()["metrics"]
            out[table] = {"files_added": m["numFilesAdded"], "files_removed": m["numFilesRemoved"]}
        return out

    def vacuum(self, retention_hours: int) -> dict[str, int]:
        out = {}
        for table in TABLES:
            self._delta_table(table).vacuum(float(retention_hours))
            out[table] = -1  # delta-spark's vacuum does not return a count
        return out

    def expire_retained(self, now_us: int) -> int:
        now = dt.datetime.fromtimestamp(now_us / 1e6, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        cond = f"NOT deleted AND expires_at IS NOT NULL AND expires_at <= TIMESTAMP '{now} UTC'"
        target = self._delta_table("retained")
        n = target.toDF().where(cond).count()
        nulls = {c: "NULL" for c in ("payload", "qos", "payload_format_indicator", "message_expiry_interval",
                                     "content_type", "response_topic", "correlation_data", "user_properties",
                                     "set_at", "expires_at")}
        target.update(condition=cond, set={"deleted": "true", **nulls})
        return n
