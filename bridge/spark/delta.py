"""The table engine of a process with a SparkSession.

``tables.engine = "auto"``: delta-spark on a cluster (a master that is not
``local``) when its JVM classes are on the classpath, where Spark's
executors write the tables; else delta-rs (:mod:`bridge.tables.engine`,
which never loads Spark), the embedded engine of one machine
(``lakegate run``, ``lakegate process``): docs/tables.md has the
measurements behind the choice (``lakegate bench tables``).
``"delta-spark"`` or ``"delta-rs"`` choose one whatever the mode."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bridge.spark.session import DELTA_CLASS, delta_spark_available
from bridge.tables.engine import TableEngine, one_line
from bridge.tables.engine import make_engine as make_engine_without_spark

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from bridge.config import Config

__all__ = ["failure_line", "make_engine"]

log = logging.getLogger("bridge.tables.engine")


def make_engine(config: "Config", spark: "SparkSession | None" = None) -> TableEngine:
    """The engine ``tables.engine`` asks for (module doc)."""
    choice = config.tables.engine
    if choice == "auto":
        cluster = spark is not None and not spark.sparkContext.master.startswith("local")
        choice = "delta-spark" if cluster and delta_spark_available(spark) else "delta-rs"
    if choice != "delta-spark" or spark is None:
        return make_engine_without_spark(config)  # delta-rs (or the error of delta-spark without a session)
    from bridge.spark.deltaspark import DeltaSparkEngine

    engine = DeltaSparkEngine(config.tables_dir, spark)
    log.info("tables: engine=%s dir=%s", engine.name, config.tables_dir)
    return engine


def failure_line(engine: TableEngine, exc: BaseException) -> str:
    """A failed table operation in one line; names delta-spark's missing JVM
    classes when they are the cause (py4j's own words for it are cryptic)."""
    msg = one_line(exc)
    spark = getattr(engine, "spark", None)
    if engine.name == "delta-spark" and spark is not None and not delta_spark_available(spark):
        return f"tables.engine = delta-spark, but delta-spark's JVM classes ({DELTA_CLASS}) are not on the classpath ({msg})"
    return msg
