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

__all__ = ["CONSUMER_NAME", "commit_offsets", "committed_floor", "read_commits", "remove_consumer"]

CONSUMER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _dir(root: Path) -> Path:
    return root / "consumers"


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


def read_commits(root: Path) -> dict[str, dict[int, int]]:
    """consumer -> {partition: committed next offset}. An unreadable file
    counts as committed nothing (retention then keeps everything)."""
    out: dict[str, dict[int, int]] = {}
    d = _dir(root)
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
    """Per partition, the minimum committed offset over all consumers; 0 when
    there is no consumer (nothing may be deleted)."""
    commits = read_commits(root)
    if not commits:
        return [0] * partitions
    return [min(c.get(p, 0) for c in commits.values()) for p in range(partitions)]


def remove_consumer(root: Path, consumer: str) -> bool:
    """Forget a consumer (its commits stop holding back retention)."""
    _check_name(consumer)
    try:
        (_dir(root) / f"{consumer}.json").unlink()
        return True
    except FileNotFoundError:
        return False
