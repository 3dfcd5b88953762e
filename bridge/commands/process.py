"""``lakegate process [--once]``: the streaming job, in this process.

The same job as ``spark-submit jobs/process_packets.py``: capture log ->
parse -> Delta tables -> AMQP forwarding. ``--once`` processes everything
available and exits 0. Ctrl-C stops after the current batch.
"""

from __future__ import annotations

import argparse
import logging

from bridge.config import Config

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="process everything available, then exit 0")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.job.pipeline import shutdown, start_query
    from bridge.spark.session import build_session

    from pyspark.errors import StreamingQueryException

    spark = build_session(config, app_name="lakegate-job")
    try:
        query = start_query(spark, config, once=args.once)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            log.info("stopping: finishing the current batch")
            query.stop()
        except StreamingQueryException as exc:
            log.error("job failed: %s", str(exc).strip().splitlines()[0])
            return 1
        return 0
    finally:
        shutdown(spark)
