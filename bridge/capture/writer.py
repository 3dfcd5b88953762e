"""CaptureLog: the capture log's writer (the edge's side).

Thread-based and event-loop agnostic. ``append`` assigns the partition,
offset and capture sequence at once and returns an :class:`Ack`; one
background *flusher* thread writes the appended records in group commits and
fsyncs them, then completes the acks of the whole group together::

    log = CaptureLog.open(config.capture_dir, config.capture)   # recovers torn tails
    ack = log.append(conn_id, key=client_id, value=frame, headers=[("conn_id", b"c1"), ...])
    ack.offset, ack.partition, ack.seq      # known at once
    ack.wait(timeout=5)                     # returns once fsynced; raises CaptureWriteError
    await ack.wait_async()                  # the same from asyncio
    log.close()                             # fsyncs everything

Group commit: the flusher commits what is pending at once when the last
commit started ``fsync_interval_ms`` or more ago (a record appended after a
quiet moment waits for one fsync only), otherwise when that interval is
over: at most one commit per interval, each taking what arrived meanwhile.
It commits early when ``fsync_records`` records are pending (and on
``flush()``/``close()``, or when an append waits for room). Durable means fsynced (``fdatasync``): it
survives SIGKILL of this process and a power cut of an honest disk.

Back-pressure: records count as pending from ``append`` until durable. An
append that would take the pending bytes above ``max_pending_bytes`` waits
(the caller, e.g. the edge, stops reading sockets), so memory stays bounded.

Failure: when a write or fsync fails (disk full, I/O error), every append
that was not yet durable fails with :class:`CaptureWriteError`, and so does
every later append: nothing depending on it may be acknowledged. The log
must be closed and reopened, which recovers from what is on disk (after an
fsync error the page cache cannot be trusted, so there is no retry).

Only one process may write a log directory (``writer.lock``, flock).

One piece: :class:`CaptureLog` is one protocol between the appending
threads and the flusher over shared state -- ``_lock`` with its ``_room``
condition, the open group, ``_sealed``, ``_pending_bytes``, ``_failed`` --
and its parts are correct only together: an append seals a group the
flusher takes without the lock, a commit frees the room appends wait for, a
failure fails every sealed group and every later append, and ``close``
seals, joins the flusher and publishes the durable offsets. Recovery is the
partitions' own (:mod:`bridge.capture.partition`); the record format, the
directory layout and retention have their modules.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterable

from bridge.capture.errors import (
    BackPressureTimeout,
    CaptureWriteError,
    LogClosedError,
    LogFormatError,
    LogMismatchError,
)
from bridge.capture.layout import (
    durable_path, meta_path, partition_dir, read_durable, read_meta, write_durable, write_meta,
)
from bridge.capture.partition import PartitionWriter
from bridge.capture.record import encode_headers, encode_record, record_size
from bridge.capture.retention import apply_retention
from bridge.capture.writer_base import WriterBase, take_writer_lock

__all__ = ["Ack", "CaptureLog"]

log = logging.getLogger(__name__)


class Ack:
    """The outcome of one append: where the record is, and whether it is durable.

    ``future`` is a ``concurrent.futures.Future`` shared by every record of
    the same group commit; it resolves to None once they are fsynced, or
    fails with :class:`CaptureWriteError`.
    """

    __slots__ = ("partition", "offset", "seq", "future")

    def __init__(self, partition: int, offset: int, seq: int, future: Future) -> None:
        self.partition = partition
        self.offset = offset
        self.seq = seq
        self.future = future

    def wait(self, timeout: float | None = None) -> None:
        """Block until durable. Raises CaptureWriteError when the write failed,
        TimeoutError after ``timeout`` seconds."""
        self.future.result(timeout)

    async def wait_async(self) -> None:
        """``await`` until durable, from any asyncio loop."""
        await asyncio.wrap_future(self.future)

    def done(self) -> bool:
        return self.future.done()

    def durable(self) -> bool:
        """True once fsynced (False while pending or when failed)."""
        return self.future.done() and self.future.exception() is None

    def add_done_callback(self, fn: Callable[["Ack"], None]) -> None:
        """Call ``fn(ack)`` once the ack is resolved. Runs on the flusher
        thread (or at once when already resolved): keep it short, and do not
        append from it (an append that waits for room would wait for itself)."""
        self.future.add_done_callback(lambda _f: fn(self))

    def __repr__(self) -> str:
        state = "durable" if self.durable() else ("failed" if self.done() else "pending")
        return f"Ack(partition={self.partition}, offset={self.offset}, seq={self.seq}, {state})"


class _Group:
    """Records appended since the last group commit started."""

    __slots__ = ("records", "count", "nbytes", "future")

    def __init__(self, partitions: int) -> None:
        self.records: list[list[bytes]] = [[] for _ in range(partitions)]
        self.count = 0
        self.nbytes = 0
        self.future: Future = Future()


class CaptureLog(WriterBase):
    """The capture log writer. Create with :meth:`open`; thread-safe."""

    def __init__(self, root: Path, stream: str, partitions: int, segment_bytes: int, fsync_interval_ms: float,
                 fsync_records: int, max_pending_bytes: int, retention_age_s: float, retention_bytes: int,
                 retention_check_interval_s: float) -> None:
        # Use CaptureLog.open(); this only stores settings.
        self.root = root
        self.stream = stream
        self.partitions = partitions
        self.segment_bytes = segment_bytes
        self.fsync_interval_ms = fsync_interval_ms
        self.fsync_records = fsync_records
        self.max_pending_bytes = max_pending_bytes
        self.retention_age_s = retention_age_s
        self.retention_bytes = retention_bytes
        self.retention_check_interval_s = retention_check_interval_s
        #: an append during a commit releases the GIL (``time.sleep(0)``) so
        #: that the flusher is not held up by an appender in a tight loop;
        #: an appender that releases it often by itself (the edge's event
        #: loop: every socket call) sets False and saves the system call
        self.yield_to_flusher = True
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # appends waiting for room wait here
        #: set when the flusher has work: a group was sealed or started, flush, close
        self._wake = threading.Event()
        self._parts: list[PartitionWriter] = []
        self._next_offset: list[int] = []
        self._durable: list[int] = []
        self._next_seq = 0
        self._group = _Group(partitions)  # the open group (appends go here)
        self._pcache: dict[str, int] = {}  # partition key -> partition (_partition_of)
        #: sealed groups, oldest first, waiting for the flusher; appended under
        #: _lock, popped by the flusher without it (deque ops are atomic)
        self._sealed: collections.deque[_Group] = collections.deque()
        self._last_future: Future | None = None  # of the newest sealed group
        self._pending_bytes = 0
        self._committing = False
        self._stopping = False
        self._closed = False
        self._failed: CaptureWriteError | None = None
        self._lock_fd = -1
        self._durable_fd = -1
        self._thread: threading.Thread | None = None
        #: counters: appends, commits (group commits), fsyncs, bytes written
        self.stats = {"appends": 0, "commits": 0, "fsyncs": 0, "bytes": 0, "truncated_bytes": 0}
        #: a bridge.buckets.Buckets timing each commit's fdatasync calls (None: not timed)
        self.fsync_latency = None
        #: called (no arguments, on the flusher thread, after the acks) when a
        #: commit made records durable: the live forwarder's wake-up
        #: (``bridge.amqp.live``); must be quick and must not raise
        self.on_durable: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, root: str | os.PathLike[str], config=None, **overrides) -> "CaptureLog":
        """Open (creating if needed) the log at ``root`` for writing.

        ``config``: a :class:`bridge.config.CaptureConfig` (default: its
        defaults); keyword ``overrides`` replace single settings. Recovers
        each partition (torn tails truncated with a warning; a corrupt record
        in the middle raises CorruptRecordError). Raises LogLockedError when
        another process writes this log, LogMismatchError when the partition
        count or stream name differ from the log's.
        """
        from bridge.config import CaptureConfig

        cfg = config if config is not None else CaptureConfig()
        settings = {
            "stream": cfg.stream,
            "partitions": cfg.partitions,
            "segment_bytes": cfg.segment_bytes,
            "fsync_interval_ms": cfg.fsync_interval_ms,
            "fsync_records": cfg.fsync_records,
            "max_pending_bytes": cfg.max_pending_bytes,
            "retention_age_s": cfg.retention_age_s,
            "retention_bytes": cfg.retention_bytes,
            "retention_check_interval_s": getattr(cfg, "retention_check_interval_s", 60),
        }
        unknown = set(overrides) - set(settings)
        if unknown:
            raise TypeError(f"unknown capture log settings: {', '.join(sorted(unknown))}")
        settings.update(overrides)
        for k in ("partitions", "segment_bytes", "fsync_records", "max_pending_bytes"):
            if int(settings[k]) <= 0:
                raise ValueError(f"capture.{k} must be positive, got {settings[k]}")
        for k in ("fsync_interval_ms", "retention_age_s", "retention_bytes", "retention_check_interval_s"):
            if settings[k] < 0:
                raise ValueError(f"capture.{k} must not be negative, got {settings[k]}")
        self = cls(Path(root).expanduser().resolve(), **settings)
        try:
            self._open()
        except BaseException:
            for pw in self._parts:
                pw.abandon()
            self._release()
            raise
        return self

    def _open(self) -> None:
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = take_writer_lock(root, f"capture log {root} is in use by another writer (pid {{pid}}); "
                                               "only one lakegate edge may write a capture log")

        if meta_path(root).exists():
            meta = read_meta(root)
            if meta.partitions != self.partitions:
                raise LogMismatchError(
                    f"capture.partitions is {self.partitions} but the capture log at {root} was created with "
                    f"{meta.partitions} partitions; the partition count of an existing log cannot change "
                    f"(connections would move between partitions). Set capture.partitions = {meta.partitions}, "
                    "or use a new data_dir")
            if meta.stream != self.stream:
                raise LogMismatchError(
                    f"capture.stream is {self.stream!r} but the capture log at {root} was created as "
                    f"{meta.stream!r}; the stream name of an existing log cannot change. Set "
                    f"capture.stream = {meta.stream!r}, or use a new data_dir")
        else:
            stray = sorted(p.name for p in root.iterdir() if p.name.startswith("p") and p.is_dir())
            if stray:
                raise LogFormatError(f"{root} holds partition directories ({', '.join(stray)}) but no meta.json; "
                                     "refusing to guess the partition count")
            write_meta(root, self.stream, self.partitions)
            log.info("capture log created at %s: stream %s, %d partitions", root, self.stream, self.partitions)

        seq_floor = 0
        # the high watermarks the last writer published (None: no file yet, or
        # a damaged one -- then every tail problem counts as torn, as before)
        durable_ends = read_durable(root, self.partitions) or [0] * self.partitions
        for p in range(self.partitions):
            pw = PartitionWriter(partition_dir(root, p), p, self.segment_bytes)
            rec = pw.recover(durable_ends[p])
            if rec is not None:
                seq_floor = max(seq_floor, rec.seq_floor)
                self.stats["truncated_bytes"] += rec.truncated_bytes
            self._parts.append(pw)
        for pw in self._parts:
            if not pw.has_active:
                pw.create_first(seq_floor)
        self._next_seq = seq_floor
        self._next_offset = [pw.next_offset for pw in self._parts]
        self._durable = list(self._next_offset)
        self._durable_fd = os.open(durable_path(root), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        write_durable(self._durable_fd, self._durable)
        os.fsync(self._durable_fd)
        log.info("capture log opened at %s: %d partitions, next offsets %s, next seq %d",
                 root, self.partitions, self._next_offset, self._next_seq)
        self._thread = threading.Thread(target=self._flusher, name="capture-flusher", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- append
    def append(self, partition_key: str, key: bytes, value: bytes,
               headers: Iterable[tuple[str, bytes]] = (), timestamp_us: int | None = None,
               timeout: float | None = None) -> Ack:
        """Append one record; returns its :class:`Ack` at once (not yet durable).

        ``partition_key``: the connection id (all records of a connection go
        to one partition, in append order). ``key``: the MQTT client id;
        ``value``: the raw frame; ``headers``: (key, bytes) pairs with keys
        from ``schemas.capture.HEADER_KEYS`` (the log adds ``seq``).
        ``timestamp_us``: receive time (default: now).

        Blocks while the pending (not yet durable) bytes are above
        ``max_pending_bytes``; ``timeout`` (seconds) bounds that wait and
        raises BackPressureTimeout (``timeout=0``: never wait). Raises
        CaptureWriteError after a write failure, LogClosedError after close.
        """
        if not isinstance(key, (bytes, bytearray)) or not isinstance(value, (bytes, bytearray)):
            raise TypeError("capture append: key and value must be bytes")
        hblob, hcount = encode_headers(headers)
        ts = time.time_ns() // 1000 if timestamp_us is None else int(timestamp_us)
        p = self._partition_of(partition_key)
        with self._lock:
            self._check_writable()
            ack = self._append_locked(p, ts, key, value, hblob, hcount, timeout)
        if self._committing and self.yield_to_flusher:
            # The flusher is between system calls of a commit and needs the
            # GIL back after each one; a caller appending in a tight loop
            # would make it wait a whole switch interval (5 ms) every time.
            time.sleep(0)
        return ack

    def append_many(self, partition_key: str, key: bytes,
                    items: list[tuple[bytes, Iterable[tuple[str, bytes]]]],
                    timeout: float | None = None) -> list[Ack]:
        """Append several records of one connection (``items``: (value,
        headers) pairs) as :meth:`append` would one by one, in order, taking
        the lock once (the edge appends a chunk's acknowledgements so)."""
        if not isinstance(key, (bytes, bytearray)):
            raise TypeError("capture append: key and value must be bytes")
        encoded = []
        for value, headers in items:
            if not isinstance(value, (bytes, bytearray)):
                raise TypeError("capture append: key and value must be bytes")
            encoded.append((value, *encode_headers(headers)))
        ts = time.time_ns() // 1000
        p = self._partition_of(partition_key)
        with self._lock:
            self._check_writable()
            acks = [self._append_locked(p, ts, key, v, hb, hc, timeout) for v, hb, hc in encoded]
        if self._committing and self.yield_to_flusher:
            time.sleep(0)  # (see append)
        return acks

    def _append_locked(self, p: int, ts: int, key: bytes, value: bytes, hblob: bytes, hcount: int,
                       timeout: float | None) -> Ack:
        size = record_size(key, value, hblob)
        if self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
            self._wait_for_room(size, timeout)
        offset = self._next_offset[p]
        seq = self._next_seq
        rec = encode_record(offset, seq, ts, bytes(key), bytes(value), hblob, hcount)
        self._next_offset[p] = offset + 1
        self._next_seq = seq + 1
        g = self._group
        g.records[p].append(rec)
        g.count += 1
        g.nbytes += size
        self._pending_bytes += size
        self.stats["appends"] += 1
        if g.count == 1:
            self._wake.set()  # the flusher commits it, at once or when the interval is over
        if g.count >= self.fsync_records:
            self._seal_locked()
        return Ack(p, offset, seq, g.future)

    def _seal_locked(self) -> None:
        """Hand the open group to the flusher (caller holds _lock)."""
        g = self._group
        if g.count:
            self._group = _Group(self.partitions)
            self._sealed.append(g)
            self._last_future = g.future
            self._wake.set()

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise CaptureWriteError(f"capture log {self.root} failed earlier and must be reopened: {self._failed}")
        if self._stopping or self._closed:
            raise LogClosedError(f"capture log {self.root} is closed")

    def _wait_for_room(self, size: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        # No point waiting out the group commit interval: the disk is the limit.
        self._seal_locked()
        self._wait_below_max_pending(size, deadline, "capture log", "the disk")

    def has_room(self, nbytes: int = 0) -> bool:
        """True when an append of ``nbytes`` would not wait for the disk."""
        with self._lock:
            return not self._pending_bytes or self._pending_bytes + nbytes <= self.max_pending_bytes

    def wait_for_room(self, nbytes: int = 0, timeout: float | None = None) -> bool:
        """Block until an append of ``nbytes`` would not wait; False on timeout.
        (For an asyncio caller: ``await asyncio.to_thread(log.wait_for_room, n)``.)"""
        with self._lock:
            try:
                if self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                    self._wait_for_room(nbytes, timeout)
            except BackPressureTimeout:
                return False
            return True

    # ----------------------------------------------------- flush and close
    def flush(self, timeout: float | None = None) -> None:
        """Commit everything appended so far now and wait until it is durable."""
        with self._lock:
            self._check_writable()
            self._seal_locked()
            fut = self._last_future
        if fut is not None:
            fut.result(timeout)

    def close(self) -> None:
        """Commit and fsync everything pending, stop the flusher, release the
        lock. Idempotent. Appends after close raise LogClosedError."""
        with self._lock:
            if self._closed:
                return
            self._stopping = True
            self._seal_locked()
            self._wake.set()
            self._room.notify_all()
        if self._thread is not None:
            self._thread.join()
        try:
            if self._failed is None:
                for pw in self._parts:
                    pw.close()
                write_durable(self._durable_fd, self._durable)
                os.fsync(self._durable_fd)
            else:
                for pw in self._parts:
                    pw.abandon()
        finally:
            self._release()
            with self._lock:
                self._closed = True
        log.info("capture log closed: %d appends, %d group commits, %d fsyncs",
                 self.stats["appends"], self.stats["commits"], self.stats["fsyncs"])

    def _release(self) -> None:
        for name in ("_durable_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)  # closing the lock file releases the flock
                except OSError:
                    pass
                setattr(self, name, -1)

    # ------------------------------------------------------------- state
    def __repr__(self) -> str:
        return f"CaptureLog({str(self.root)!r}, partitions={self.partitions})"

    # ------------------------------------------------------------ flusher
    def _flusher(self) -> None:
        try:
            self._flusher_loop()
        except BaseException as exc:  # a bug must not leave acks hanging forever
            log.exception("capture log flusher stopped unexpectedly")
            self._fail([], [], exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    def _flusher_loop(self) -> None:
        """The one thread that writes and fsyncs, and applies retention.

        Takes sealed groups without the append lock, so a busy appender
        cannot starve it; seals the open group itself when its interval is
        over (``fsync_interval_ms`` after the last commit started)."""
        interval_ns = int(self.fsync_interval_ms * 1_000_000)
        last_ns = time.monotonic_ns() - interval_ns  # start of the last commit
        next_retention = time.monotonic()
        while True:
            self._wake.clear()
            if not self._sealed:
                g = self._group
                if g.count:
                    remaining = last_ns + interval_ns - time.monotonic_ns()
                    if remaining > 0 and not self._stopping:
                        self._wake.wait(remaining / 1e9)
                        continue
                    with self._lock:
                        if self._group is g:
                            self._seal_locked()
                    continue
                if self._stopping:
                    return
                wait = next_retention - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
            groups = []
            while self._sealed:
                groups.append(self._sealed.popleft())
            if groups:
                last_ns = time.monotonic_ns()
                if not self._commit(groups):
                    return
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + max(self.retention_check_interval_s, 0.001)
                self.apply_retention()

    def _commit(self, groups: list[_Group]) -> bool:
        """Write the groups' records, fsync each touched partition once,
        publish the durable offsets, then complete the groups' acks."""
        touched: list[int] = []
        self._committing = True
        try:
            for p in range(self.partitions):
                recs = [r for g in groups for r in g.records[p]] if len(groups) > 1 else groups[0].records[p]
                if recs:
                    touched.append(p)
                    self._parts[p].write(recs)
            t_sync = time.monotonic()
            for p in touched:
                self._parts[p].sync()
            if self.fsync_latency is not None and touched:
                self.fsync_latency.observe(time.monotonic() - t_sync)
            self.stats["fsyncs"] += len(touched)
            durable = list(self._durable)
            for p in touched:
                durable[p] = self._parts[p].next_offset
            write_durable(self._durable_fd, durable)
        except Exception as exc:  # OSError, and anything unexpected: no ack may hang or lie
            self._committing = False
            self._fail(groups, touched, exc)
            return False
        self._committing = False
        nbytes = sum(g.nbytes for g in groups)
        self.stats["commits"] += 1
        self.stats["bytes"] += nbytes
        with self._lock:
            self._durable = durable
            self._pending_bytes -= nbytes
            self._room.notify_all()
        for g in groups:
            g.future.set_result(None)
        for fn in self.on_durable:
            fn()
        return True

    def _fail(self, groups: list[_Group], touched: list[int], exc: Exception) -> None:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        count = sum(g.count for g in groups)
        err = CaptureWriteError(f"capture log write failed: {what}; {count} appended records are not durable")
        err.__cause__ = exc
        for p in touched:
            self._parts[p].rollback_unsynced()
        with self._lock:
            self._failed = err
            self._seal_locked()
            later = list(self._sealed)
            self._sealed.clear()
            self._room.notify_all()
        log.error("capture log %s: write failed (%s); failing %d pending appends; reopen the log",
                  self.root, what, count + sum(g.count for g in later))
        for g in groups + later:
            g.future.set_exception(err)

    def apply_retention(self):
        """Apply the retention policy now (the flusher also does every
        ``retention_check_interval_s``). Errors are logged, not raised."""
        try:
            return apply_retention(self.root, self.partitions, self.retention_age_s, self.retention_bytes)
        except Exception as exc:  # retention must never stop the log
            log.error("capture retention failed: %s", exc)
            return None
