"""The table engine of a process with a SparkSession.

``tables.engine = "auto"``: delta-spark on a cluster (a master that is not
``local``) when its JVM classes are on the classpath, where Spark's
executors write the tables; else delta-rs (:mod:`bridge.tables.engine`,
which never loads Spark), the embedded engine of one machine
(``lakegate run``, ``lakegate process``): docs/tables.md has the
measurements behind the choice (``lakegate bench tables``).
``"delta-spark"`` or ``"delta-rs"`` choose one whatever the mode.

``"delta-spark"`` asked for on a machine without its jars
(``.jvm/lib/delta``, ``scripts/bootstrap``) stops ``lakegate process`` and
``lakegate run`` before any session (:func:`require_jars`: one line, exit
2); under spark-submit the session factory checks the classpath instead.

Two jobs on one checkpoint (one ``data_dir`` and ``job.query_name``) write
the same batches under the same Delta application transaction id; when
both commit one at the same moment, Delta refuses the second commit
(delta-rs: ``CommitFailedError: ... Concurrent transaction failed``;
delta-spark: ``ConcurrentTransactionException``); the table step turns
that into one line (:class:`bridge.tables.writer.ConcurrentJobError`).
Spark's checkpoint usually stops the second job first
(``CONCURRENT_STREAM_LOG_UPDATE``, docs/job.md "Two jobs on one
checkpoint")."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bridge.spark.session import DELTA_CLASS, delta_spark_available, under_spark_submit
from bridge.tables.engine import TableEngine, one_line
from bridge.tables.engine import make_engine as make_engine_without_spark

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from bridge.config import Config

__all__ = ["failure_line", "make_engine", "require_jars"]

log = logging.getLogger("bridge.tables.engine")


def require_jars(config: "Config") -> None:
    """``tables.engine = "delta-spark"`` without usable delta-spark jars in
    ``.jvm/lib/delta``: :class:`bridge.spark.jars.JarsUnusable` (one line,
    exit 2), before any session. Nothing to check for the other engines,
    nor under spark-submit (its classpath is the session factory's to check)."""
    if config.tables.engine != "delta-spark" or under_spark_submit():
        return
    from bridge.spark import jars

    bad = jars.problems("delta", purpose=False)
    if bad:
        source = config.sources.get("tables.engine", "default")
        raise jars.JarsUnusable("tables.engine", source, f"tables.engine = delta-spark (from {source}), but {bad[0]}")


def make_engine(config: "Config", spark: "SparkSession | None" = None) -> TableEngine:
    """The engine ``tables.engine`` asks for (module doc)."""
    choice = config.tables.engine
    if choice == "auto":
        choice = "delta-spark" if _on_a_cluster(spark) and delta_spark_available(spark) else "delta-rs"
    if choice != "delta-spark" or spark is None:
        engine = make_engine_without_spark(config)  # delta-rs (or the error of delta-spark without a session)
    else:
        from bridge.spark.deltaspark import DeltaSparkEngine

        engine = DeltaSparkEngine(config.tables_dir, spark)
        log.info("tables: engine=%s dir=%s", engine.name, config.tables_dir)
    return engine


def _on_a_cluster(spark: "SparkSession | None") -> bool:
    """The session's master is a cluster's (not ``local[...]``); False for a
    Spark Connect client session, which has no SparkContext to ask."""
    if spark is None:
        return False
    try:
        return not spark.sparkContext.master.startswith("local")
    except Exception:  # noqa: BLE001 - Spark Connect: no sparkContext (PySparkNotImplementedError)
        return False


def failure_line(engine: TableEngine, exc: BaseException) -> str:
    """A failed table operation in one line; names delta-spark's missing JVM
    classes when they are the cause (py4j's own words for it are cryptic)."""
    msg = one_line(exc)
    spark = getattr(engine, "spark", None)
    if engine.name == "delta-spark" and spark is not None and not delta_spark_available(spark):
        return f"tables.engine = delta-spark, but delta-spark's JVM classes ({DELTA_CLASS}) are not on the classpath ({msg})"
    return msg
