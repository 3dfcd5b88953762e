"""The one Spark session factory.

``build_session(config)`` returns a SparkSession:

* under ``spark-submit`` it uses the master and settings spark-submit gave
  (never overrides ``--master``), and sets the executors' Python to the
  driver's interpreter unless ``PYSPARK_PYTHON`` / ``spark.pyspark.python``
  says otherwise, and on a cluster master checks that the executors import
  lakegate with it (:mod:`bridge.spark.executor_python`);
* otherwise it starts a local session (``spark.master``, default ``local[*]``)
  after checking that Java 17+ is present (:class:`bridge.javacheck.JavaMissing`
  otherwise), with the project's quiet log4j2 configuration and the jars
  of ``.jvm/lib/`` that ``scripts/bootstrap`` resolved (delta-spark and its
  SQL extension, Spark's Kafka connector: :mod:`bridge.spark.jars`).

Library code never reaches for a global session: callers pass ``spark``.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
import sys
from typing import TYPE_CHECKING, Mapping

from bridge.config import Config, conf_dir
from bridge.javacheck import require_java
from bridge.spark import executor_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["build_session", "conf_dir", "under_spark_submit", "DELTA_CLASS"]

log = logging.getLogger(__name__)

#: A class that exists only when delta-spark's jars are on the JVM classpath.
DELTA_CLASS = "io.delta.sql.DeltaSparkSessionExtension"


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (the JVM exists already)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _base_conf(config: Config) -> dict[str, str]:
    conf = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.spark.shuffle_partitions),
        "spark.ui.enabled": "true" if config.spark.ui_enabled else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": config.spark.driver_memory,
        # Python workers must run the interpreter that has lakegate installed.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # Python workers forked with the parser, pandas and pyarrow imported (bridge/spark/daemon.py)
        "spark.python.daemon.module": "bridge.spark.daemon",
        # Not ./spark-warehouse of whatever directory the process runs in (a notebook's: notebooks/).
        "spark.sql.warehouse.dir": str(config.data_path / "spark-warehouse"),
    }
    java = shlex.split(config.spark.java_options)
    if not any(o.startswith(("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit")) for o in java):
        from bridge.spark.class_archive import java_flags

        java += java_flags(config)  # the JVM's classes from an archive, when there is one
    cdir = conf_dir()
    if cdir is not None and (cdir / "log4j2.properties").exists():
        java.append(f"-Dlog4j2.configurationFile=file:{cdir / 'log4j2.properties'}")
    if java:
        conf["spark.driver.extraJavaOptions"] = shlex.join(java)
    return conf


def _python_path_for_static_sources() -> None:
    """Spark's lookup of statically registered Python data sources walks the Python
    workers' ``sys.path`` for ``pyspark_*`` modules: put ``bridge/sqlserve/static_sources``
    (the SQL endpoint's table sources) on ``PYTHONPATH``; the JVM, started next, hands it
    to the workers."""
    where = str(Path(__file__).resolve().parents[1] / "sqlserve" / "static_sources")
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if where not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([where, *parts])


def build_session(config: Config, app_name: str | None = None, extra: Mapping[str, str] | None = None) -> "SparkSession":
    """Build (or get) the SparkSession for ``config``.

    ``extra``: additional Spark properties. Raises JavaMissing (local mode only)
    when Java 17+ is absent; under spark-submit, ExecutorPythonError when
    the executors' Python cannot be chosen or, on a cluster, cannot run lakegate.
    """
    from pyspark.sql import SparkSession

    name = app_name or config.spark.app_name
    if under_spark_submit():
        # before the SparkContext starts: it reads $PYSPARK_PYTHON once, for every Python function it ships
        python = executor_python.apply().python
        builder = SparkSession.builder.appName(name).config(executor_python.CONF, python)
        for k, v in (extra or {}).items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        try:
            executor_python.check_executors(spark, python)
        except executor_python.ExecutorPythonError:
            spark.stop()
            raise
    else:
        require_java()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        _python_path_for_static_sources()
        from bridge.spark.jars import spark_conf

        # delta-spark and Spark's Kafka connector from .jvm/lib/ (scripts/bootstrap), when there
        conf = {**_base_conf(config), **spark_conf(), **(extra or {})}
        builder = SparkSession.builder.master(config.spark.master).appName(name)
        for k, v in conf.items():
            builder = builder.config(k, v)
        try:
            spark = builder.getOrCreate()
        except Exception as exc:
            from bridge.spark.class_archive import jvm_did_not_start, set_aside, without_archive

            java = conf.get("spark.driver.extraJavaOptions", "")
            if without_archive(java) == java or not jvm_did_not_start(exc):
                raise
            # a JVM that crashed on its class archive (a damaged file): once more without it
            set_aside(config, exc)
            spark = builder.config("spark.driver.extraJavaOptions", without_archive(java)).getOrCreate()
    spark.sparkContext.setLogLevel(config.spark.log_level)
    log.info("spark session: master=%s app=%s version=%s", spark.sparkContext.master, name, spark.version)
    return spark


def delta_spark_available(spark: "SparkSession") -> bool:
    """True when delta-spark's JVM classes are on the classpath (the JVM's
    own, or Spark's for ``spark.jars`` / ``--jars``: looked up as Spark
    looks up a class, through the context class loader)."""
    try:
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j handle, no public API
        jvm.org.apache.spark.util.Utils.classForName(DELTA_CLASS, False, False)
        return True
    except Exception:  # py4j raises Py4JJavaError (ClassNotFoundException)
        return False
