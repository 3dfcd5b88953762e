"""The one Spark session factory.

``build_session(config)`` returns a SparkSession:

* under ``spark-submit`` it uses the master and settings spark-submit gave
  (never overrides ``--master``), and sets the executors' Python to the
  driver's interpreter unless ``PYSPARK_PYTHON`` / ``spark.pyspark.python``
  says otherwise, and on a cluster master checks that the executors import
  lakegate with it (:mod:`bridge.spark.executor_python`). Before the
  SparkContext starts it checks the jars spark-submit was given
  (``conf/spark-defaults.conf``, ``--jars``, ``--packages``): one of another
  Spark or Scala line, or ``tables.engine = "delta-spark"`` without
  delta-spark's classes, is one line and exit 2
  (:class:`bridge.spark.jars.JarsUnusable`); without delta-spark otherwise,
  Delta's SQL extension and catalog the settings name are left out (they
  would fail the session's first catalog use) and the tables go through
  delta-rs, said once;
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
        for k, v in {**_submitted_conf(config), **(extra or {})}.items():
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
        conf = {**_base_conf(config), **spark_conf(engine=config.tables.engine), **(extra or {})}
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


_SAID_SUBMITTED = False


def _submitted_conf(config: Config) -> dict[str, str]:
    """Under spark-submit, before the SparkContext: the jars spark-submit was
    given (its ``spark.jars``) against the running Spark and Scala, and
    whether delta-spark's classes are there (module doc). Returns the
    settings to change: Delta's SQL extension and catalog out when its
    classes are absent; the SQL warehouse under ``data_dir`` unless given."""
    global _SAID_SUBMITTED
    from pyspark import SparkConf, SparkContext

    from bridge.spark import jars

    SparkContext._ensure_initialized()  # the gateway to spark-submit's JVM (no SparkContext yet)
    jvm = SparkContext._jvm
    given = SparkConf()  # what spark-submit was given: the JVM's spark.* properties
    conf: dict[str, str] = {}
    if not given.contains("spark.sql.warehouse.dir"):
        # as a local session's: not ./spark-warehouse of the directory spark-submit runs in (Delta's catalog makes it)
        conf["spark.sql.warehouse.dir"] = str(config.data_path / "spark-warehouse")
    listed = [p.strip() for p in given.get("spark.jars", "").split(",") if p.strip()]
    bad = jars.listed_problems(listed, _spark_version(jvm), jvm.scala.util.Properties.versionNumberString())
    if bad:
        raise jars.JarsUnusable("spark.jars", "spark-submit", bad[0])
    if _loadable(jvm, DELTA_CLASS):
        return conf
    if config.tables.engine == "delta-spark":
        source = config.sources.get("tables.engine", "default")
        raise jars.JarsUnusable(
            "tables.engine", source,
            f"tables.engine = delta-spark (from {source}), but delta-spark is not on spark-submit's classpath "
            f"({len(listed)} jars in spark.jars, none of them delta-spark_*.jar): run {jars.FETCH}, then submit "
            f"from the checkout with {' '.join(jars.submit_options())} (docs/job.md)")
    ext_key, catalog_key = "spark.sql.extensions", "spark.sql.catalog.spark_catalog"
    extensions = [e.strip() for e in given.get(ext_key, "").split(",") if e.strip()]
    if jars.DELTA_SQL_CONF[ext_key] in extensions:
        conf[ext_key] = ",".join(e for e in extensions if e != jars.DELTA_SQL_CONF[ext_key])
    if given.get(catalog_key, "") == jars.DELTA_SQL_CONF[catalog_key]:
        conf[catalog_key] = "builtin"  # Spark's own session catalog
    if not _SAID_SUBMITTED:
        _SAID_SUBMITTED = True
        left_out = ext_key in conf or catalog_key in conf
        log.info("spark: delta-spark is not on spark-submit's classpath (%d jars in spark.jars, none of them "
                 "delta-spark_*.jar)%s; tables go through delta-rs (run %s, then submit from the checkout "
                 "with %s for delta-spark)", len(listed),
                 "; its SQL extension and catalog left out" if left_out else "", jars.FETCH,
                 " ".join(jars.submit_options()))
    return conf


def _spark_version(jvm) -> str:
    """The version of the JVM's Spark (spark-submit's; pyspark's if it cannot be read)."""
    try:
        return str(jvm.org.apache.spark.package.SPARK_VERSION())  # the package object's static forwarder
    except Exception:  # noqa: BLE001 - py4j errors; the Python side's version is the same Spark in a venv
        import pyspark

        return pyspark.__version__


def _loadable(jvm, name: str) -> bool:
    """Whether ``name`` loads as Spark loads a class (the context class loader:
    spark.jars and --jars included)."""
    try:
        jvm.org.apache.spark.util.Utils.classForName(name, False, False)
        return True
    except Exception:  # py4j raises Py4JJavaError (ClassNotFoundException)
        return False


def delta_spark_available(spark: "SparkSession") -> bool:
    """True when delta-spark's JVM classes are on the classpath (the JVM's
    own, or Spark's for ``spark.jars`` / ``--jars``: looked up as Spark
    looks up a class, through the context class loader)."""
    return _loadable(spark.sparkContext._jvm, DELTA_CLASS)  # noqa: SLF001 - py4j handle, no public API
