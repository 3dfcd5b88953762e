"""``lakegate process [--once]``: the streaming job, in this process.

The same job as ``spark-submit jobs/process_packets.py``: capture log ->
parse -> Delta tables -> AMQP forwarding. ``--once`` processes everything
available and exits 0. Ctrl-C (SIGINT) or SIGTERM stops after the current
batch: the batch finishes (tables, forwarding, checkpoint), no new one
starts, exit 0. Exit 1 when the query failed; 2 when Java is missing, or
``tables.engine = "delta-spark"`` is asked for without delta-spark's jars
(``.jvm/lib/delta``: ``scripts/bootstrap``), one line each.
"""

from __future__ import annotations

import argparse
import logging
import threading

from bridge.config import Config

log = logging.getLogger(__name__)

#: seconds a stopping job waits for the SQL endpoint's catalog objects still being created
CATALOG_JOIN_S = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="process everything available, then exit 0")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.job.pipeline import run_job, shutdown
    from bridge.metrics.wiring import metrics_server
    from bridge.spark.delta import require_jars
    from bridge.spark.session import build_session
    from bridge.sqlserve import endpoint

    require_jars(config)  # JarsUnusable (one line, exit 2): delta-spark asked for, its jars absent
    endpoint.check_port(config)  # ConfigError (one line, exit 2) when the SQL endpoint's port is taken
    endpoint.export_tables_dir(config)
    spark = build_session(config, app_name="lakegate-job",  # checks Java first (JavaMissing: exit 2)
                          extra=endpoint.spark_conf(config))
    endpoint.guard(spark, config)  # before any Connect client's first query (its rules are fixed then)
    metrics = None
    catalog: list[threading.Thread | None] = []
    ended = threading.Event()
    try:
        # the job alone: its metrics and /healthz (no edge); ConfigError when the port is taken
        metrics = metrics_server(config, None, lambda: any(q.isActive for q in spark.streams.active))
        if metrics is not None:
            metrics.start()
        # after the session: run_job replaces PySpark's SIGINT handler (which cancels jobs);
        # the endpoint's catalog objects once the query runs, so that they do not delay it
        return run_job(spark, config, once=args.once, on_started=lambda: catalog.append(
            endpoint.install_in_background(spark, config, going_away=ended.is_set)))
    finally:
        for thread in catalog:
            if thread is not None:
                thread.join(CATALOG_JOIN_S)  # not a session stopped under its feet (a short --once run)
        ended.set()  # past this, a failure of theirs is the session stopping
        if metrics is not None:
            metrics.stop()
        shutdown(spark)
