"""Build and start the streaming query: capture log -> parse -> foreachBatch.

``start_query(spark, config, once=...)`` is the one library function behind
``jobs/process_packets.py`` (spark-submit), ``lakegate process`` and
``lakegate run``. It takes the session and the configuration as parameters
and never reaches for a global session. The checkpoint lives under
``data_dir/checkpoints/<job.query_name>``.

The progress listener (``bridge.job.progress``) is one per session and
checkpoint: the first ``start_query`` registers it, later ones (``lakegate
run`` restarting a failed query) reuse it, ``release``/``shutdown`` remove it.

``run_job`` is the loop of ``lakegate process`` and the spark-submit job:
SIGINT/SIGTERM let the running batch finish, then the query stops (under
spark-submit the JVM gets them and calls back: ``bridge.spark.jvm``).
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bridge.config import Config, ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from bridge.job.progress import ProgressListener

__all__ = ["checkpoint_path", "forget", "frame_rows", "job_forwards", "progress_listener", "release", "run_job", "shutdown",
           "start_query", "stop_after_batch"]

log = logging.getLogger(__name__)

#: How long a stop waits for the running batch to finish before stopping the query anyway.
FINISH_BATCH_S = 60.0

#: Listeners this module added, per SparkSession (removed by ``release``/``shutdown``).
_listeners: list[tuple["SparkSession", "ProgressListener"]] = []
_listeners_lock = threading.Lock()


def checkpoint_path(config: Config) -> Path:
    return config.checkpoint_dir / config.job.query_name


def frame_rows(records: "DataFrame") -> "DataFrame":
    """Capture records (Kafka-shaped) -> frame rows (``schemas.tables.FRAME_ROW_DDL``):
    Spark expressions for the context columns, the pandas UDF for the frames
    (the batch step's plan for a batch the executors parse)."""
    from pyspark.sql import functions as F

    from bridge.job.context import header, with_context
    from bridge.parse.udf import frames_udf
    from schemas.ddl import field_names
    from schemas.frames import PARSED_FRAME_DDL
    from schemas.tables import PARSED_RENAMES

    # a run of a subscriber's 4-byte PUBACKs captured as one record (header
    # ack_refs): acknowledgements the edge checked, with no row in any table;
    # a cluster edge's own records (header edge): not frames
    ctx = with_context(records.where(header("ack_refs").isNull() & header("edge").isNull()))
    parsed = ctx.withColumn("_p", frames_udf()(F.col("frame"), F.col("protocol_level"), F.col("alias_topic"), F.col("origin")))
    cols = [F.col(c) for c in ctx.columns]
    cols += [F.col(f"_p.{n}").alias(PARSED_RENAMES.get(n, n)) for n in field_names(PARSED_FRAME_DDL)]
    return parsed.select(*cols)


def progress_listener(spark: "SparkSession", config: Config) -> "ProgressListener":
    """The progress listener of ``config``'s checkpoint on ``spark``: registered
    on first use, the same object afterwards (one listener however often the
    query restarts)."""
    from bridge.capture import open_reader
    from bridge.job.progress import ProgressListener

    checkpoint = checkpoint_path(config)
    with _listeners_lock:
        for s, listener in _listeners:
            if s is spark and listener.checkpoint == checkpoint:
                return listener
        readers: list = []  # opened on first use: the local log's durable ends, or the topic's high watermarks

        def log_end() -> dict[str, int]:  # raising: the progress line says lag -1
            if not readers:
                readers.append(open_reader(config))
            return {str(p): n for p, n in enumerate(readers[0].durable_offsets())}

        listener = ProgressListener(config.data_path, checkpoint=checkpoint, log_end=log_end)
        spark.streams.addListener(listener)
        _listeners.append((spark, listener))
        return listener


def job_forwards(config: Config, *, live_elsewhere: bool = False) -> bool:
    """Whether the job forwards to AMQP: ``amqp.url`` set, ``amqp.forward_by``
    not ``"edge"``, and no live forwarder next to it (``live_elsewhere``:
    ``lakegate run`` forwarding live, ``bridge.amqp.live.forwards_live``)."""
    return bool(config.amqp.url) and config.amqp.forward_by != "edge" and not live_elsewhere


def start_query(spark: "SparkSession", config: Config, *, once: bool = False,
                listener: "ProgressListener | None" = None,
                stop: threading.Event | None = None, forwarding: bool | None = None) -> "StreamingQuery":
    """Start the pipeline. ``once``: process everything available, then stop
    (``trigger(availableNow=True)``); otherwise a micro-batch every
    ``job.trigger_interval_s``. The job forwards when ``forwarding`` says
    so (default: :func:`job_forwards`, i.e. ``amqp.url`` set and
    ``amqp.forward_by`` not ``"edge"``).

    ``listener``: a listener the caller registered; default: this checkpoint's
    (``progress_listener``). ``stop``: once set, no new batch starts (the
    running one finishes; see ``bridge.job.batch``)."""
    from bridge.amqp.sink import forward_batch
    from bridge.job.batch import BatchStep
    from bridge.spark.source import parse_options, register
    from bridge.spark.delta import make_engine
    from schemas.capture import CAPTURE_RECORD_DDL

    if config.capture.backend == "kafka":
        from bridge.spark.kafka_source import read_capture_stream

        # Spark's own Kafka source, rows of the same schema (bridge.spark.kafka_source)
        records = read_capture_stream(spark, config)
    else:
        register(spark)
        config.capture_dir.mkdir(parents=True, exist_ok=True)
        options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": str(config.job.max_records_per_trigger)}
        # The schema given: without it, load() starts a Python worker to ask the
        # source for it (1.5 s of `lakegate run`'s start-up, measured). That
        # worker also checked the options and the capture log; the driver checks
        # them here instead (SourceOptionError, e.g. no capture log yet).
        parse_options({**options, "path": str(config.capture_dir)})
        records = (
            spark.readStream.format("lakegate").schema(CAPTURE_RECORD_DDL)
            .options(**options)
            .load(str(config.capture_dir))
        )
    engine = make_engine(config, spark)
    engine.ensure()
    checkpoint = checkpoint_path(config)
    if listener is None:
        listener = progress_listener(spark, config)
    if forwarding is None:
        forwarding = job_forwards(config)
    forward = functools.partial(forward_batch, config=config) if forwarding and config.amqp.url else None
    step = BatchStep(config, engine, checkpoint, forward=forward, on_stats=listener.record, stop=stop)
    # the step gets the capture records and parses each batch where its size
    # says (on the driver, or by the pandas UDF on executors: bridge.job.batch)
    writer = (
        records.writeStream.foreachBatch(step)
        .option("checkpointLocation", str(checkpoint))
        .queryName(config.job.query_name)
    )
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.job.trigger_interval_s} seconds")
    query = writer.start()
    listener.query = query  # release() reports what the bus has not delivered yet
    log.info("job started: query=%s checkpoint=%s tables=%s engine=%s forwarding=%s",
             config.job.query_name, checkpoint, config.tables_dir, engine.name,
             "on" if forward else ("live, by the edge's process" if config.amqp.url else "off"))
    return query


def stop_after_batch(query: "StreamingQuery", timeout: float = FINISH_BATCH_S) -> None:
    """Let the batch the query is running finish (up to ``timeout``), then stop it.

    Use with the ``stop`` event of ``start_query`` set: a batch that starts
    after this looked then refuses to run, so nothing is left half done."""
    from pyspark.errors import StreamingQueryException

    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False):
            break
        try:
            query.awaitTermination(0.2)
        except StreamingQueryException:
            break  # it ended with an error (a batch that refused to start: StopRequested); see query.exception()
    if query.isActive:
        if time.monotonic() >= deadline:
            log.warning("the running batch did not finish within %.0fs; stopping the query anyway", timeout)
        query.stop()


def run_job(spark: "SparkSession", config: Config, *, once: bool = False,
            on_started: Callable[[], object] | None = None) -> int:
    """Run the job until it ends (``once``) or SIGINT/SIGTERM: exit code 0, or 1
    when the query failed. ``on_started``: called once the query has started
    (``lakegate process`` creates the SQL endpoint's catalog objects then).

    PySpark's own SIGINT handler cancels every Spark job, which would break
    the running batch off in the middle; this replaces it (call after the
    session is built, from the main thread) so that the batch finishes first.
    """
    from pyspark.errors import PySparkException, StreamingQueryException

    from bridge.job.batch import is_stop_requested
    from bridge.job.failures import root_cause
    from bridge.spark.source import SourceOptionError
    from bridge.spark.jvm import on_jvm_signals
    from bridge.spark.session import under_spark_submit

    stop = threading.Event()

    def request_stop(*_: object) -> None:
        if not stop.is_set():
            log.info("stopping: the current batch finishes, then the query stops")
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    restore_jvm = None
    if under_spark_submit():  # the signals reach the JVM, our parent: it calls back
        restore_jvm = on_jvm_signals(spark, lambda name: request_stop())
    try:
        try:
            query = start_query(spark, config, once=once, stop=stop)
        except PySparkException as exc:  # one line, not Spark's layers of traceback
            log.error("job cannot start: %s", root_cause(str(exc))[:500])
            return 1
        except (SourceOptionError, ConfigError) as exc:  # e.g. no capture log yet; no Kafka source jars
            log.error("job cannot start: %s: %s", type(exc).__name__, exc)
            return 1
        if on_started is not None:
            on_started()
        failure: str | None = None
        try:
            while not stop.is_set() and not query.awaitTermination(1):
                pass
        except StreamingQueryException as exc:
            failure = str(exc)
        if stop.is_set():
            stop_after_batch(query)
            if failure is None and query.exception() is not None:
                failure = str(query.exception())
        if failure is not None and not (stop.is_set() and is_stop_requested(failure)):
            log.error("job failed: %s", root_cause(failure)[:500])
            return 1
        progress_listener(spark, config).ended(query.runId)
        return 0
    finally:
        if restore_jvm is not None:
            restore_jvm()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def forget(spark: "SparkSession") -> None:
    """Drop lakegate's listeners of a session whose JVM has exited (nothing to call into)."""
    with _listeners_lock:
        _listeners[:] = [(s, listener) for s, listener in _listeners if s is not spark]


def release(spark: "SparkSession") -> None:
    """Report what the listener bus has not delivered yet and remove
    lakegate's listeners from ``spark`` (the session keeps running).

    Removing the Python listener keeps the JVM from calling back into a
    Python process that is going away."""
    with _listeners_lock:
        mine = [(s, listener) for s, listener in _listeners if s is spark]
        for entry in mine:
            _listeners.remove(entry)
    for _, listener in mine:
        try:
            listener.catch_up()
        except Exception as exc:  # the session may already be stopping
            log.debug("progress catch-up at release: %s", exc)
        try:
            spark.streams.removeListener(listener)
        except Exception as exc:
            log.debug("removing the progress listener: %s", exc)


def shutdown(spark: "SparkSession") -> None:
    """Stop active queries, remove lakegate's listeners, stop the session."""
    for q in spark.streams.active:
        q.stop()
    release(spark)
    spark.stop()
