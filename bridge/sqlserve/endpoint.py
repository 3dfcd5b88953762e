"""The Spark Connect endpoint inside ``lakegate run`` and ``lakegate process``.

The pyspark wheel carries Spark Connect's server
(``spark-connect_2.13-*.jar``). :func:`spark_conf` turns it on as a Spark
plugin of the job's own session (one JVM: the endpoint reads the tables the
job writes, no second Spark to start), bound to ``sql.connect_host:
sql.connect_port``; :func:`check_port` says, before the JVM starts, when
that port is taken (ConfigError; Spark would fail the whole session with a BindException
stack). :func:`install` puts into the catalog every Connect session shares
what a client without lakegate's code needs: the SQL function
``mqtt_match`` (:mod:`bridge.sqlserve.match_sql`) and the tables:

* with delta-spark on the classpath (the jars ``scripts/bootstrap``
  resolves): ``messages``, ``retained_all``, ``quarantine`` as external
  Delta tables at the tables' paths, the views ``retained`` and
  ``retained_versions`` (:mod:`bridge.sqlserve.catalog`), so that ``DESCRIBE
  HISTORY``, ``VERSION AS OF`` and ``TIMESTAMP AS OF`` work, and
  ``OPTIMIZE`` / ``VACUUM`` where ``sql.allow_maintenance`` allows them
  (:func:`bridge.sqlserve.catalog.install_guard`);
* without: ``messages``, ``retained_all``, ``quarantine``,
  ``retained_versions`` as Python data sources that read the newest Delta
  version when a query is planned (:mod:`bridge.sqlserve.delta_source`),
  and the view ``retained``.

``lakegate sql`` and the notebooks (:mod:`bridge.sqlserve.client`) use the
Delta catalog as it is; without it (or with ``--as-of``) they register their
own temporary views over the same tables in their session, at the tables'
latest version (or ``as_of``).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import TYPE_CHECKING, Callable

from bridge.config import Config, ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PLUGIN", "check_port", "client_host", "export_tables_dir", "guard", "install", "install_in_background",
           "spark_conf", "url"]

log = logging.getLogger(__name__)

#: Spark's plugin that starts the Connect gRPC service with the SparkContext.
PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def client_host(config: Config) -> str:
    """The address a client on this host dials (a wildcard bind is reached on loopback)."""
    h = config.sql.connect_host
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(h, h)


def url(config: Config) -> str:
    """``sc://host:port`` a client on this host dials (with ``/;token=...`` when a token is set)."""
    base = f"sc://{client_host(config)}:{config.sql.connect_port}"
    return f"{base}/;token={config.sql.connect_token}" if config.sql.connect_token else base


def spark_conf(config: Config) -> dict[str, str]:
    """Spark properties that serve the endpoint; empty when ``sql.connect_port`` is 0."""
    if not config.sql.connect_port:
        return {}
    conf = {
        "spark.plugins": PLUGIN,
        "spark.connect.grpc.binding.address": config.sql.connect_host,
        "spark.connect.grpc.binding.port": str(config.sql.connect_port),
        "spark.connect.grpc.port.maxRetries": "0",  # the port asked for, or a clear failure: never another one
    }
    if config.sql.connect_token:
        conf["spark.connect.authenticate.token"] = config.sql.connect_token
    from bridge.spark.session import under_spark_submit

    if config.spark.master.startswith("local") and not under_spark_submit():
        from bridge.sqlserve.catalog import local_conf

        conf.update(local_conf())  # in every Connect session's SQL settings (they start from the SparkConf)
    return conf


def export_tables_dir(config: Config) -> None:
    """Before the JVM starts: name the tables' directory in this process's environment, which
    the JVM and its Python workers inherit; the endpoint's catalog tables read under it
    (bridge/sqlserve/delta_source.py: Spark does not pass a catalog table's OPTIONS on)."""
    import os

    from bridge.sqlserve.delta_source import TABLES_DIR_ENV

    if config.sql.connect_port:
        os.environ[TABLES_DIR_ENV] = str(config.tables_dir)


def check_port(config: Config) -> None:
    """Raise ConfigError (one line, exit 2) when the endpoint's port cannot be bound."""
    if not config.sql.connect_port:
        return
    host, port = config.sql.connect_host, config.sql.connect_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "is in use (another lakegate run or process?)" if exc.errno == errno.EADDRINUSE else \
                f"cannot be bound: {exc.strerror}"
            raise ConfigError("sql.connect_port", config.sources.get("sql.connect_port", "default"),
                              f"{host}:{port} {why}; set sql.connect_port to a free port, or 0 to serve no SQL "
                              "endpoint") from None


def install(spark: "SparkSession", config: Config) -> None:
    """Catalog objects every Connect session sees (module doc)."""
    if not config.sql.connect_port:
        return
    from bridge.spark.session import delta_spark_available
    from bridge.sqlserve import catalog
    from bridge.sqlserve.match_sql import create_function_sql

    spark.sql(create_function_sql())
    if delta_spark_available(spark):
        guard(spark, config)  # installed already by install_in_background; here for a direct call
        if not all(catalog.is_delta_table(config.tables_dir / d) for d in catalog.DELTA_TABLES.values()):
            # not made yet (the job makes them before its query starts; the class archive's
            # training run installs first): empty, as lakegate sql makes them, so that every
            # name is there; the job's writer finds them
            from bridge.tables.deltars import DeltaRsEngine

            DeltaRsEngine(config.tables_dir).ensure()
        made = catalog.install(spark, config)
        missing = [n for n in catalog.NAMES if n not in made]
        if missing:
            log.warning("sql: %s not in the catalog: no Delta table under %s yet", ", ".join(missing),
                        config.tables_dir)
        how = "Delta tables"
    else:
        _lakegate_tables(spark, config)
        how = "Python data sources over delta-rs: no delta-spark"
    log.info("sql: Spark Connect endpoint on %s (lakegate sql, notebooks, any Spark Connect client; %s)",
             url(config).split("/;")[0], how)


def guard(spark: "SparkSession", config: Config) -> None:
    """The maintenance guard (:func:`bridge.sqlserve.catalog.install_guard`) when the
    endpoint is on and delta-spark is there. It checks every Connect session whose
    first query comes after it (a session's rules are fixed then): the earlier the
    better; the job and the run call it as soon as their session is built (the
    endpoint answers from then), :func:`install_in_background` again (it is
    idempotent), before the catalog objects. A failure is one ERROR line (OPTIMIZE and VACUUM through SQL are then
    not refused)."""
    if not config.sql.connect_port:
        return
    from bridge.spark.session import delta_spark_available
    from bridge.sqlserve import catalog
    from bridge.tables.engine import one_line

    try:
        if delta_spark_available(spark):
            catalog.install_guard(spark, config)
    except Exception as exc:  # noqa: BLE001 - the endpoint serves on; said once
        log.error("sql: the check that refuses OPTIMIZE and VACUUM through SQL (sql.allow_maintenance) could not "
                  "be installed: %s", one_line(exc)[:300])


def install_in_background(spark: "SparkSession", config: Config,
                          going_away: Callable[[], bool] = lambda: False) -> threading.Thread | None:
    """:func:`install` on a thread (started; None when there is no endpoint):
    for a job that starts its query first, so that the catalog objects do
    not delay it (creating them took 2 s of a 9-10 s start). A failure is
    one ERROR line, unless ``going_away()`` says the session is stopping,
    which makes it a DEBUG line."""
    if not config.sql.connect_port:
        return None
    guard(spark, config)  # at once (milliseconds): the Connect sessions made from now on are checked

    def create() -> None:
        from bridge.tables.engine import one_line

        try:
            install(spark, config)
        except Exception as exc:  # noqa: BLE001 - the job goes on without them; said once
            if going_away():
                log.debug("sql: catalog objects not created (the session is going away): %s", exc)
                return
            log.error("sql: the endpoint's catalog objects (mqtt_match, the tables, the view retained) could not "
                      "be created: %s; lakegate sql and the notebooks still work (they make their own views)",
                      one_line(exc)[:300])

    thread = threading.Thread(target=create, name="lakegate-sql-catalog", daemon=True)
    thread.start()
    return thread


def _retained_view() -> str:
    from bridge.sqlserve.catalog import RETAINED_CURRENT

    return f"SELECT * EXCEPT (deleted) FROM default.retained_all WHERE {RETAINED_CURRENT}"


def _lakegate_tables(spark: "SparkSession", config: Config) -> None:
    """Catalog tables ``USING lakegate_table`` (bridge/sqlserve/delta_source.py) and the view
    ``retained``: in the catalog every Connect session shares, read at the newest version
    when each query is planned."""
    from bridge.sqlserve.delta_source import FIXED

    for name in FIXED:
        spark.sql(f"DROP TABLE IF EXISTS default.{name}")
        spark.sql(f"CREATE TABLE default.{name} USING lakegate_{name}")
    spark.sql(f"CREATE OR REPLACE VIEW default.retained AS {_retained_view()}")
