"""Progress: one log line per micro-batch, and ``lakegate status``.

The listener joins Spark's progress event (input rows, rows/s, duration) with
what the batch step did (retained upserts and deletes, quarantined,
forwarded) and the capture log's lag (log end minus the batch's end offset,
summed over partitions). It logs one line and writes it to
``<data_dir>/job-status.json`` so that ``lakegate status`` can show the last
batch of a running job next to the lag computed now, from the checkpoint's
last committed offsets and the log.

There is one listener per checkpoint and session (``bridge.job.pipeline``
registers it on the first ``start_query`` and reuses it when ``lakegate run``
restarts the query), so every batch is reported once and the totals in the
status file add up across restarts. The listener only reports the query of
its checkpoint (the query id Spark keeps in ``<checkpoint>/metadata``), and
only batches after the last one it reported: a late event of a run that
failed is not reported twice.

Failures: when the query fails (a batch could not be forwarded, ...) the
listener adds ``"failure": {"since", "cause", "failures", "time"}`` to the
status file, next to the last completed batch; ``since`` is the first
failure since the last completed batch (consecutive failures keep it, also
across a restart of the job, and it includes the executors' first failed
attempt, from ``bridge.amqp.trouble``). The next completed batch removes it.
:func:`current_failure` joins it with the executors' trouble files, so
``lakegate status`` shows an outage from its first failed attempt on, while
the forwarders are still retrying.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping

from bridge.job.batch import BatchStats, is_stop_requested, offset_log_entry, query_id_from_checkpoint

__all__ = ["ProgressListener", "committed_offsets", "current_failure", "format_failure", "format_line", "lag",
           "read_status"]

log = logging.getLogger("bridge.job.progress")

STATUS_FILE = "job-status.json"
#: Progress lines the listener keeps in memory (``ProgressListener.lines``).
LINES_KEPT = 100
#: Batch statistics kept for progress events that have not arrived yet.
STATS_KEPT = 100


#: data_dir -> the last batch's status written by a listener of this process (with ``totals``)
_LATEST: dict[str, dict] = {}
#: callables given each batch's status dict in this process (``bridge.metrics``)
BATCH_OBSERVERS: list = []


def latest_status(data_dir: Path | str) -> dict | None:
    """The last batch's status a listener of this process wrote for ``data_dir`` (None before one)."""
    return _LATEST.get(str(data_dir))


def lag(end: Mapping[str, int] | None, log_end: Mapping[str, int]) -> int:
    """Records in the log not yet processed: sum over partitions of log end - end offset."""
    end = end or {}
    return sum(max(0, int(n) - int(end.get(str(p), 0))) for p, n in log_end.items())


def committed_offsets(checkpoint: str | Path) -> tuple[int | None, dict[str, int] | None]:
    """(batch id, source end offsets) of the last batch the checkpoint committed."""
    cp = Path(checkpoint)
    commits = [int(p.name) for p in (cp / "commits").glob("[0-9]*")] if (cp / "commits").is_dir() else []
    if not commits:
        return None, None
    batch = max(commits)
    return batch, offset_log_entry(cp, batch)


def format_line(d: Mapping) -> str:
    """The progress line of one batch (a status-file dict)."""
    return (f"batch {d['batch_id']}: {d['input_rows']} rows, {d['rows_per_s']:.0f} rows/s, "
            f"{d['duration_ms']} ms; retained +{d['retained_upserts']}/-{d['retained_deletes']}; "
            f"quarantined {d['quarantined']}; forwarded {d['forwarded']}"
            + (f" (expired {d['forward_expired']})" if d.get("forward_expired") else "")
            + f"; lag {d['lag']}")


def read_status(data_dir: str | Path) -> dict | None:
    p = Path(data_dir) / STATUS_FILE
    return json.loads(p.read_text()) if p.exists() else None


def current_failure(data_dir: str | Path, status: Mapping | None = None) -> dict | None:
    """The failure going on now, or None: ``{"since", "cause", "time", "failures"}``
    (``failures``: failed batch runs, 0 while only the forwarders report trouble).

    Joins the status file's ``failure`` (the query failed), the executors'
    trouble files reported after the last completed batch (forwarders
    retrying) and the live forwarder's failure (``bridge.amqp.live``): ``since`` is the earliest, ``cause`` the latest report's."""
    from bridge.amqp.trouble import read_troubles

    status = status if status is not None else read_status(data_dir)
    status = status or {}
    seen = []
    if status.get("failure"):
        seen.append(status["failure"])
    seen += [{"since": t["since"], "cause": f"forwarding: {t['cause']}", "time": t["time"]}
             for t in read_troubles(data_dir, after=float(status.get("time", 0) or 0))]
    from bridge.amqp.live import read_live_status

    live = read_live_status(data_dir)  # the live forwarder's (amqp.forward_by): batches do not end it
    if live and live.get("failure"):
        seen.append(live["failure"])
    if not seen:
        return None
    latest = max(seen, key=lambda f: f["time"])
    return {"since": min(f["since"] for f in seen), "cause": latest["cause"], "time": latest["time"],
            "failures": int(status.get("failure", {}).get("failures", 0) if status.get("failure") else 0)}


def format_failure(f: Mapping, now: float | None = None) -> str:
    """``lakegate status``'s failure line."""
    now = time.time() if now is None else now
    since = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(f["since"]))
    runs = f" ({f['failures']} failed batch run{'s' if f['failures'] != 1 else ''})" if f.get("failures") else ""
    seen = f", last reported {now - f['time']:.0f}s ago" if now - f["time"] >= 1 else ""
    return f"FAILING since {since} ({now - f['since']:.0f}s{seen}){runs}: {f['cause']}"


def _listener_base():
    from bridge.spark.listener import JsonEventListener  # progress as one JSON string per batch

    return JsonEventListener


class ProgressListener(_listener_base()):  # type: ignore[misc]
    """StreamingQueryListener (driver side). ``log_end()`` returns the capture
    log's next offset per partition (``{"0": n, ...}``); ``checkpoint``: the
    query's checkpoint (events of other queries on the session are ignored;
    None reports every query)."""

    def __init__(self, data_dir: str | Path, log_end: Callable[[], Mapping[str, int]],
                 checkpoint: str | Path | None = None) -> None:
        super().__init__()
        self.data_dir = Path(data_dir)
        self.log_end = log_end
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self._query_id: str | None = None
        self._stats: dict[int, BatchStats] = {}
        #: the highest batch id reported (batch ids only grow along a checkpoint)
        self.last_batch = -1
        #: the query currently running (``shutdown`` catches up on its progress)
        self.query = None
        #: totals since this listener started (this job process, across query restarts)
        self.totals = {"batches": 0, "input_rows": 0, "messages": 0, "quarantined": 0, "forwarded": 0,
                       "forward_expired": 0, "retained_upserts": 0, "retained_deletes": 0,
                       "forward_unforwardable": 0}
        self.quarantined_by_rule: dict[str, int] = {}
        self._lock = threading.Lock()
        #: the last LINES_KEPT progress lines
        self.lines: deque[str] = deque(maxlen=LINES_KEPT)
        #: the failure since the last completed batch (``record_failure``), else None
        self.failure: dict | None = None
        #: set by ``lakegate run``'s supervisor, which logs a failed query itself
        self.supervised = False
        #: run ids whose end the listener bus delivered / that ``ended`` logged itself
        self._ended: set[str] = set()
        self._ended_here: set[str] = set()
        self._ended_cv = threading.Condition(self._lock)

    def record(self, stats: BatchStats) -> None:
        """Called by the batch step (same driver process) before Spark reports progress."""
        with self._lock:
            self._stats[stats.batch_id] = stats
            for old in [b for b in self._stats if b < stats.batch_id - STATS_KEPT]:
                del self._stats[old]

    def _mine(self, query_id: object) -> bool:
        """Whether an event belongs to this listener's query (the id in the
        checkpoint's metadata; read again when another id shows up, in case
        the checkpoint was made anew)."""
        if self.checkpoint is None or str(query_id) == self._query_id:
            return True
        try:
            current = query_id_from_checkpoint(self.checkpoint)
        except (OSError, ValueError, KeyError):  # not written yet: not our query's event
            return False
        if current != self._query_id:
            with self._lock:
                self._query_id, self.last_batch = current, -1  # a new checkpoint starts at batch 0
        return str(query_id) == current

    def onQueryStarted(self, event) -> None:
        if self._mine(event.id):
            log.info("query started: id=%s run=%s name=%s", event.id, event.runId, event.name)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        if not self._mine(event.id):
            return
        with self._lock:
            if str(event.runId) in self._ended_here:  # ended() has said it already
                return
        self._log_end(event)
        with self._ended_cv:  # after the line: ended() may let the driver exit
            self._ended.add(str(event.runId))
            self._ended_cv.notify_all()

    def _log_end(self, event) -> None:
        if event.exception and is_stop_requested(event.exception):
            log.info("query stopped before its next batch (stop requested)")
        elif event.exception:
            from bridge.job.failures import root_cause

            cause = root_cause(event.exception)
            # under `lakegate run` the supervisor logs the failure, with its restart, in one line
            level = logging.DEBUG if self.supervised else logging.ERROR
            log.log(level, "query terminated with error: %s", cause[:500])
            self.record_failure(cause)
        else:
            log.info("query stopped")

    def ended(self, run_id, timeout: float = 5.0) -> None:
        """The query ended without an error (stopped, or ``--once`` done): wait
        up to ``timeout`` for the asynchronous listener bus to log its end,
        else log "query stopped" here, once. A driver that exits right after
        (spark-submit) would otherwise lose the line to the race."""
        qid = str(run_id)
        with self._ended_cv:
            if self._ended_cv.wait_for(lambda: qid in self._ended, timeout):
                return
            self._ended_here.add(qid)
        log.info("query stopped")

    def record_failure(self, cause: str) -> None:
        """Add the failure to the status file (kept until a batch completes)."""
        from bridge.amqp.trouble import read_troubles

        now = time.time()
        with self._lock:
            last = read_status(self.data_dir) or {}
            # a job started again (lakegate process under a scheduler) continues the file's failure
            prev = self.failure or last.get("failure")
            since = prev["since"] if prev else now
            for t in read_troubles(self.data_dir, after=float(last.get("time", 0) or 0)):
                since = min(since, float(t["since"]))
            self.failure = {"since": since, "cause": cause[:1000], "failures": (prev or {}).get("failures", 0) + 1,
                            "time": now}
            last["failure"] = dict(self.failure)
            self._save(last)

    def onQueryProgress(self, event) -> None:
        self.report(event.progress)

    def catch_up(self, query=None) -> None:
        """Report progress events the asynchronous listener bus has not
        delivered yet (a ``--once`` query can end before they arrive)."""
        query = query if query is not None else self.query
        if query is None:
            return
        for p in query.recentProgress or []:
            self.report(p)

    def report(self, p) -> None:
        """Log one line for a StreamingQueryProgress and write the status file
        (once per batch id; only batches after the last one reported)."""
        if not self._mine(p.id):
            return
        with self._lock:
            if p.batchId <= self.last_batch:
                return
            self.last_batch = p.batchId
            st = self._stats.pop(p.batchId, None)
            for old in [b for b in self._stats if b < p.batchId]:
                del self._stats[old]
            if p.numInputRows == 0 and st is None:
                return
            self._write(p, st)

    def _write(self, p, st: BatchStats | None) -> None:
        end = {}
        if p.sources:
            try:
                from bridge.spark.kafka_source import partition_offsets

                end = partition_offsets(json.loads(p.sources[0].endOffset or "{}"))  # Kafka's nested by topic
            except (TypeError, ValueError, AttributeError):
                end = {}
        try:
            current_lag = lag(end, self.log_end())
        except Exception:  # the log may be unreadable for a moment (retention); the line still goes out
            current_lag = -1
        t = st.tables if st else None
        d = {
            "batch_id": p.batchId, "input_rows": p.numInputRows,
            "rows_per_s": float(p.processedRowsPerSecond or 0.0), "duration_ms": int(p.batchDuration or 0),
            "retained_upserts": t.retained_upserts if t else 0, "retained_deletes": t.retained_deletes if t else 0,
            "quarantined": t.quarantined if t else 0, "messages": t.messages if t else 0,
            "forwarded": st.forwarded if st else 0, "forward_expired": st.forward_expired if st else 0,
            "lag": current_lag, "end_offsets": end, "query_id": str(p.id), "time": time.time(),
            "forward_unforwardable": st.forward_unforwardable if st else 0,
            "quarantined_by_rule": dict(t.quarantined_by_rule) if t else {},
        }
        for k in self.totals:
            self.totals[k] += 1 if k == "batches" else int(d.get(k, 0) or 0)
        for rule, n in d["quarantined_by_rule"].items():
            self.quarantined_by_rule[rule] = self.quarantined_by_rule.get(rule, 0) + n
        d["totals"] = dict(self.totals)
        d["totals_quarantined_by_rule"] = dict(self.quarantined_by_rule)
        line = format_line(d)
        self.lines.append(line)
        if self.failure is not None:
            n = self.failure["failures"]
            log.info("%s (recovered: failing since %s, %d failed batch run%s)", line,
                     time.strftime("%H:%M:%S", time.localtime(self.failure["since"])), n, "s" if n != 1 else "")
        else:
            log.info("%s", line)
        from bridge.amqp.trouble import clear_troubles

        clear_troubles(self.data_dir)  # a batch completed: whatever the forwarders reported is over
        self.failure = None
        self._save(d)
        _LATEST[str(self.data_dir)] = dict(d)
        for observe in list(BATCH_OBSERVERS):
            try:
                observe(d)
            except Exception:  # a metrics observer must never fail the batch's bookkeeping
                log.debug("batch observer failed", exc_info=True)

    def _save(self, d: Mapping) -> None:
        tmp = self.data_dir / (STATUS_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(d))
            os.replace(tmp, self.data_dir / STATUS_FILE)
        except OSError as exc:
            log.warning("could not write %s: %s", STATUS_FILE, exc)
