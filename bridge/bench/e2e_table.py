"""``bench e2e``: publish -> ``messages`` latency, when each message of a
paced phase became visible in the job's ``messages`` table.

:class:`TableWatch` looks at the table's Delta log every ``every`` seconds
(a directory listing: no table load) and notes the time it first saw each
new version; each new version's added files (``dataChange`` true: not a
compaction's rewrite) are read at once for ``topic`` and ``payload``. A
message of the phase is recognised as :mod:`bridge.bench.e2e_load` wrote it:
its topic ends in the connection number, its payload starts with its
sequence number. Latency = the time its version was first seen minus the
time the publisher sent it: a reader polling the table every ``every``
seconds sees it no later than that. Works for any Delta writer (delta-rs or
delta-spark): only the Delta log's JSON commits and Parquet files are read.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse
from pathlib import Path

from bridge.bench.e2e_observe import percentiles

__all__ = ["TableWatch"]


class TableWatch:
    """The versions of one Delta table as a poller sees them appear."""

    def __init__(self, table_dir: Path, topic_prefix: str, every: float = 0.05) -> None:
        self.table_dir = Path(table_dir)
        self.log_dir = self.table_dir / "_delta_log"
        self.topic_prefix = topic_prefix
        self.every = every
        self.last = self._latest()  # versions up to here were there before: not the phase's
        #: (topic, sequence number, time its version was first seen: perf_counter)
        self.rows: list[tuple[str, int, float]] = []
        self.errors = 0

    def _latest(self) -> int:
        try:
            names = os.listdir(self.log_dir)
        except OSError:
            return -1
        versions = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
        return max(versions, default=-1)

    def poll(self) -> int:
        """Note the versions committed since the last poll; returns how many."""
        latest = self._latest()
        if latest <= self.last:
            return 0
        seen = time.perf_counter()
        new = range(self.last + 1, latest + 1)
        self.last = latest
        for v in new:
            try:
                self._read_version(v, seen)
            except (OSError, ValueError, KeyError):
                self.errors += 1
        return len(new)

    def _read_version(self, version: int, seen: float) -> None:
        import pyarrow.parquet as pq

        with open(self.log_dir / f"{version:020d}.json", encoding="utf-8") as f:
            actions = [json.loads(line) for line in f if line.strip()]
        for a in actions:
            add = a.get("add")
            if not add or not add.get("dataChange", True):
                continue
            path = self.table_dir / urllib.parse.unquote(add["path"])
            t = pq.read_table(path, columns=["topic", "payload"])
            for topic, payload in zip(t.column("topic").to_pylist(), t.column("payload").to_pylist()):
                if topic and topic.startswith(self.topic_prefix) and payload and len(payload) >= 8:
                    self.rows.append((topic, int.from_bytes(payload[:8], "big"), seen))

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set (then once more)."""
        while not stop.is_set():
            self.poll()
            try:
                await asyncio.wait_for(stop.wait(), self.every)
            except asyncio.TimeoutError:
                pass
        self.poll()

    def found(self) -> int:
        return len(self.rows)

    def latency(self, phase) -> dict:
        """publish -> visible in the table, for the acknowledged messages of
        ``phase`` (a :class:`bridge.bench.e2e_load.Phase`): percentiles (ms),
        how many of them the table shows, and how many more than once."""
        base = phase.topic_base
        lat: list[float] = []
        seen: dict[tuple[int, int], int] = {}
        for topic, k, t in self.rows:
            if not topic.startswith(base):
                continue
            i = int(topic[len(base):])
            if i >= len(phase.conns) or k >= phase.conns[i].sent:
                continue
            seen[(i, k)] = seen.get((i, k), 0) + 1
            if seen[(i, k)] == 1:
                lat.append(t - phase.conns[i].send_t[k])
        acked = sum(c.acked for c in phase.conns)
        in_table = sum(1 for i, c in enumerate(phase.conns) for k in range(c.acked) if (i, k) in seen)
        return {"table_ms": percentiles(lat), "in_table": in_table, "acknowledged": acked,
                "table_duplicates": sum(n - 1 for n in seen.values()), "poll_s": self.every,
                **({"read_errors": self.errors} if self.errors else {})}
