"""Retention: delete old segments the consumers have processed.

A segment may be deleted only when it is **wholly below the offset every
consumer has committed** (its last offset is below the minimum committed
offset, see :mod:`bridge.capture.commits`) and it is not a partition's
active (last) segment. Among those, a segment is deleted when it is older
than ``retention_age_s`` (by its file's modification time, i.e. its newest
record), or, oldest first across partitions, while the log's total size is
above ``retention_bytes``. Within a partition only a prefix is deleted, so a
partition's offsets stay contiguous. With no consumer, nothing is deleted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge.capture.commits import committed_floor
from bridge.capture.layout import partition_dir
from bridge.capture.segment import fsync_dir, index_path, list_segments, segment_path

__all__ = ["RetentionReport", "apply_retention"]

log = logging.getLogger(__name__)


@dataclass
class _Seg:
    partition: int
    base: int
    end: int  # next segment's base: one past this segment's last offset
    bytes: int
    mtime: float


@dataclass
class RetentionReport:
    #: (partition, base offset, end offset, bytes) of each deleted segment
    deleted: list[tuple[int, int, int, int]] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def deleted_bytes(self) -> int:
        return sum(d[3] for d in self.deleted)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def apply_retention(root: Path, partitions: int, retention_age_s: float, retention_bytes: int,
                    now: float | None = None) -> RetentionReport:
    """Delete what the policy allows; returns what was deleted."""
    now = time.time() if now is None else now
    floor = committed_floor(root, partitions)
    report = RetentionReport()
    # Per partition, the deletable prefix (eligible by commit), oldest first.
    prefixes: list[list[_Seg]] = []
    total = 0
    for p in range(partitions):
        pdir = partition_dir(root, p)
        bases = list_segments(pdir)
        prefix: list[_Seg] = []
        for i, base in enumerate(bases):
            seg = segment_path(pdir, base)
            nbytes = _size(seg) + _size(index_path(pdir, base))
            total += nbytes
            if i == len(bases) - 1:
                continue  # the active segment is never deleted
            end = bases[i + 1]
            if end <= floor[p] and len(prefix) == i:
                try:
                    mtime = seg.stat().st_mtime
                except FileNotFoundError:
                    continue
                prefix.append(_Seg(p, base, end, nbytes, mtime))
        prefixes.append(prefix)
    report.bytes_before = total

    def delete(s: _Seg) -> None:
        nonlocal total
        pdir = partition_dir(root, s.partition)
        segment_path(pdir, s.base).unlink(missing_ok=True)
        index_path(pdir, s.base).unlink(missing_ok=True)
        total -= s.bytes
        report.deleted.append((s.partition, s.base, s.end, s.bytes))
        log.info("capture retention: deleted partition %d segment %d (offsets [%d, %d), %d bytes)",
                 s.partition, s.base, s.base, s.end, s.bytes)

    # Age: each partition's prefix while its head is too old.
    for prefix in prefixes:
        while prefix and now - prefix[0].mtime > retention_age_s:
            delete(prefix.pop(0))
    # Size budget: oldest head across partitions while over budget.
    while total > retention_bytes:
        heads = [pr for pr in prefixes if pr]
        if not heads:
            break
        oldest = min(heads, key=lambda pr: pr[0].mtime)
        delete(oldest.pop(0))
    if report.deleted:
        for p in {d[0] for d in report.deleted}:
            fsync_dir(partition_dir(root, p))
    report.bytes_after = total
    return report

