"""SQL over the Delta tables: views, time travel and ``mqtt_match``.

``register_views(spark, engine)`` registers, in a given SparkSession:

* ``messages``: every valid PUBLISH;
* ``retained``: the current retained messages (tombstones and messages past
  their ``expires_at`` left out); with ``as_of``, what a subscriber would have
  received then: ``expires_at`` is compared with the moment read (the
  timestamp asked for, or the commit time of the version asked for), not
  with the clock;
* ``retained_all``: the retained table as stored, tombstones included;
* ``quarantine``: frames that broke a rule;
* ``retained_versions``: the retained table's versions, newest first, with
  the capture offsets each covers (``stream``, ``capture_offsets``: capture
  partition -> first offset not in it; ``bridge.tables.coverage``), which
  the edge serves SUBSCRIBE from;
* the SQL function ``mqtt_match(filter, topic)``: whether a subscription to
  ``filter`` would receive a message on ``topic`` (``+``, ``#``, and no
  wildcard-first match of ``$`` topics); NULL for an ill-formed filter.

Notebooks and spark-submit users call the same function as ``lakegate sql``
does without delta-spark or with ``--as-of``; with delta-spark, ``lakegate
sql`` and the SQL endpoint have the same names in the session's catalog, the
tables as Delta tables (``bridge.sqlserve.catalog``, which keeps
``retained``'s filter the same as here).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from bridge.tables.engine import TableEngine
from schemas.ddl import to_arrow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["VERSIONS_ARROW", "VIEWS", "register_mqtt_match", "register_views", "version_rows", "views_in_query"]

#: view name -> the table it reads
VIEWS = {"messages": "messages", "retained": "retained", "retained_all": "retained", "quarantine": "quarantine",
         "retained_versions": "retained"}

_VERSIONS_DDL = ("version BIGINT, committed_at TIMESTAMP, operation STRING, stream STRING, "
                 "capture_offsets MAP<INT, BIGINT>, query STRING, batch BIGINT")


def version_rows(history: list[dict]) -> list[dict]:
    """The ``retained_versions`` rows (as dicts) from a Delta table's commit infos."""
    import datetime as dt

    from bridge.tables.coverage import coverage_entry

    rows = []
    for h in history:
        doc = coverage_entry(h.get("userMetadata")) or {}
        ts = h.get("timestamp")
        offsets = doc.get("capture_offsets")
        rows.append({"version": h.get("version"),
                     "committed_at": dt.datetime.fromtimestamp(ts / 1000, tz=dt.timezone.utc) if ts else None,
                     "operation": h.get("operation"), "stream": doc.get("stream"),
                     "capture_offsets": {int(k): int(n) for k, n in offsets.items()} if offsets else None,
                     "query": doc.get("query"), "batch": doc.get("batch")})
    return rows


#: the same rows' Arrow schema (the SQL endpoint's data source)
VERSIONS_ARROW = to_arrow(_VERSIONS_DDL)


def _versions(spark: "SparkSession", engine: TableEngine):
    """The ``retained_versions`` view's rows (from the table's commit infos)."""
    rows = [tuple(r.values()) for r in version_rows(engine.history("retained"))]
    return spark.createDataFrame(rows, _VERSIONS_DDL)


def _mqtt_match(flt, topic):  # runs on executors; module-level so it pickles by reference
    from bridge.topic_filter import matches

    return matches(flt, topic)


def register_mqtt_match(spark: "SparkSession") -> None:
    """Register the SQL function ``mqtt_match(filter STRING, topic STRING) -> BOOLEAN``."""
    from pyspark.sql.types import BooleanType

    if spark.catalog.functionExists("mqtt_match"):
        return  # registered before in this session (Spark would log a WARN line for each replacement)
    spark.udf.register("mqtt_match", _mqtt_match, BooleanType())


def views_in_query(sql: str) -> list[str]:
    """The lakegate views a query mentions (word match, case-insensitive)."""
    return [v for v in VIEWS if re.search(rf"(?i)(?<![\w.`]){re.escape(v)}(?![\w`])", sql)]


def register_views(spark: "SparkSession", engine: TableEngine, as_of: int | str | None = None,
                   views: Iterable[str] | None = None) -> list[str]:
    """Register the views (all, or those named) at the latest version or ``as_of``.

    Raises ``bridge.tables.engine.AsOfError`` (one line naming the oldest and
    newest versions) when ``as_of`` does not exist in a table.
    """
    engine.ensure()
    names = list(VIEWS) if views is None else list(views)
    done = []
    frames = {}
    for view in names:
        table = VIEWS[view]
        if view == "retained_versions":
            _versions(spark, engine).createOrReplaceTempView(view)
            done.append(view)
            continue
        if table not in frames:
            frames[table] = engine.dataframe(spark, table, as_of)
        df = frames[table]
        if view == "retained":
            from pyspark.sql import functions as F

            if as_of is None:
                now = F.current_timestamp()
            else:
                now = F.lit(engine.resolve_as_of(table, as_of).moment).cast("timestamp")
            df = df.where(~F.col("deleted") & (F.col("expires_at").isNull() | (F.col("expires_at") > now)))
            df = df.drop("deleted")
        df.createOrReplaceTempView(view)
        done.append(view)
    register_mqtt_match(spark)
    return done
