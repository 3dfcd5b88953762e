"""The foreachBatch step: tables, then AMQP forwarding, then maintenance.

``BatchStep`` is called by Spark once per micro-batch, on the driver, with the
batch's capture records (``schemas.capture.CAPTURE_RECORD_DDL``, as the
source reads them). It is not pickled and never runs on executors.

Where a batch is parsed into frame rows (``schemas.tables.FRAME_ROW_DDL``)
depends on its size, which Spark's offset log tells before the batch is
read (``batch_records``):

- at most ``job.parse_on_driver_max_rows`` records (default 500,000, the
  default ``job.max_records_per_trigger``: every batch; when the job
  forwards, also at most ``job.forward_on_driver_max_rows``): the records
  come to the driver as Arrow, as the floor query's do, and the driver
  makes the frame rows with :func:`bridge.rows.arrow_frames.frame_rows_arrow`
  (the same parser, ``bridge.parse.frames.parse_frames``, and the same
  columns; kept equal by ``tests/job/test_arrow_frames.py``). The tables
  are written from the driver's Arrow copy of the batch either way; this
  saves the pandas UDF's second Python-worker hop (rows to Arrow, to
  pandas, back, to rows) and its planning: 0.08 s of a 0.3 s batch at
  1,000 records, 2.4 s of a 4.4 s batch at 160,000 (README, "Where issue
  25 ends");
- larger, of unknown size (a purged offset log), or forwarded by the
  executors: the executors parse with the pandas UDF
  (``bridge.job.pipeline.frame_rows``) and the driver collects the frame
  rows.

A batch with at most ``job.forward_on_driver_max_rows`` rows to forward is
forwarded from the driver (from the batch as Arrow); a bigger one on
executors (one AMQP connection per task over a capture partition).

Order and failure semantics:

1. the three tables (``bridge.tables.writer.write_tables``), each under the
   app transaction (query id, batch id): a re-run batch writes nothing twice;
2. AMQP forwarding of every valid PUBLISH (edge-marked QoS 2 duplicates left
   out) and every PUBREL, at least once, each message carrying its capture
   coordinates as a stable identity; a failure fails the batch and Spark
   re-runs it from the checkpoint (tables skip, forwarding sends again).
   A row no AMQP message can be made of (``LG-amqp-unforwardable``: the
   mapping or encoding fails, deterministically) is not retried: it is
   quarantined with its error, counted and logged, and the batch goes on;
   so is a message the peer refuses for its own sake (``LG-amqp-rejected``:
   rejected with amqp:decode-error or amqp:link:message-size-exceeded on
   every attempt, or over the link's max-message-size);
3. table maintenance when ``tables.compact_interval_s`` has passed.

Stopping: when the ``stop`` event the step was given is set, a batch that is
running finishes, and the next batch raises ``StopRequested`` before it
touches anything (Spark runs it again from the checkpoint on the next start),
so a stopping job never leaves half a batch behind.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bridge.config import Config
from bridge.rows.forward_rows import PUBLISH, PUBREL  # one definition for both forwarding paths
from bridge.tables.engine import TableEngine
from bridge.tables.maintenance import run_maintenance
from bridge.tables.writer import TableStats, write_tables, write_unforwardable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BatchStats", "BatchStep", "Placement", "StopRequested", "batch_records", "is_stop_requested",
           "offset_log_entry", "partitions_aligned", "query_id_from_checkpoint", "select_forward"]

log = logging.getLogger(__name__)


def _last_offsets(table) -> dict[int, int]:
    """The highest capture offset per partition among a batch's rows."""
    if table.num_rows == 0:
        return {}
    ends = table.group_by("partition").aggregate([("offset", "max")])
    return {int(p): int(o) for p, o in zip(ends["partition"].to_pylist(),
                                           ends["offset_max"].to_pylist())
            if p is not None and o is not None}


def _kafka_last(checkpoint: Path, batch_id: int, last: dict[int, int]) -> dict[int, int]:
    """A Kafka batch's highest offset per partition as coverage counts it:
    its end offsets in the offset log minus one (the batch read everything
    below them: records the frame rows leave out, a subscriber's PUBACK
    runs, and offsets Kafka gives no record, transaction markers, count as
    covered), at least the highest offset among its rows (``last``); only
    ``last`` when the offset log cannot be read."""
    try:
        ends = {int(p): int(o) - 1 for p, o in offset_log_entry(checkpoint, batch_id).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return last
    out = dict(last)
    for p, o in ends.items():
        if o > out.get(p, -1):
            out[p] = o
    return out


def offset_log_entry(checkpoint: str | Path, batch_id: int) -> dict[str, int]:
    """The source's end offsets of micro-batch ``batch_id`` in Spark's offset
    log (``<checkpoint>/offsets/<id>``: ``v1``, the batch metadata, then one
    line per source; ours is ``{"<partition>": <offset>, ...}``, Spark's
    Kafka source's ``{"<topic>": {"<partition>": <offset>}}`` is flattened to
    that; ``-`` or nothing: {}). Raises OSError/ValueError when the entry
    cannot be read. The one reader of that file
    (``bridge.job.progress.committed_offsets`` uses it too)."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    if len(lines) <= 2 or lines[2] in ("-", ""):
        return {}
    doc = json.loads(lines[2])
    if isinstance(doc, dict) and any(isinstance(v, dict) for v in doc.values()):
        from bridge.spark.kafka_source import partition_offsets

        return partition_offsets(doc)
    return doc


def batch_records(checkpoint: str | Path, batch_id: int) -> int | None:
    """How many capture records micro-batch ``batch_id`` reads: its end
    offsets minus the previous batch's, from Spark's offset log, which Spark
    writes before it calls foreachBatch. The first batch of a checkpoint
    starts at the source's initial offsets (the log's earliest, at least 0):
    its end offsets' sum is an upper bound, exact for a log that still holds
    offset 0. None when nothing can be told (a log Spark has purged, a file
    that does not parse): the caller assumes a big batch."""
    if batch_id < 0:
        return None
    try:
        end = offset_log_entry(checkpoint, batch_id)
        start = offset_log_entry(checkpoint, batch_id - 1) if batch_id > 0 else {}
        return sum(max(0, int(o) - int(start.get(p, 0))) for p, o in end.items())
    except (OSError, ValueError, TypeError, AttributeError):
        return None


class StopRequested(RuntimeError):
    """Raised by the batch step instead of starting a batch once a stop was requested."""


def is_stop_requested(error: object) -> bool:
    """Whether a query's failure (exception or its text) is a ``StopRequested``."""
    return StopRequested.__name__ in str(error)


@dataclass(frozen=True)
class Placement:
    """Where the batch step handles one micro-batch (``BatchStep._placement``)."""

    records: int | None  # capture records in the batch (offset log), None: unknown
    parse_on_driver: bool  # frame rows made on the driver from the records as Arrow
    cache: bool  # the executors' frame rows kept in Spark's cache (they may forward them)


@dataclass
class BatchStats:
    batch_id: int
    tables: TableStats | None = None
    forwarded: int = 0
    forward_expired: int = 0
    forward_unforwardable: int = 0  # quarantined as LG-amqp-unforwardable (in tables.quarantined too)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def query_id_from_checkpoint(checkpoint: str | Path) -> str:
    """The streaming query's id, which persists across restarts from its checkpoint.

    Spark writes ``<checkpoint>/metadata`` (``{"id": ...}``) when the query
    starts, before the first batch.
    """
    meta = Path(checkpoint) / "metadata"
    with meta.open() as fh:
        return json.loads(fh.readline())["id"]


def select_forward(frames: "DataFrame") -> "DataFrame":
    """The rows AMQP forwarding sends (``schemas.forward.FORWARD_DDL``), from frame rows."""
    from pyspark.sql import functions as F

    ok = F.col("valid") & F.col("edge_rule").isNull()
    is_pub = (F.col("packet_type") == PUBLISH) & ~F.col("duplicate")
    is_rel = (F.col("packet_type") == PUBREL) & F.col("rel_topic").isNotNull()
    sel = frames.where(ok & (is_pub | is_rel))
    pub = F.col("packet_type") == PUBLISH

    def pub_only(c: str):
        return F.when(pub, F.col(c))

    return sel.select(
        F.when(pub, F.lit("publish")).otherwise(F.lit("pubrel")).alias("kind"),
        F.when(pub, F.col("topic")).otherwise(F.col("rel_topic")).alias("topic"),
        F.col("packet_id"),
        F.when(pub, F.col("qos")).otherwise(F.lit(2)).alias("qos"),
        pub_only("retain").alias("retain"),
        pub_only("dup").alias("dup"),
        pub_only("payload").alias("payload"),
        pub_only("payload_format_indicator").alias("payload_format_indicator"),
        pub_only("message_expiry_interval").alias("message_expiry_interval"),
        pub_only("response_topic").alias("response_topic"),
        pub_only("correlation_data").alias("correlation_data"),
        pub_only("user_properties").alias("user_properties"),
        pub_only("content_type").alias("content_type"),
        "stream", "partition", "offset", "seq", "conn_id", "client_id",
        F.col("receive_time"),
    )


def _forwardable(table) -> int:
    """How many rows of an Arrow frame-row table ``select_forward`` would keep."""
    import pyarrow.compute as pc

    from bridge.rows.forward_rows import forward_mask

    if table.num_rows == 0:
        return 0
    return int(pc.sum(forward_mask(table)).as_py() or 0)


def partitions_aligned(frames: "DataFrame", table) -> bool:
    """True when every Spark partition of the micro-batch ``frames`` holds
    all the rows of one capture partition, in offset order.

    The source plans one offset range per capture partition (split only
    beyond ``SPLIT_RECORDS``) and everything up to foreachBatch is narrow, so
    that holds exactly when there are as many Spark partitions as capture
    partitions with rows in ``table`` (the batch, collected); a split range
    makes more. Forwarding can then skip its repartition."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return False
    return frames.rdd.getNumPartitions() == len(pc.unique(table["partition"]))


class BatchStep:
    """foreachBatch function object (driver only; see module doc)."""

    def __init__(self, config: Config, engine: TableEngine, checkpoint: str | Path,
                 forward: Callable[["DataFrame", int], Any] | None = None,
                 on_stats: Callable[[BatchStats], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.config = config
        self.engine = engine
        self.checkpoint = Path(checkpoint)
        self.forward = forward
        self.on_stats = on_stats
        self.stop = stop
        self._app_id: str | None = None
        #: per capture partition, the first offset the retained table does
        #: not reflect yet (bridge.tables.coverage); read from the table first
        self._covered: dict[int, int] | None = None
        self._last_maintenance = time.monotonic()
        self._lock = threading.Lock()

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"lakegate:{query_id_from_checkpoint(self.checkpoint)}"
        return self._app_id

    def __call__(self, records: "DataFrame", batch_id: int) -> None:
        t0 = time.monotonic()
        stats = BatchStats(batch_id=batch_id)
        with self._lock:
            if self.stop is not None and self.stop.is_set():
                raise StopRequested(f"stop requested: batch {batch_id} runs again from the checkpoint on the next start")
            place = self._placement(batch_id)
            stats.extra["parsed_on"] = "driver" if place.parse_on_driver else "executors"
            frames = None
            if not place.parse_on_driver:
                from bridge.job.pipeline import frame_rows

                frames = frame_rows(records)
                if place.cache:
                    frames = frames.persist()
            try:
                t1 = time.monotonic()
                if frames is None:
                    from bridge.rows.arrow_frames import frame_rows_arrow

                    table = frame_rows_arrow(records.toArrow().to_batches())
                else:
                    table = frames.toArrow()
                t2 = time.monotonic()
                last = _last_offsets(table)  # per capture partition, once per batch
                stats.tables = write_tables(self.engine, table, self.app_id, batch_id,
                                            coverage=self._coverage(last, batch_id))
                t3 = time.monotonic()
                stats.extra["timing_s"] = {"read_parse": round(t2 - t1, 3), "tables": round(t3 - t2, 3)}
                if self.forward is not None:
                    # bridge.amqp.sink.forward_batch -> ForwardResult; a batch with
                    # nothing to forward starts no Spark job for it.
                    n_forward = _forwardable(table)
                    if n_forward:
                        fwd = self._forward(records, frames, table, n_forward, batch_id)
                        counts = fwd.as_dict() if hasattr(fwd, "as_dict") else dict(fwd or {})
                    else:
                        fwd, counts = None, {}
                    stats.forwarded = int(counts.get("accepted", 0)) + int(counts.get("qos0", 0))
                    stats.forward_expired = int(counts.get("expired", 0))
                    stats.extra["forward"] = counts
                    failures = getattr(fwd, "failures", None)
                    if failures:
                        n = write_unforwardable(self.engine, table, failures, self.app_id, batch_id)
                        stats.forward_unforwardable = n
                        by_rule = dict(stats.tables.quarantined_by_rule)
                        for f in failures:
                            by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
                        stats.tables = dataclasses.replace(stats.tables, quarantined=stats.tables.quarantined + n,
                                                           quarantined_by_rule=tuple(sorted(by_rule.items())))
                        rules = ", ".join(sorted({f.rule for f in failures}))
                        log.warning("batch %d: %d rows not forwardable, quarantined (%s)", batch_id, n, rules)
                    self._mark_processed(last)
                    stats.extra["timing_s"]["forward"] = round(time.monotonic() - t3, 3)
                log.debug("batch %d timing: %s", batch_id, stats.extra.get("timing_s"))
            finally:
                if place.cache and frames is not None:
                    frames.unpersist()
            self._maybe_maintain()
        stats.seconds = time.monotonic() - t0
        if self.on_stats is not None:
            self.on_stats(stats)

    def _placement(self, batch_id: int) -> "Placement":
        """Where batch ``batch_id`` is parsed, and whether its frame rows are
        kept in Spark's cache; from its size in the offset log (module doc).

        Cached only when the executors parse it and may forward it (they
        read the frame rows again; without the cache they would read and
        parse them again); without forwarding nothing reads them twice.
        persist + unpersist cost about 10 ms a batch."""
        n = batch_records(self.checkpoint, batch_id)
        job = self.config.job
        fwd_limit = job.forward_on_driver_max_rows
        fits_driver_forwarding = 0 < fwd_limit and n is not None and n <= fwd_limit
        on_driver = (0 < job.parse_on_driver_max_rows and n is not None and n <= job.parse_on_driver_max_rows
                     and (self.forward is None or fits_driver_forwarding))
        cache = not on_driver and self.forward is not None and not fits_driver_forwarding
        return Placement(records=n, parse_on_driver=on_driver, cache=cache)

    def _forward(self, records: "DataFrame", frames: "DataFrame | None", table, n_forward: int,
                 batch_id: int) -> Any:
        """Hand the batch to ``self.forward`` (``bridge.amqp.sink.forward_batch``).

        At most ``job.forward_on_driver_max_rows`` rows to forward: the
        driver forwards them from ``table`` (the batch as Arrow, already
        here), and no DataFrame is built for it (``df`` is None): building
        ``select_forward``'s plan alone is some 700 py4j calls, 0.1 s a
        batch (measured with cProfile in ``lakegate bench job``), and
        ``partitions_aligned`` asks the JVM too. Otherwise the executors
        forward ``select_forward(frames)`` (``frames``: the executors' frame
        rows; made here from ``records`` if the driver parsed the batch,
        which ``_placement`` avoids)."""
        limit = self.config.job.forward_on_driver_max_rows
        if 0 < limit and n_forward <= limit:
            return self.forward(None, batch_id, aligned=False, rows=n_forward, table=table)
        if frames is None:
            from bridge.job.pipeline import frame_rows

            frames = frame_rows(records)
        return self.forward(select_forward(frames), batch_id, aligned=partitions_aligned(frames, table),
                            rows=n_forward, table=None)

    def _coverage(self, last: dict[int, int], batch_id: int) -> str:
        """The retained commit's ``userMetadata``: per capture partition, the
        first offset not reflected once this batch is committed (its highest
        offset + 1, else what the table recorded before; a lower bound, see
        ``bridge.tables.coverage``). ``last``: the batch's highest offset
        per partition."""
        from bridge.tables.coverage import coverage_metadata, covered_offsets

        kafka = self.config.capture.backend == "kafka"
        stream = self.config.capture_stream
        if kafka:
            last = _kafka_last(self.checkpoint, batch_id, last)
        if self._covered is None:
            try:
                self._covered = covered_offsets(self.engine.history("retained", 100), stream) or {}
            except Exception as exc:  # no table yet, or no history: nothing is covered
                log.debug("retained coverage: none recorded yet (%s)", exc)
                self._covered = {}
        for p, o in last.items():
            if o + 1 > self._covered.get(p, 0):
                self._covered[p] = o + 1
        return coverage_metadata(stream, self._covered, self.app_id, batch_id)

    def _mark_processed(self, last: dict[int, int]) -> None:
        """After the whole batch is forwarded, raise each partition's forwarded
        mark to the batch's last offset (``last``): records that needed no
        forwarding (CONNECT, quarantined frames, QoS 2 duplicates) must not
        hold back an ``ack_after = "forward"`` acknowledgement waiting behind
        them."""
        if not last:
            return
        from bridge.amqp.forwarded import ForwardedOffsets

        marks = ForwardedOffsets(self.config.data_path, self.config.capture_stream)
        for partition, offset in last.items():
            marks.record(partition, offset)

    def _maybe_maintain(self) -> None:
        interval = self.config.tables.compact_interval_s
        if interval <= 0 or time.monotonic() - self._last_maintenance < interval:
            return
        self._last_maintenance = time.monotonic()
        try:
            run_maintenance(self.engine, self.config.tables.vacuum_retention_hours)
        except Exception as exc:  # maintenance must never fail the stream; it runs again next interval
            log.warning("maintenance failed (will retry in %ss): %s", interval, exc)
