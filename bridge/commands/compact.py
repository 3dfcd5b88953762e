"""``lakegate compact``: expire retained messages, compact small files, vacuum.

The engine is ``tables.engine``'s: ``delta-rs`` needs no JVM (its own
``optimize.compact`` and ``vacuum``); ``delta-spark`` builds a SparkSession
(as ``lakegate sql`` does) and runs Delta's own OPTIMIZE and VACUUM
(``DeltaTable.optimize().executeCompaction()``, ``DeltaTable.vacuum``), and
so does ``auto`` under spark-submit, where the classpath that decides it is
already given (run locally, ``auto`` is delta-rs, the embedded engine of one
machine: ``bridge.spark.delta``). On delta-spark too the retention is
``tables.vacuum_retention_hours``, whose floor is lakegate's (1 hour,
``bridge.tables.maintenance.MIN_VACUUM_HOURS``), not Delta's 7 days: the
engine writes through a session of its own with Delta's check off
(``bridge.spark.deltaspark``). SQL through the endpoint runs OPTIMIZE and
VACUUM only with ``sql.allow_maintenance`` (``bridge.sqlserve.catalog``);
this command needs no such switch.
Errors are one line: bad configuration exit code 2, a failed table
operation exit code 1; the report goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from bridge.config import Config

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _needs_spark(config: Config) -> bool:
    from bridge.spark.session import under_spark_submit

    return config.tables.engine == "delta-spark" or (config.tables.engine == "auto" and under_spark_submit())


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.spark.delta import failure_line, make_engine
    from bridge.tables.maintenance import MIN_VACUUM_HOURS, run_maintenance

    if "log_level" not in config.sources:
        # The report is the answer; stderr stays quiet unless log_level was asked for.
        logging.getLogger("bridge").setLevel(logging.WARNING)
    hours = config.tables.vacuum_retention_hours
    if hours < MIN_VACUUM_HOURS:  # before starting anything
        raise UsageError(f"tables.vacuum_retention_hours must be at least {MIN_VACUUM_HOURS} (got {hours})")
    spark = None
    try:
        if _needs_spark(config):
            from bridge.spark.session import build_session

            spark = build_session(config, app_name="lakegate-compact")
        engine = make_engine(config, spark)
        try:
            report = run_maintenance(engine, hours)
        except Exception as exc:  # a table operation failed: one line, exit 1 (details with log_level=DEBUG)
            log.debug("compact failed", exc_info=True)
            print(f"lakegate: compact: {failure_line(engine, exc)}", file=sys.stderr)
            return 1
    finally:
        if spark is not None:
            spark.stop()
    if args.json:
        print(json.dumps({"engine": engine.name, "expired": report.expired, "compacted": report.compacted,
                          "vacuumed": report.vacuumed, "seconds": round(report.seconds, 3)}))
    else:
        print(report.line())
    return 0
