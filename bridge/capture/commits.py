"""Consumer-committed offsets: what the consumers have processed.

Each consumer (the Spark source's ``consumer`` option, default ``spark``)
has ``consumers/<name>.json``::

    {"consumer": "spark", "offsets": {"0": 123, "1": 45}, "updated_us": ...}

An offset is the next offset the consumer will read: every record below it
has been processed. The file is replaced atomically (temp file, fsync,
rename, fsync directory), so it is either the old or the new content.
Retention deletes only below the minimum over all consumers; a partition a
consumer file does not mention counts as committed up to nothing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Mapping

from bridge.capture.layout import atomic_write

__all__ = ["CONSUMER_NAME", "commit_offsets", "committed_floor", "hold_offsets", "read_commits",
           "remove_consumer"]

CONSUMER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _dir(root: Path, kind: str = "consumers") -> Path:
    return root / kind


def _check_name(name: str) -> None:
    if not CONSUMER_NAME.match(name):
        raise ValueError(f"consumer name {name!r}: use letters, digits, '.', '_' and '-' (at most 100)")


def commit_offsets(root: Path, consumer: str, offsets: Mapping[int | str, int]) -> None:
    """Record that ``consumer`` has processed every record below ``offsets``
    (partition -> next offset). Last write wins: a consumer reset to earlier
    offsets commits earlier offsets and so protects what it will re-read."""
    _check_name(consumer)
    d = _dir(root)
    d.mkdir(exist_ok=True)
    body = {
        "consumer": consumer,
        "offsets": {str(int(p)): int(o) for p, o in sorted(offsets.items(), key=lambda kv: int(kv[0]))},
        "updated_us": time.time_ns() // 1000,
    }
    atomic_write(d / f"{consumer}.json", (json.dumps(body) + "\n").encode())


def hold_offsets(root: Path, holder: str, offsets: Mapping[int | str, int]) -> None:
    """Keep every record at or above ``offsets`` (partition -> offset) from
    retention, for ``holder`` (``holds/<holder>.json``, same format as a
    commit). Unlike a consumer, a hold never lets anything be deleted by
    itself: with no consumer nothing is deleted at all. The edge holds the
    records its persistent sessions still need (``bridge.edge.persist``)."""
    _check_name(holder)
    d = _dir(root, "holds")
    d.mkdir(exist_ok=True)
    body = {
        "holder": holder,
        "offsets": {str(int(p)): int(o) for p, o in sorted(offsets.items(), key=lambda kv: int(kv[0]))},
        "updated_us": time.time_ns() // 1000,
    }
    atomic_write(d / f"{holder}.json", (json.dumps(body) + "\n").encode())


def read_commits(root: Path, kind: str = "consumers") -> dict[str, dict[int, int]]:
    """consumer -> {partition: committed next offset} (``kind="holds"``: the
    holds). An unreadable file counts as committed nothing (retention then
    keeps everything)."""
    out: dict[str, dict[int, int]] = {}
    d = _dir(root, kind)
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        name = f.stem
        try:
            body = json.loads(f.read_text())
            out[name] = {int(p): int(o) for p, o in body["offsets"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            out[name] = {}
    return out


def committed_floor(root: Path, partitions: int) -> list[int]:
    """Per partition, the minimum committed offset over all consumers and
    holds; 0 when there is no consumer (nothing may be deleted)."""
    commits = read_commits(root)
    if not commits:
        return [0] * partitions
    every = list(commits.values()) + list(read_commits(root, "holds").values())
    return [min(c.get(p, 0) for c in every) for p in range(partitions)]


def remove_consumer(root: Path, consumer: str) -> bool:
    """Forget a consumer (its commits stop holding back retention)."""
    _check_name(consumer)
    try:
        (_dir(root) / f"{consumer}.json").unlink()
        return True
    except FileNotFoundError:
        return False
