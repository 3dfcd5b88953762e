"""What both capture log writers share (the local :class:`~bridge.capture.writer.CaptureLog`
and :class:`~bridge.capture.kafka_log.KafkaCaptureLog`): the ``writer.lock``
that makes one process the writer of a data_dir, the partition of a
connection, and the state readers of the writer ask for. No I/O but the
lock file."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from bridge.capture.errors import BackPressureTimeout, CaptureWriteError, LogLockedError
from bridge.capture.record import partition_for

__all__ = ["WriterBase", "take_writer_lock"]


def take_writer_lock(root: Path, refusal: str) -> int:
    """Open and flock ``root/writer.lock`` (the file descriptor; closing it
    releases the lock), with this process's pid in it. LogLockedError when
    another process holds it: ``refusal`` with the holder's pid for ``{pid}``."""
    fd = os.open(root / "writer.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LogLockedError(refusal.format(pid=holder)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class WriterBase:
    """The writer state both logs keep under ``_lock``: the next and the
    durable offset per partition, the next capture sequence, the failure;
    and ``_partition_of`` with its cache. Subclasses set these attributes."""

    partitions: int
    _lock: threading.Lock
    _next_offset: list[int]
    _durable: list[int]
    _next_seq: int
    _failed: CaptureWriteError | None
    _pcache: dict[str, int]
    _room: threading.Condition
    _pending_bytes: int
    max_pending_bytes: int
    #: the partitions this writer may append to (a cluster edge's own); None: all
    own: list[int] | None = None

    def _partition_of(self, partition_key: str) -> int:
        """:func:`partition_for` (among :attr:`own` when set), remembered for the last few thousand keys
        (a connection appends under one key many times)."""
        cache = self._pcache
        p = cache.get(partition_key)
        if p is None:
            if len(cache) >= 4096:
                cache.clear()
            own = self.own
            p = cache[partition_key] = (partition_for(partition_key, self.partitions) if own is None
                                        else own[partition_for(partition_key, len(own))])
        return p

    @property
    def failed(self) -> CaptureWriteError | None:
        """The error that stopped the log, or None (on Kafka its
        ``unavailable`` attribute says whether Kafka did not answer: a
        reopen succeeds once it is back)."""
        return self._failed

    def next_offsets(self) -> list[int]:
        """Per partition, the offset the next append will get."""
        with self._lock:
            return list(self._next_offset)

    def durable_offsets(self) -> list[int]:
        """Per partition, the offset below which every record is durable
        (fsynced; on Kafka, confirmed)."""
        with self._lock:
            return list(self._durable)

    @property
    def next_seq(self) -> int:
        with self._lock:
            return self._next_seq

    def _wait_below_max_pending(self, size: int, deadline: float | None, log_name: str, waiting_for: str) -> None:
        """With ``_lock`` held: wait on ``_room`` until ``size`` more bytes fit
        under ``max_pending_bytes`` (or nothing is pending); BackPressureTimeout
        past ``deadline`` (``log_name``, ``waiting_for``: the log and what the
        bytes wait for, in its message); a failure while waiting raises it."""
        while self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise BackPressureTimeout(
                    f"{log_name}: {self._pending_bytes} bytes are waiting for {waiting_for} (max_pending_bytes "
                    f"{self.max_pending_bytes}); append of {size} bytes timed out")
            self._room.wait(remaining)
            self._check_writable()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - each writer's own
        raise NotImplementedError
