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

from bridge.job.batch import BatchStats, is_stop_requested, query_id_from_checkpoint

__all__ = ["ProgressListener", "committed_offsets", "format_line", "lag", "read_status"]

log = logging.getLogger("bridge.job.progress")

STATUS_FILE = "job-status.json"
#: Progress lines the listener keeps in memory (``ProgressListener.lines``).
LINES_KEPT = 100
#: Batch statistics kept for progress events that have not arrived yet.
STATS_KEPT = 100


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
    lines = (cp / "offsets" / str(batch)).read_text().splitlines()
    # v1 / metadata / one line per source
    return batch, json.loads(lines[2]) if len(lines) > 2 and lines[2] not in ("-", "") else {}


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


def _listener_base():
    from pyspark.sql.streaming import StreamingQueryListener

    return StreamingQueryListener


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
                       "forward_expired": 0, "retained_upserts": 0, "retained_deletes": 0}
        self._lock = threading.Lock()
        #: the last LINES_KEPT progress lines
        self.lines: deque[str] = deque(maxlen=LINES_KEPT)

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
        if event.exception and is_stop_requested(event.exception):
            log.info("query stopped before its next batch (stop requested)")
        elif event.exception:
            from bridge.job.runner import root_cause

            log.error("query terminated with error: %s", root_cause(event.exception)[:500])
        else:
            log.info("query stopped")

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
                end = json.loads(p.sources[0].endOffset or "{}")
            except (TypeError, ValueError):
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
        }
        for k in self.totals:
            self.totals[k] += 1 if k == "batches" else int(d.get(k, 0) or 0)
        d["totals"] = dict(self.totals)
        line = format_line(d)
        self.lines.append(line)
        log.info("%s", line)
        tmp = self.data_dir / (STATUS_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(d))
            os.replace(tmp, self.data_dir / STATUS_FILE)
        except OSError as exc:
            log.warning("could not write %s: %s", STATUS_FILE, exc)
