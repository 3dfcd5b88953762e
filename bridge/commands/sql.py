"""``lakegate sql "SELECT ..."``: Spark SQL over messages, retained, quarantine.

With delta-spark (at the endpoint, or in the local session) the query runs
against the tables as Delta tables in the catalog
(:mod:`bridge.sqlserve.catalog`): ``DESCRIBE HISTORY``, ``VERSION AS OF``,
``TIMESTAMP AS OF`` work, ``OPTIMIZE`` / ``VACUUM`` where
``sql.allow_maintenance`` allows them. Without it, or with ``--as-of``, the
names the query mentions are temporary views read through delta-rs
(:func:`bridge.tables.views.register_views`).

``--as-of VERSION|TIMESTAMP`` time-travels every view the query names;
``--format table|csv|json`` (json: one JSON array of row objects; binary
columns as base64, as Spark's to_json does; timestamps ISO 8601).
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import decimal
import json
import logging
import re
import sys
from typing import Any

from bridge.config import Config

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", help="a Spark SQL query over messages, retained, retained_all, retained_versions, "
                                 "quarantine (with delta-spark: DESCRIBE HISTORY, VERSION AS OF too)")
    p.add_argument("--as-of", metavar="VERSION|TIMESTAMP", help="read the tables at a Delta version or an ISO timestamp")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--limit", type=int, default=None, help="at most this many rows (default: all)")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "asDict"):
        return {k: _jsonable(x) for k, x in v.asDict(recursive=False).items()}
    return v


def _cell(v: Any) -> str:
    """A value as one table/csv cell: binary as 0x-hex (first 32 bytes), nested as JSON."""
    if v is None:
        return "NULL"
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        shown = "0x" + b[:32].hex()
        return shown + (f"...({len(b)} bytes)" if len(b) > 32 else "")
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, (list, tuple, dict)) or hasattr(v, "asDict"):
        return json.dumps(_jsonable(v), ensure_ascii=False)
    return str(v)


def print_rows(columns: list[str], rows: list[Any], fmt: str, out=None) -> None:
    out = sys.stdout if out is None else out  # the current stdout, not the one at import time
    if fmt == "json":
        json.dump([{c: _jsonable(r[i]) for i, c in enumerate(columns)} for r in rows], out, ensure_ascii=False)
        out.write("\n")
        return
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if x is None else _cell(x) for x in r])
        return
    cells = [[_cell(x) for x in r] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(line + "\n")
    out.write("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |\n")
    out.write(line + "\n")
    for row in cells:
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |\n")
    out.write(line + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _as_of(text: str | None) -> int | str | None:
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text.strip()


def _spark_message(exc: BaseException) -> str:
    """Spark's own message in one line (error class, text, SQLSTATE), without the JVM stack or query context."""
    from bridge.tables.engine import one_line

    msg = one_line(exc)
    msg = msg.split("; line ")[0] if "SQLSTATE" in msg else msg
    if "EXPECT_TABLE_NOT_VIEW" in msg and "`retained`" in msg:
        msg += " (retained is the current rows of the table retained_all: name retained_all)"
    return msg


#: ``DESCRIBE HISTORY retained``: ``retained`` is a view (the current rows), which has no history
_HISTORY_OF_RETAINED = re.compile(r"^(\s*DESC(?:RIBE)?\s+HISTORY\s+)`?retained`?(?=\s|;|$)", re.IGNORECASE)


def history_of_retained(query: str) -> str | None:
    """``DESCRIBE HISTORY retained ...`` as the history of the table behind
    the view: ``retained_all`` (the Delta table whose current rows ``retained``
    shows); None for any other query."""
    m = _HISTORY_OF_RETAINED.match(query)
    return None if m is None else m.group(1) + "retained_all" + query[m.end():]


def _catalog(spark, config: Config, query: str, remote: bool, as_of) -> tuple[object, bool]:
    """(the session to query, whether the catalog's Delta tables answer it):
    through an endpoint that serves them, as they are; in a local session with
    delta-spark, created here for the names the query mentions, in a new session
    of that Spark that the maintenance guard checks (the first one's state was
    made before the guard). ``--as-of`` keeps to the temporary views."""
    from bridge.sqlserve import catalog

    if remote:
        return spark, as_of is None and catalog.serves_delta(spark)
    from bridge.spark.session import delta_spark_available

    if not delta_spark_available(spark):
        return spark, False
    catalog.install_guard(spark, config)
    spark = spark.newSession()
    if spark.sparkContext.master.startswith("local"):
        for key, value in catalog.local_conf().items():
            spark.conf.set(key, value)
    if as_of is not None:
        return spark, False
    from bridge.sqlserve.match_sql import create_function_sql
    from bridge.tables.views import views_in_query

    catalog.install(spark, config, views_in_query(query))
    if "mqtt_match" in query.lower():
        spark.sql(create_function_sql(temporary=True))
    return spark, True


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.sqlserve.client import endpoint_gone, one_line_error, open_session
    from bridge.spark.delta import failure_line, make_engine
    from bridge.tables.deltars import DeltaRsEngine
    from bridge.tables.engine import AsOfError
    from bridge.tables.views import register_views, views_in_query

    if "log_level" not in config.sources:
        # A query tool's stderr stays quiet unless log_level was asked for.
        logging.getLogger("bridge").setLevel(logging.WARNING)
    as_of = _as_of(args.as_of)
    session = open_session(config, app_name="lakegate-sql")
    spark = session.spark
    remote = session.mode == "endpoint"
    try:
        from pyspark.errors import PySparkException

        # through the endpoint the engine only reads the tables' files and versions: delta-rs, which
        # reads any Delta table (a Connect session has no JVM in this process for delta-spark)
        engine = DeltaRsEngine(config.tables_dir) if remote else make_engine(config, spark)
        try:
            engine.ensure()
            spark, in_catalog = _catalog(spark, config, args.query, remote, as_of)
            if not in_catalog:
                # the endpoint's session: only the views the query names (each costs a round trip)
                wanted = views_in_query(args.query) if (as_of is not None or remote) else None
                register_views(spark, engine, as_of=as_of, views=wanted)
        except AsOfError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:  # an unreadable table: one line, exit 1 (details with log_level=DEBUG)
            log.debug("sql: reading the tables failed", exc_info=True)
            why = one_line_error(exc) if remote else failure_line(engine, exc)
            print(f"lakegate: sql: cannot read the tables under {config.tables_dir}: {why}", file=sys.stderr)
            return 1
        query = args.query
        if in_catalog and history_of_retained(query):
            query = history_of_retained(query)
            print("lakegate: sql: the history of retained_all (the Delta table whose current rows are retained)",
                  file=sys.stderr)
        try:
            df = spark.sql(query)
            if args.limit is not None:
                df = df.limit(args.limit)
            rows = df.collect()
            columns = df.columns
        except Exception as exc:
            if remote and endpoint_gone(exc):  # the endpoint went away in the middle: not the query's fault
                print(f"lakegate: sql: {session.where}: {one_line_error(exc)}", file=sys.stderr)
                return 1
            if not isinstance(exc, PySparkException):
                raise
            # Spark's own message (unknown table or column, syntax), without the JVM stack.
            raise UsageError(f"sql: {_spark_message(exc)}") from None
        print_rows(columns, rows, args.format)
        return 0
    finally:
        try:
            session.stop()
        except Exception:  # an endpoint that went away cannot release the session: nothing left to do
            log.debug("sql: stopping the session failed", exc_info=True)
