"""The AMQP forwarding sink for ``foreachBatch``: forwards from the executors
(a small batch from the driver: :func:`forward_on_driver`).

:func:`forward_batch` (called once per micro-batch, on the driver) groups
the batch's FORWARD_DDL rows by capture partition, orders them by
(partition, offset) -- capture order, hence order per MQTT connection --
and forwards each group in an executor task over that task's own AMQP
connection (a :class:`~bridge.amqp.sender.Forwarder` kept per Python worker
process, so connections and links outlive the batch). Forwarding scales
with the executors instead of one driver process.

Each task returns one row of counts; the driver logs the totals. A task
whose messages cannot be delivered raises
:class:`~bridge.amqp.sender.ForwardError`, which fails the batch; Spark runs
it again from the checkpoint (messages already accepted are sent again: the
``lakegate-id`` application property lets a consumer drop them). A row that
no message can be made of (``LG-amqp-unforwardable``: the mapping or the
encoding fails, as it would on every retry) does not fail the batch, nor
does a message the peer refuses for its own sake (``LG-amqp-rejected``): the
task returns it in ``failures`` and the batch step quarantines it.

After a task succeeds it records, per capture partition, the highest
forwarded offset (:class:`~bridge.amqp.forwarded.ForwardedOffsets`): the
edge's ``ack_after = "forward"`` waits on it.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Iterator

from bridge.config import AmqpConfig, Config

if TYPE_CHECKING:  # pragma: no cover
    from bridge.amqp.sender import ForwardResult, Forwarder

__all__ = ["COUNTS_DDL", "close_forwarders", "forward_batch", "forward_on_driver", "forward_rows",
           "forwarder_for"]

log = logging.getLogger("bridge.amqp")

#: One row per task: what it forwarded.
COUNTS_DDL = (
    "task INT, partitions ARRAY<INT>, rows BIGINT, accepted BIGINT, qos0 BIGINT, "
    "expired BIGINT, unroutable BIGINT, unforwardable BIGINT, transfers BIGINT, retried BIGINT, "
    "reconnects BIGINT, seconds DOUBLE, "
    "failures ARRAY<STRUCT<stream: STRING, partition: INT, offset: BIGINT, rule: STRING, error: STRING>>"
)
_COUNT_FIELDS = ("rows", "accepted", "qos0", "expired", "unroutable", "unforwardable", "transfers", "retried",
                 "reconnects", "seconds")

_forwarders: dict[tuple, "Forwarder"] = {}
_forwarders_lock = threading.Lock()


def forwarder_for(amqp: AmqpConfig) -> "Forwarder":
    """The Forwarder of this process for ``amqp`` (made on first use, kept).

    Runs on executors: a Python worker process forwards every task it runs
    over one connection, whose links stay attached between batches.
    """
    from bridge.amqp.sender import Forwarder

    key = tuple(sorted(dataclasses.asdict(amqp).items()))
    with _forwarders_lock:
        if not _forwarders:
            # Registered after proton was imported, so it runs before proton's own
            # exit-time cleanup: a forwarder thread still running then aborts
            # the interpreter (cffi handles of collected objects).
            atexit.register(close_forwarders)
        fwd = _forwarders.get(key)
        if fwd is None or not fwd.alive:
            fwd = _forwarders[key] = Forwarder(amqp)
        return fwd


def close_forwarders() -> None:
    """Close this process's cached Forwarders (at exit)."""
    with _forwarders_lock:
        fwds = list(_forwarders.values())
        _forwarders.clear()
    for fwd in fwds:
        try:
            fwd.close()
        except Exception as exc:  # noqa: BLE001 - exiting anyway
            log.debug("closing a forwarder at exit: %s", exc)


def forward_rows(rows: Iterator[dict[str, Any]], amqp: AmqpConfig, data_dir: str | None) -> "ForwardResult":
    """Forward rows (dicts, in capture order) and record the forwarded marks.

    Runs on executors (and in tests without Spark). Raises ForwardError.
    While the Forwarder retries, the trouble is recorded in this process's
    :class:`~bridge.amqp.trouble.TroubleFile` (for ``lakegate status``);
    removed once a task forwards without failing.
    """
    from bridge.amqp.forwarded import ForwardedOffsets
    from bridge.amqp.trouble import TroubleFile

    high: dict[tuple[str, int], int] = {}

    def tracked() -> Iterator[dict[str, Any]]:
        for row in rows:
            p, off = row.get("partition"), row.get("offset")
            if p is not None and off is not None:
                k = (row.get("stream") or "mqtt-frames", int(p))
                if off > high.get(k, -1):
                    high[k] = int(off)
            yield row

    trouble = TroubleFile(data_dir) if data_dir else None
    result = forwarder_for(amqp).forward(tracked(), on_trouble=trouble.write if trouble else None)
    if trouble is not None:
        trouble.clear()
    if data_dir:
        for (stream, partition), offset in sorted(high.items()):
            ForwardedOffsets(data_dir, stream).record(partition, offset)
    return result


def _forward_arrow(batches: Iterator[Any], amqp: AmqpConfig, data_dir: str | None,
                   log_level: str = "INFO") -> Iterator[Any]:
    """mapInArrow body: runs on executors, once per task. Must stay picklable."""
    import pyarrow as pa
    from pyspark import TaskContext

    from bridge.logs import ensure_worker_logging
    from schemas.ddl import to_arrow

    ensure_worker_logging(log_level)  # timestamps on the worker's lines too

    partitions: set[int] = set()

    def rows() -> Iterator[dict[str, Any]]:
        for rb in batches:
            for row in rb.to_pylist():
                if row.get("partition") is not None:
                    partitions.add(int(row["partition"]))
                yield row

    result = forward_rows(rows(), amqp, data_dir)
    ctx = TaskContext.get()
    out = {"task": ctx.partitionId() if ctx is not None else 0, "partitions": sorted(partitions)}
    out.update({k: getattr(result, k) for k in _COUNT_FIELDS})
    out["failures"] = [dataclasses.asdict(f) for f in result.failures]
    yield pa.RecordBatch.from_pylist([out], schema=to_arrow(COUNTS_DDL))


def forward_on_driver(rows: list[dict[str, Any]], batch_id: int, config: Config) -> "ForwardResult":
    """Forward a small micro-batch from the driver: ``rows`` are its
    FORWARD_DDL rows in capture order ((partition, offset)), made from the
    batch the step has on the driver already
    (:func:`bridge.rows.forward_rows.forward_rows_of`), and the driver
    process's own :class:`~bridge.amqp.sender.Forwarder` sends them
    (:func:`forward_rows`: the same retries, failures and forwarded marks as
    a task). No Spark job or Python worker runs for it: for a batch of a few
    hundred rows that job was most of the forwarding time (``lakegate bench
    job``)."""
    from bridge.amqp.sender import ForwardResult

    if not config.amqp.url:
        return ForwardResult()
    total = forward_rows(iter(rows), config.amqp, str(config.data_path))
    log.info(
        "AMQP batch %s: %d rows from the driver: %d accepted, %d QoS 0 sent, %d expired, %d unroutable, "
        "%d unforwardable, %d retried, %d reconnects (%.2fs)",
        batch_id, total.rows, total.accepted, total.qos0, total.expired, total.unroutable,
        total.unforwardable, total.retried, total.reconnects, total.seconds,
    )
    return total


def forward_batch(df: Any, batch_id: int, config: Config, *, aligned: bool = False,
                  rows: int | None = None, table: Any = None) -> "ForwardResult":
    """Forward one micro-batch of FORWARD_DDL rows; for ``foreachBatch``.

    Called once per micro-batch, on the driver. ``amqp.url`` empty: does
    nothing. Returns the summed counts (also logged); raises when a task
    failed (the error names the address and the outcome).

    ``aligned``: the caller knows that each Spark partition of ``df`` holds
    all the rows of one capture partition in offset order (the stream's
    plan: one offset range per capture partition, narrow steps after it;
    see :func:`bridge.job.batch.partitions_aligned`). Then the rows are
    forwarded where they are, with no shuffle: one Spark stage instead of
    two, which is most of a small batch's forwarding time. Otherwise they
    are repartitioned by capture partition and sorted by offset first.

    ``rows``, ``table``: how many rows ``df`` holds and the batch's frame
    rows as Arrow, when the caller has them on the driver; ``rows`` at most
    ``job.forward_on_driver_max_rows`` (and that not 0): forwarded from the
    driver instead (:func:`forward_on_driver`), its rows made from ``table``;
    then ``df`` may be None (the batch step builds no DataFrame for it).
    """
    from bridge.amqp.sender import ForwardResult
    from bridge.amqp.unforwardable import Unforwardable

    total = ForwardResult()
    if not config.amqp.url:
        log.debug("AMQP forwarding off (amqp.url is empty); batch %s not forwarded", batch_id)
        return total
    limit = config.job.forward_on_driver_max_rows
    if table is not None and rows is not None and 0 < limit and rows <= limit:
        from bridge.rows.forward_rows import forward_rows_of

        return forward_on_driver(forward_rows_of(table), batch_id, config)
    if df is None:
        raise ValueError(f"batch {batch_id}: no DataFrame to forward and the driver path does not apply "
                         f"({rows} rows, job.forward_on_driver_max_rows {limit}, table given: {table is not None})")
    if aligned:
        ordered = df
    else:
        n = max(1, int(config.capture.partitions))
        ordered = df.repartition(n, "partition").sortWithinPartitions("partition", "offset")
    fn = functools.partial(_forward_arrow, amqp=config.amqp, data_dir=str(config.data_path),
                           log_level=config.log_level)
    tasks = ordered.mapInArrow(fn, COUNTS_DDL).collect()
    for t in tasks:
        for k in _COUNT_FIELDS:
            if k != "seconds":
                setattr(total, k, getattr(total, k) + (t[k] or 0))
        total.seconds = max(total.seconds, t["seconds"] or 0.0)
        total.failures.extend(Unforwardable(**f.asDict()) for f in t["failures"] or ())
    log.info(
        "AMQP batch %s: %d rows in %d tasks: %d accepted, %d QoS 0 sent, %d expired, %d unroutable, "
        "%d unforwardable, %d retried, %d reconnects (slowest task %.2fs)",
        batch_id, total.rows, sum(1 for t in tasks if t["rows"]), total.accepted, total.qos0, total.expired,
        total.unroutable, total.unforwardable, total.retried, total.reconnects, total.seconds,
    )
    return total
