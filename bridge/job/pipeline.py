"""Build and start the streaming query: capture log -> parse -> foreachBatch.

``start_query(spark, config, once=...)`` is the one library function behind
``jobs/process_packets.py`` (spark-submit), ``lakegate process`` and
``lakegate run``. It takes the session and the configuration as parameters
and never reaches for a global session. The checkpoint lives under
``data_dir/checkpoints/<job.query_name>``.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config import Config

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from bridge.job.progress import ProgressListener

__all__ = ["checkpoint_path", "frame_rows", "shutdown", "start_query"]

log = logging.getLogger(__name__)

#: Listeners this module added, per SparkSession (removed by ``shutdown``).
_listeners: list[tuple["SparkSession", "ProgressListener"]] = []


def checkpoint_path(config: Config) -> Path:
    return config.checkpoint_dir / config.job.query_name


def frame_rows(records: "DataFrame") -> "DataFrame":
    """Capture records (Kafka-shaped) -> frame rows (``schemas.tables.FRAME_ROW_DDL``)."""
    from pyspark.sql import functions as F

    from bridge.job.context import with_context
    from bridge.parse.udf import frames_udf
    from schemas.ddl import field_names
    from schemas.frames import PARSED_FRAME_DDL
    from schemas.tables import PARSED_RENAMES

    ctx = with_context(records)
    parsed = ctx.withColumn("_p", frames_udf()(F.col("frame"), F.col("protocol_level"), F.col("alias_topic"), F.col("origin")))
    cols = [F.col(c) for c in ctx.columns]
    cols += [F.col(f"_p.{n}").alias(PARSED_RENAMES.get(n, n)) for n in field_names(PARSED_FRAME_DDL)]
    return parsed.select(*cols)


def start_query(spark: "SparkSession", config: Config, *, once: bool = False,
                listener: "ProgressListener | None" = None) -> "StreamingQuery":
    """Start the pipeline. ``once``: process everything available, then stop
    (``trigger(availableNow=True)``); otherwise a micro-batch every
    ``job.trigger_interval_s``. Forwarding is on when ``amqp.url`` is set."""
    from bridge.amqp.sink import forward_batch
    from bridge.capture import LogReader
    from bridge.job.batch import BatchStep
    from bridge.job.progress import ProgressListener
    from bridge.spark.source import register
    from bridge.tables.engine import make_engine

    register(spark)
    config.capture_dir.mkdir(parents=True, exist_ok=True)
    records = (
        spark.readStream.format("lakegate")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", config.job.max_records_per_trigger)
        .load(str(config.capture_dir))
    )
    engine = make_engine(config, spark)
    engine.ensure()
    checkpoint = checkpoint_path(config)
    reader = LogReader(config.capture_dir)
    if listener is None:
        listener = ProgressListener(config.data_path, log_end=lambda: {
            str(p): n for p, n in enumerate(reader.durable_offsets())})
        spark.streams.addListener(listener)
        _listeners.append((spark, listener))
    forward = functools.partial(forward_batch, config=config) if config.amqp.url else None
    step = BatchStep(config, engine, checkpoint, forward=forward, on_stats=listener.record)
    writer = (
        frame_rows(records).writeStream.foreachBatch(step)
        .option("checkpointLocation", str(checkpoint))
        .queryName(config.job.query_name)
    )
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.job.trigger_interval_s} seconds")
    query = writer.start()
    listener.queries.append(query)  # shutdown() reports what the bus has not delivered yet
    log.info("job started: query=%s checkpoint=%s tables=%s engine=%s forwarding=%s",
             config.job.query_name, checkpoint, config.tables_dir, engine.name, "on" if forward else "off")
    return query


def shutdown(spark: "SparkSession") -> None:
    """Stop active queries, remove lakegate's listeners, stop the session.

    Removing the Python listener first keeps the JVM from calling back into a
    Python process that is going away.
    """
    for q in spark.streams.active:
        q.stop()
    for s, listener in _listeners:
        if s is spark:
            for q in listener.queries:
                listener.catch_up(q)
    for s, listener in list(_listeners):
        if s is spark:
            try:
                spark.streams.removeListener(listener)
            except Exception:  # the session may already be stopping
                pass
            _listeners.remove((s, listener))
    spark.stop()
