"""Live forwarding: AMQP forwarding as records become durable, outside the
micro-batch (``amqp.forward_by``; ``lakegate run``'s default).

The micro-batch put a trigger interval and a whole Spark batch between a
PUBLISH and its AMQP transfer (about 1.1 s at p50, ``lakegate bench e2e``).
:class:`LiveForwarder` runs next to the edge, on a thread of its own: every
``amqp.live_interval_ms`` it reads what became durable in the capture log
since its cursor, makes frame rows of it without Spark
(:func:`bridge.rows.arrow_frames.frame_rows_arrow`, the job's parser),
selects and orders the rows to forward exactly as the job does
(:func:`bridge.rows.forward_rows.forward_rows_of`) and forwards them with the
job's :class:`~bridge.amqp.sender.Forwarder` (same mapping, retries,
outcomes). The job then writes the tables only.

Guarantees, the job's:

* **at least once, in capture order per partition.** The cursor is the
  forwarded mark (:class:`~bridge.amqp.forwarded.ForwardedOffsets`, the
  file ``ack_after = "forward"`` waits on), raised to the end of a range
  only once every message of it was accepted; a restart resumes after it.
  A range the peer does not take (``ForwardError`` after the retries) is
  sent again after a pause, from the same cursor; capture goes on.
  A crash between sending and recording sends those messages again (their
  ``lakegate-id`` identifies them), never skips one. The marks are fsynced
  at most once a second (``MARK_SYNC_S``): after a power loss a mark can
  be older than what was sent (more duplicates), never newer.
* **nothing deleted unforwarded.** The cursor is committed as the capture
  log consumer ``live-forwarder``; retention deletes only below it.
* **rows no message can be made of** (``LG-amqp-unforwardable``) and
  messages the peer refuses for their own sake (``LG-amqp-rejected``) go to
  the ``quarantine`` table, once: per capture partition under the app id
  ``lakegate-forward:<stream>:<partition>/unforwardable``, whose version
  is the highest offset quarantined so far; a range sent again after a
  crash writes only rows above it (the version is checked here, before the
  write: delta-rs records but does not refuse a replayed app transaction).

Switching ``amqp.forward_by`` between the job and the edge keeps the
guarantee: both raise the same marks, and the job forwards from its own
checkpoint (what the live forwarder sent may be sent again).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from bridge.config import Config

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from bridge.tables.engine import TableEngine

__all__ = ["CONSUMER", "STATUS_FILE", "LiveForwarder", "LiveStats", "forwards_live", "read_live_status"]

log = logging.getLogger("bridge.amqp.live")

#: The capture log consumer the live forwarder commits as (holds retention).
CONSUMER = "live-forwarder"
#: The forwarded marks and the consumer commit are made durable at most this often.
MARK_SYNC_S = 1.0
#: ``lakegate status`` reads the live forwarder's state here (rewritten about once a second while it runs).
STATUS_FILE = "forward-live.json"
#: A status file not rewritten for this long is a forwarder that is gone.
STATUS_STALE_S = 30.0
#: Idle and attached to the capture log: the longest wait without a wake-up (status refresh).
IDLE_WAIT_S = 1.0
#: Pauses after a range failed (ForwardError or anything else), growing per failure in a row.
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def forwards_live(config: Config, *, hosts_edge: bool, runs_job: bool) -> bool:
    """Whether a process forwards live: it hosts the edge, forwarding is on
    (``amqp.url``) and ``amqp.forward_by`` says the edge forwards
    (``"edge"``; ``"auto"``: when the process also runs the job, i.e.
    ``lakegate run``). The job forwards exactly when this is False for
    ``lakegate run`` and ``amqp.forward_by`` is not ``"edge"`` elsewhere
    (:func:`bridge.job.pipeline.job_forwards`)."""
    if not config.amqp.url or not hosts_edge:
        return False
    by = config.amqp.forward_by
    return by == "edge" or (by == "auto" and runs_job)


@dataclass
class LiveStats:
    """What the live forwarder did since it started (``lakegate status``, metrics)."""

    cycles: int = 0  # ranges forwarded (each one Forwarder.forward call at most)
    records: int = 0  # capture records passed (forwarded or not meant for forwarding)
    forwarded: int = 0  # accepted + QoS 0 handed over
    expired: int = 0
    unforwardable: int = 0  # quarantined (LG-amqp-unforwardable, LG-amqp-rejected)
    failed_attempts: int = 0  # ranges that failed and were sent again
    seconds: float = 0.0  # time spent in cycles that had records
    last_error: str | None = None
    #: the failure going on now: {"since", "cause", "time"} (epoch seconds), else None
    failure: dict | None = None
    #: per partition, records durable and not forwarded yet (at the last look)
    lag: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "records": self.records, "forwarded": self.forwarded,
                "expired": self.expired, "unforwardable": self.unforwardable,
                "failed_attempts": self.failed_attempts, "seconds": round(self.seconds, 3),
                "last_error": self.last_error, "failure": self.failure,
                "lag": {str(p): n for p, n in sorted(self.lag.items())}}


def read_live_status(data_dir) -> dict | None:
    """The live forwarder's last status (``STATUS_FILE``) if one is running
    (rewritten within ``STATUS_STALE_S``), else None."""
    import json
    from pathlib import Path

    try:
        st = json.loads((Path(data_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return st if time.time() - float(st.get("time", 0)) <= STATUS_STALE_S else None


class LiveForwarder:
    """Forwards the capture log to AMQP as it becomes durable (module doc).

    ``start()`` runs :meth:`cycle` on a daemon thread until ``stop()``:
    a range starts ``amqp.live_interval_ms`` after the previous one began,
    or at once when that one took longer (records gather meanwhile: the
    cost per range is paid at most that often); idle, it waits for the capture log's next commit (``attach``,
    in the edge's process) or looks once an interval. Tests may call
    :meth:`cycle` directly instead. ``engine``: the tables' engine for
    quarantined rows (default: made on first need, delta-rs unless
    ``tables.engine`` asks for delta-spark, which needs a session: then
    ``engine`` must be given)."""

    def __init__(self, config: Config, *, engine: "TableEngine | None" = None,
                 forwarder_factory: Callable[[], Any] | None = None) -> None:
        from bridge.amqp.forwarded import ForwardedOffsets

        if not config.amqp.url:
            raise ValueError("amqp.url is empty: forwarding is off")
        self.config = config
        self.stream = config.capture_stream
        self._reader = None
        self.marks = ForwardedOffsets(config.data_path, self.stream)
        self.stats = LiveStats()
        self._engine = engine
        self._forwarder_factory = forwarder_factory
        self._cursor: dict[int, int] | None = None
        self._last_sync = 0.0
        self._last_status = 0.0
        self._status_dirty = False
        self._unsynced = False
        self._stop = threading.Event()
        #: set by the capture log when records became durable (``attach``)
        self._wake = threading.Event()
        self._attached = False
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None
        #: the Forwarder of the latest range (its link counts go to /metrics: :meth:`link_stats`)
        self.forwarder: Any = None

    # ------------------------------------------------------------ lifecycle
    def attach(self, log: Any) -> None:
        """Be woken by ``log`` (the edge's :class:`~bridge.capture.writer.CaptureLog`,
        in this process) when records become durable: no polling while idle,
        and the first message after a quiet spell goes out at once."""
        log.on_durable.append(self._wake.set)
        self._attached = True

    def attach_fd(self, fd: int) -> None:
        """Be woken by bytes on ``fd``, the read end of a pipe the edge's
        process writes to when records become durable (``lakegate run`` with
        the edge in a process of its own: :mod:`bridge.job.edge_process`)."""
        import os

        def pump() -> None:
            while True:
                try:
                    if not os.read(fd, 4096):
                        return  # every writer closed it
                except OSError:
                    return  # closed here: the run is ending
                self._wake.set()

        threading.Thread(target=pump, name="lakegate-live-wake", daemon=True).start()
        self._attached = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lakegate-live-forwarder", daemon=True)
        self._thread.start()
        log.info("live forwarding: %s, %d ms between ranges, up to %d records a range, as capture log consumer %r",
                 "woken by the edge's commits" if self._attached else "looking once an interval when idle",
                 self.config.amqp.live_interval_ms, self.config.amqp.live_max_records, CONSUMER)

    def stop(self, drain_s: float = 10.0) -> None:
        """Stop after the range in progress; first forward what is durable,
        for up to ``drain_s`` (the edge has stopped by then: nothing new)."""
        self._drain_until = time.monotonic() + drain_s
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(drain_s + self.config.amqp.disposition_timeout_s + 5)
        self._sync(force=True)
        (self.config.data_path / STATUS_FILE).unlink(missing_ok=True)  # lakegate status: no live forwarder now
        if self._reader is not None and not self.alive:
            self._reader.close()  # on Kafka: its consumers
            self._reader = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        interval = self.config.amqp.live_interval_ms / 1000.0
        failures = 0
        while True:
            stopping = self._stop.is_set()
            if stopping and time.monotonic() >= self._drain_until:
                return
            self._wake.clear()  # set again by any commit from here on: the cycle or the wait sees it
            began = time.monotonic()
            try:
                n = self.cycle()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - never ends the thread: capture goes on, this retries
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                self.stats.failed_attempts += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
                self._trouble(self.stats.last_error)
                (log.error if failures == 1 else log.warning)(
                    "live forwarding: a range was not forwarded (%s); capture continues; sending it again in "
                    "%.0fs", self.stats.last_error, delay)
                if self._stop.wait(delay) and time.monotonic() >= self._drain_until:
                    return
                continue
            if stopping and n == 0:
                return  # drained
            if n == 0:
                # idle: woken by the capture log's next commit (attached), else a look per interval
                self._wake.wait(IDLE_WAIT_S if self._attached else interval)
            elif n < self.config.amqp.live_max_records:
                # a full range goes on at once; otherwise records gather until an interval after
                # this range began (at most 1000/live_interval_ms ranges a second: the cost per range
                # is paid that often; a range that took longer than the interval is followed at once:
                # a pause then would only let the backlog grow, measured at 11,000 msg/s)
                self._stop.wait(max(0.0, interval - (time.monotonic() - began)))

    # ------------------------------------------------------------ one range
    @property
    def reader(self):
        """The capture log's reader, opened on first use (the edge creates the log when it starts)."""
        if self._reader is None:
            from bridge.capture import open_reader

            self._reader = open_reader(self.config)  # local files or the Kafka topic
        return self._reader

    def _cursors(self) -> dict[int, int]:
        if self._cursor is None:
            earliest = self.reader.earliest_offsets()
            cur = {}
            for p, first in enumerate(earliest):
                mark = self.marks.get(p) + 1
                if mark < first:
                    log.warning("live forwarding: partition %d: records %d..%d were deleted by retention before "
                                "they were forwarded", p, mark, first - 1)
                cur[p] = max(mark, first)
            self._cursor = cur
        return self._cursor

    def cycle(self) -> int:
        """Forward what became durable since the cursor (at most
        ``amqp.live_max_records`` records); returns how many records it
        passed. Raises when the range could not be forwarded (nothing is
        recorded then; the next call sends it again)."""
        cursor = self._cursors()
        durable = self.reader.durable_offsets()
        budget = self.config.amqp.live_max_records
        work = []
        for p, end in enumerate(durable):
            start = cursor.get(p, 0)
            self.stats.lag[p] = max(0, end - start)
            if end > start and budget > 0:
                stop = min(end, start + budget)
                budget -= stop - start
                work.append((p, start, stop))
        if not work:
            self._sync()
            # caught up: the counts go out now (a reader waiting for them sees the final ones)
            if self._status_dirty or time.monotonic() - self._last_status >= STATUS_STALE_S / 6:
                self._write_status()
            return 0
        t0 = time.monotonic()
        from bridge.rows.arrow_frames import frame_rows_arrow
        from bridge.rows.forward_rows import forward_rows_of

        table = frame_rows_arrow(b for p, s, e in work for b in self.reader.arrow_batches(p, s, e))
        rows = forward_rows_of(table)
        if rows:
            result = self._forward(rows)
            self.stats.forwarded += result.accepted + result.qos0
            self.stats.expired += result.expired
            if result.failures:
                self.stats.unforwardable += self._quarantine(table, result.failures)
        n = sum(e - s for _, s, e in work)
        for p, _, e in work:
            cursor[p] = e
            self.stats.lag[p] = max(0, durable[p] - e)
        self._record_marks(work)
        self.stats.cycles += 1
        self.stats.records += n
        self._status_dirty = True
        self.stats.seconds += time.monotonic() - t0
        self.stats.last_error = None
        if self.stats.failure is not None:
            log.info("live forwarding: forwarding again after %.0fs of failure", time.time() - self.stats.failure["since"])
            self.stats.failure = None
            self._write_status()
        if rows:
            log.debug("live forwarding: %d records, %d rows forwarded in %.3fs", n, len(rows), time.monotonic() - t0)
        return n

    def _forward(self, rows: list[dict]):
        from bridge.amqp.sink import forwarder_for

        fwd = self._forwarder_factory() if self._forwarder_factory else forwarder_for(self.config.amqp)
        self.forwarder = fwd
        return fwd.forward(iter(rows), on_trouble=lambda cause, since: self._trouble(cause, since))

    def link_stats(self) -> dict[str, Any] | None:
        """The AMQP links of the forwarder it forwards with (open, attaches,
        detaches, ...: :meth:`~bridge.amqp.sender.Forwarder.link_stats`);
        None before its first range."""
        fwd = self.forwarder
        stats = getattr(fwd, "link_stats", None)
        return stats() if stats is not None else None

    def _trouble(self, cause: str, since: float | None = None) -> None:
        """A failed attempt (the Forwarder's report while it retries, or a
        range that failed): recorded for ``lakegate status`` at once."""
        now = time.time()
        first = self.stats.failure["since"] if self.stats.failure else (since or now)
        self.stats.failure = {"since": min(first, since or first), "cause": f"forwarding: {cause}"[:500], "time": now}
        self._write_status()

    def _write_status(self) -> None:
        import json
        import os

        from bridge.capture.layout import atomic_write

        self._last_status = time.monotonic()
        self._status_dirty = False
        body = {"pid": os.getpid(), "time": time.time(), **self.stats.as_dict()}
        try:
            atomic_write(self.config.data_path / STATUS_FILE, json.dumps(body).encode())
        except OSError as exc:  # status is best effort; forwarding goes on
            log.debug("live forwarding: status file not written: %s", exc)

    def _record_marks(self, work: list[tuple[int, int, int]]) -> None:
        """Raise the marks to the ranges' ends now (the edge's ``ack_after =
        "forward"`` sees them at once); fsynced with the consumer commit."""
        for p, _, e in work:
            self.marks.record(p, e - 1, sync=False)
        self._unsynced = True
        self._sync()

    def _sync(self, force: bool = False) -> None:
        """At most once per ``MARK_SYNC_S`` (or now: ``force``), fsync the
        marks written since and commit the cursor as the capture consumer."""
        if self._cursor is None or not (force or (self._unsynced and
                                                  time.monotonic() - self._last_sync >= MARK_SYNC_S)):
            return
        from bridge.capture.commits import commit_offsets

        if self._unsynced:
            for p in self._cursor:
                self.marks.sync(p)
        commit_offsets(self.config.capture_dir, CONSUMER, self._cursor)
        self._last_sync = time.monotonic()
        self._unsynced = False
        self._write_status()

    # ------------------------------------------------------------ quarantine
    def engine(self) -> "TableEngine":
        if self._engine is None:
            from bridge.tables.engine import make_engine

            self._engine = make_engine(self.config)
            self._engine.ensure()
        return self._engine

    def _quarantine(self, table: "pa.Table", failures: list) -> int:
        """Quarantine the failures once per (partition, offset): per
        partition, only those above the app id's recorded version."""
        from bridge.tables.rows import unforwardable_rows

        engine = self.engine()
        written = 0
        by_partition: dict[int, list] = {}
        for f in failures:
            by_partition.setdefault(int(f.partition), []).append(f)
        for p, fs in sorted(by_partition.items()):
            app_id = f"lakegate-forward:{self.stream}:{p}/unforwardable"
            done = engine.committed_version("quarantine", app_id)
            fresh = [f for f in fs if done is None or int(f.offset) > done]
            if not fresh:
                continue
            rows = unforwardable_rows(table, fresh)
            if rows.num_rows:
                engine.append("quarantine", rows, app_id, max(int(f.offset) for f in fresh))
                written += rows.num_rows
        if written:
            rules = ", ".join(sorted({f.rule for f in failures}))
            log.warning("live forwarding: %d rows not forwardable, quarantined (%s)", written, rules)
        return written
