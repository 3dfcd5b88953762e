"""The tables as Delta tables in a session's catalog, when delta-spark is on the classpath.

Names, the same as without delta-spark, and what each one is here:

* ``messages``, ``quarantine``: external Delta tables at
  ``<tables_dir>/messages``, ``<tables_dir>/quarantine``;
* ``retained_all``: external Delta table at ``<tables_dir>/retained``, the
  retained table as stored, tombstones included;
* ``retained``: view over ``retained_all``, the current retained messages
  (no tombstone, nothing past ``expires_at``), without ``deleted``;
* ``retained_versions``: view over the retained table's commit files, its
  versions with the capture offsets each covers;
* ``mqtt_match``: SQL function (:mod:`bridge.sqlserve.match_sql`).

So ``DESCRIBE HISTORY``, ``VERSION AS OF``, ``TIMESTAMP AS OF``,
``DESCRIBE DETAIL`` work on ``messages``, ``quarantine`` and
``retained_all``. ``retained`` stays what it has always been, the current
rows (a view: Spark has no history or time travel for a view); the history
of the retained table is ``DESCRIBE HISTORY retained_all``.

Registering an existing Delta table (``CREATE TABLE IF NOT EXISTS ... USING
delta LOCATION``, no schema) commits nothing to it: Delta reads the schema
from the table's log. A table that does not exist yet is not registered
(its writer creates it). Each query reads the table's newest version (Delta
brings its snapshot up to date when a query is planned), whoever wrote it:
the delta-rs engine of ``lakegate run`` included.

:func:`install_guard`: ``OPTIMIZE``, ``REORG TABLE`` and ``VACUUM`` through
SQL only where ``sql.allow_maintenance`` says so (``VACUUM ... DRY RUN``
always: it deletes nothing), and never a ``VACUUM ... RETAIN`` below
``tables.vacuum_retention_hours``. Spark has no setting for that, so it is a
check rule (a Spark session extension point) compiled at run time with the
Java compiler Spark ships for its code generation (Janino), put into the
extensions every new session of this Spark gets: every Spark Connect
session, whatever the client. A client cannot turn it off (it is no SQL
setting); a session that ran a query before it (its rules were fixed then)
is not checked, nor is the session it was installed from, nor lakegate's
own table engine (its OPTIMIZE and VACUUM: ``lakegate compact``, the job's
maintenance), whose session carries this process's token
(:data:`MAINTENANCE_KEY`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from typing import TYPE_CHECKING, Iterable

from bridge.config import Config
from bridge.spark.deltaspark import MAINTENANCE_KEY, MAINTENANCE_TOKEN_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DELTA_TABLES", "NAMES", "RETAINED_CURRENT", "install", "install_guard", "is_delta_table", "local_conf",
           "serves_delta", "sql_string", "versions_view_sql"]

log = logging.getLogger(__name__)

#: catalog table -> its directory under ``tables_dir``
DELTA_TABLES = {"messages": "messages", "retained_all": "retained", "quarantine": "quarantine"}

#: every name :func:`install` can create -> the catalog tables it needs
NAMES = {"messages": ("messages",), "retained_all": ("retained_all",), "quarantine": ("quarantine",),
         "retained": ("retained_all",), "retained_versions": ()}

#: the rows of ``retained_all`` that ``retained`` shows (as ``bridge.tables.views`` filters them)
RETAINED_CURRENT = "NOT deleted AND (expires_at IS NULL OR expires_at > current_timestamp())"

_RETAINED_COMMENT = ("the current retained messages: retained_all's rows without tombstones or expired ones. "
                     "A view: DESCRIBE HISTORY and VERSION AS OF go to retained_all")


def local_conf() -> dict[str, str]:
    """Spark SQL settings for delta-spark in a local session: a table's state
    rebuilt, at each new version, in as many Spark partitions as there are
    cores, not in Delta's default 50 (a cluster's). The endpoint's tables get a
    version per batch, so nearly every query rebuilds one: measured on 2 cores,
    a count over a small table after a commit took 8.6 s with 50, 1.2 s with 2."""
    return {"spark.databricks.delta.snapshotPartitions": str(max(1, os.cpu_count() or 1))}


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def versions_view_sql(retained_dir: str) -> str:
    """The ``retained_versions`` view's query: the retained table's commit files
    (``_delta_log/<version>.json``) read as text, their ``commitInfo`` line
    parsed (version, commit time, operation) with the ``lakegate`` entry of its
    ``userMetadata`` (``bridge.tables.coverage``). The same columns as
    ``bridge.tables.views.version_rows``; what Delta has cleaned out of the log
    (after ``delta.logRetentionDuration``) is gone here as from the history.
    The folder, not a glob (Spark logs a stack for a glob it looks up as a
    file); the other files of the log are left out by name. Spark warns, each
    query, that a folder named ``_...`` is one it ignores (and reads it all
    the same): :func:`_quiet` silences that logger."""
    log_dir = (retained_dir.rstrip("/") + "/_delta_log").replace("`", "``")
    return (
        "SELECT version, committed_at, operation, m.lakegate.stream AS stream, "
        "transform_keys(m.lakegate.capture_offsets, (k, v) -> CAST(k AS INT)) AS capture_offsets, "
        "m.lakegate.query AS query, m.lakegate.batch AS batch FROM ("
        "SELECT CAST(regexp_extract(file, '^([0-9]+)[.]json$', 1) AS BIGINT) AS version, "
        "timestamp_millis(c.commitInfo.timestamp) AS committed_at, c.commitInfo.operation AS operation, "
        "from_json(c.commitInfo.userMetadata, 'lakegate STRUCT<stream: STRING, capture_offsets: MAP<STRING, BIGINT>, "
        "query: STRING, batch: BIGINT>') AS m FROM ("
        "SELECT _metadata.file_name AS file, from_json(value, 'commitInfo STRUCT<timestamp: BIGINT, "
        f"operation: STRING, userMetadata: STRING>') AS c FROM text.`{log_dir}` "
        "WHERE _metadata.file_name RLIKE '^[0-9]+[.]json$') WHERE c.commitInfo IS NOT NULL)")


#: Spark's logger of "All paths were ignored" (a path whose name starts with ``_``), which
#: every query of ``retained_versions`` would log twice (a WARN with the path)
_HIDDEN_PATH_LOGGER = "org.apache.spark.sql.execution.datasources.DataSource"


def _quiet(spark: "SparkSession") -> None:
    """ERROR and above only, for :data:`_HIDDEN_PATH_LOGGER` (log4j2, as conf/log4j2.properties sets others)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j handle, no public API
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(_HIDDEN_PATH_LOGGER, log4j.Level.ERROR)


def is_delta_table(path) -> bool:
    """Whether ``path`` holds a Delta table (a ``_delta_log`` with a commit)."""
    return (path / "_delta_log").is_dir() and any((path / "_delta_log").glob("*.json"))


#: (a Spark's catalog, table name) -> where :func:`install` registered it in this process
_LOCATIONS: dict[tuple[tuple[int, int], str], str] = {}


def install(spark: "SparkSession", config: Config, names: Iterable[str] | None = None) -> list[str]:
    """Create in ``spark``'s catalog (``default``) the Delta tables and views
    ``names`` need (all by default), those whose tables exist; the names made."""
    wanted = list(NAMES) if names is None else [n for n in names if n in NAMES]
    tables = {t for n in wanted for t in NAMES[n]}
    made: list[str] = []
    # the catalog every session of this Spark shares
    catalog_id = _jvm_key(spark, spark._jsparkSession.sharedState())  # noqa: SLF001 - py4j handle
    for name in DELTA_TABLES:
        if name not in tables:
            continue
        path = config.tables_dir / DELTA_TABLES[name]
        if not is_delta_table(path):
            log.info("sql: no Delta table at %s yet: %s not in the catalog", path, name)
            continue
        if _LOCATIONS.get((catalog_id, name), str(path)) != str(path):
            # registered here before for other tables (another data_dir in this process): an
            # external table, so dropping it forgets the name and deletes nothing
            spark.sql(f"DROP TABLE IF EXISTS default.{name}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS default.{name} USING delta LOCATION {sql_string(str(path))}")
        _LOCATIONS[(catalog_id, name)] = str(path)
        made.append(name)
    if "retained" in wanted and "retained_all" in made:
        spark.sql(f"CREATE OR REPLACE VIEW default.retained COMMENT {sql_string(_RETAINED_COMMENT)} AS "
                  f"SELECT * EXCEPT (deleted) FROM default.retained_all WHERE {RETAINED_CURRENT}")
        made.append("retained")
    if "retained_versions" in wanted and is_delta_table(config.tables_dir / "retained"):
        _quiet(spark)
        spark.sql("CREATE OR REPLACE VIEW default.retained_versions AS "
                  + versions_view_sql(str(config.tables_dir / "retained")))
        made.append("retained_versions")
    return made


def serves_delta(spark: "SparkSession") -> bool:
    """True when ``spark``'s catalog (an endpoint's, seen through Spark Connect)
    holds the tables as external Delta tables (:func:`install`), not the Python
    data sources of an endpoint without delta-spark (managed tables), or nothing
    yet (the endpoint creates them a moment after it starts)."""
    kinds = {t.name: t.tableType for t in spark.catalog.listTables("default")}
    return all(kinds.get(t) == "EXTERNAL" for t in DELTA_TABLES) and kinds.get("retained") == "VIEW"


# -- the guard: OPTIMIZE, REORG and VACUUM through SQL ------------------------

#: Delta's plan nodes, by class name -> the statement a refusal names
_REWRITES = {"org.apache.spark.sql.delta.commands.OptimizeTableCommand": "OPTIMIZE",
             "org.apache.spark.sql.delta.commands.DeltaReorgTableCommand": "REORG TABLE",
             "org.apache.spark.sql.delta.commands.DeltaReorgTable": "REORG TABLE"}
_VACUUM = "io.delta.tables.execution.VacuumTableCommand"

#: Java as Janino takes it (no generics, no lambdas). The guard is a
#: SparkSession => (LogicalPlan => Unit) (``SparkSessionExtensions.injectCheckRule``);
#: its settings are fields that :func:`install_guard` sets, read by every check.
_GUARD_JAVA = """
public class LakegateSqlGuard%(n)d extends scala.runtime.AbstractFunction1 {
  public volatile boolean allow = false;
  public volatile double minHours = 0;
  public volatile String off = "";
  public volatile String tooShort = "";
  public volatile String token = "";
  public Object apply(Object session) { return new LakegateSqlCheck%(n)d(this, session); }
  public void configure(boolean allow, double minHours, String off, String tooShort, String token) {
    this.allow = allow; this.minHours = minHours; this.off = off; this.tooShort = tooShort; this.token = token;
  }
}

class LakegateSqlCheck%(n)d extends scala.runtime.AbstractFunction1 {
  private final LakegateSqlGuard%(n)d guard;
  private final Object session;
  LakegateSqlCheck%(n)d(LakegateSqlGuard%(n)d guard, Object session) { this.guard = guard; this.session = session; }

  private boolean exempt() {
    if (guard.token.length() == 0) return false;
    try {
      Object conf = session.getClass().getMethod("conf", new Class[0]).invoke(session, new Object[0]);
      Object value = conf.getClass().getMethod("get", new Class[] {String.class, String.class})
          .invoke(conf, new Object[] {"%(key)s", ""});
      return guard.token.equals(value);
    } catch (Exception e) {
      return false;
    }
  }

  public Object apply(Object plan) {
    String name = plan.getClass().getName();
    String what = %(rewrites)s;
    boolean vacuum = name.equals(%(vacuum)s);
    if (vacuum) what = "VACUUM";
    if (what == null || exempt()) return scala.runtime.BoxedUnit.UNIT;
    if (vacuum && Boolean.TRUE.equals(call(plan, "dryRun"))) return scala.runtime.BoxedUnit.UNIT;
    if (!guard.allow) throw new UnsupportedOperationException(what + guard.off);
    if (vacuum) {
      double hours = hours(call(plan, "horizonHours"));
      if (hours >= 0 && hours < guard.minHours)
        throw new UnsupportedOperationException("VACUUM ... RETAIN " + hours + " HOURS" + guard.tooShort);
    }
    return scala.runtime.BoxedUnit.UNIT;
  }

  private static Object call(Object target, String method) {
    try {
      return target.getClass().getMethod(method, new Class[0]).invoke(target, new Object[0]);
    } catch (Exception e) {
      return null;
    }
  }

  private static double hours(Object option) {
    if (option instanceof scala.Option && !((scala.Option) option).isEmpty()) {
      Object value = ((scala.Option) option).get();
      if (value instanceof Number) return ((Number) value).doubleValue();
    }
    return -1;
  }
}
"""


def _guard_source(n: int) -> str:
    """The guard's Java, its classes numbered ``n``: py4j finds a method by its class's
    name, so each guard compiled in one JVM (one per Spark started there) has its own."""
    rewrites = "null"
    for cls, what in reversed(_REWRITES.items()):
        rewrites = f"name.equals({json.dumps(cls)}) ? {json.dumps(what)} : ({rewrites})"
    return _GUARD_JAVA % {"rewrites": rewrites, "vacuum": json.dumps(_VACUUM), "n": n, "key": MAINTENANCE_KEY}


def _messages(config: Config) -> tuple[str, str]:
    where = ("sql.allow_maintenance = false in the configuration of the lakegate process serving this SQL "
             "(lakegate compact runs OPTIMIZE and VACUUM)")
    return (f" through SQL is off: {where}",
            f" is below tables.vacuum_retention_hours = {config.tables.vacuum_retention_hours} "
            "(readers and time travel may still need those files)")


#: a Spark's session extensions (:func:`_jvm_key`) -> the guard injected into them
_GUARDS: dict[tuple[int, int], object] = {}


def _jvm_key(spark: "SparkSession", obj) -> tuple[int, int]:
    """A JVM object's identity: its JVM's (the py4j gateway of this process) and its own in it."""
    gateway = spark.sparkContext._gateway  # noqa: SLF001 - py4j handles, no public API
    return id(gateway), gateway.jvm.java.lang.System.identityHashCode(obj)


def install_guard(spark: "SparkSession", config: Config) -> None:
    """Put the guard (module doc) into the extensions of ``spark``'s new
    sessions, once per Spark; a later call sets its settings from ``config``.
    ``spark`` itself, whose session state exists already, is not checked:
    use ``spark.newSession()`` for queries."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j handles, no public API
    extensions = spark._jsparkSession.extensions()  # noqa: SLF001 - shared by spark.newSession()'s sessions
    key = _jvm_key(spark, extensions)
    guard = _GUARDS.get(key)
    if guard is None:
        n = len(_GUARDS)
        compiler = jvm.org.codehaus.janino.SimpleCompiler()
        compiler.cook(_guard_source(n))
        guard = compiler.getClassLoader().loadClass(f"LakegateSqlGuard{n}").newInstance()
        extensions.injectCheckRule(guard)
        _GUARDS[key] = guard
    off, too_short = _messages(config)
    system = jvm.java.lang.System
    token = system.getProperty(MAINTENANCE_TOKEN_PROPERTY)
    if not token:
        token = secrets.token_hex(16)
        system.setProperty(MAINTENANCE_TOKEN_PROPERTY, token)
    guard.configure(bool(config.sql.allow_maintenance), float(config.tables.vacuum_retention_hours), off, too_short,
                    token)
