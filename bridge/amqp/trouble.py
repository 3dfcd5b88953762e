"""Forwarding trouble seen on the executors, for ``lakegate status``.

A task's Forwarder retries for a while (``amqp.max_retries`` with backoff)
before the batch fails, and only then does the driver hear of it. So that
``lakegate status`` shows an outage while it lasts, the sink writes, at a
task's first failed attempt and then at most once a second while attempts
keep failing, one small JSON file
per Python worker process: ``<data_dir>/forward-trouble/<host>-<pid>.json``
= ``{"cause", "since", "time", "host", "pid"}`` (``since``: epoch seconds of
the first failed attempt; ``time``: of this report). The worker removes its
file when a task of its forwards without failing; the driver removes them all
when a batch completes (``bridge.job.progress``). A file older than the last
completed batch is stale (its worker is gone) and not shown.

Runs on executors (writing) and on the driver / ``lakegate status`` (reading).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from bridge.capture.layout import atomic_write

__all__ = ["TROUBLE_DIR", "TroubleFile", "clear_troubles", "read_troubles"]

TROUBLE_DIR = "forward-trouble"


class TroubleFile:
    """This process's trouble file under ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(data_dir) / TROUBLE_DIR
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.path = self.dir / f"{self.host}-{self.pid}.json"

    def write(self, cause: str, since: float) -> None:
        """Record the current trouble (atomically: a reader sees the old or the new file)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps({"cause": cause, "since": since, "time": time.time(),
                                            "host": self.host, "pid": self.pid}).encode())

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def read_troubles(data_dir: str | os.PathLike[str], after: float = 0.0) -> list[dict]:
    """The trouble files reported after ``after`` (epoch seconds), oldest first."""
    d = Path(data_dir) / TROUBLE_DIR
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            t = json.loads(p.read_text())
        except (OSError, ValueError):  # removed or replaced meanwhile
            continue
        if float(t.get("time", 0)) > after:
            out.append(t)
    return sorted(out, key=lambda t: t["since"])


def clear_troubles(data_dir: str | os.PathLike[str]) -> None:
    """Remove every trouble file (the driver, once a batch completed)."""
    d = Path(data_dir) / TROUBLE_DIR
    for p in d.glob("*.json") if d.is_dir() else []:
        p.unlink(missing_ok=True)
