"""One partition's writer side: the active segment, rolling, recovery.

Used only by :class:`bridge.capture.writer.CaptureLog`, from one thread at a
time (the opener, then the flusher thread).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from bridge.capture.errors import CorruptRecordError, LogFormatError
from bridge.capture.segment import (
    HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_INTERVAL_BYTES,
    INDEX_MAGIC,
    SEGMENT_MAGIC,
    create_segment,
    encode_file_header,
    find_valid_after,
    fsync_dir,
    index_path,
    list_segments,
    parse_file_header,
    scan_records,
    segment_path,
    write_all,
)

__all__ = ["PartitionWriter", "Recovered"]

log = logging.getLogger(__name__)
_SEQ_AT = struct.Struct("<Q")  # a record's seq is at byte 20


@dataclass(frozen=True)
class Recovered:
    """What opening a partition found."""

    partition: int
    next_offset: int
    #: the next capture sequence must be at least this
    seq_floor: int
    #: bytes of torn tail truncated (0 when the tail was clean)
    truncated_bytes: int


class PartitionWriter:
    """The active segment of one partition: appends, rolls, fsyncs."""

    def __init__(self, pdir: Path, partition: int, segment_bytes: int) -> None:
        self.pdir = pdir
        self.partition = partition
        self.segment_bytes = segment_bytes
        self.base_offset = -1
        self.next_offset = 0
        self.size = 0  # bytes in the active segment, header included
        self._fd = -1
        self._idx_fd = -1
        self._last_index_pos = 0
        self._dirty = False
        self._synced = (-1, 0)  # (base_offset, size) at the last successful sync

    # ---- opening and recovery ----
    def recover(self, durable_end: int = 0) -> Recovered | None:
        """Open the last segment, validate every record in it, truncate a torn
        tail (with a warning), rebuild its index. Returns None when the
        partition has no segment yet (call :meth:`create_first`).

        ``durable_end``: the partition's high watermark from the ``durable``
        file (written only after the segment's fsync): records below it were
        reported durable, so damage there is corruption, never a torn write.

        Raises CorruptRecordError for a damaged record that intact records
        follow or that was reported durable, LogFormatError for a damaged
        file header.
        """
        self.pdir.mkdir(parents=True, exist_ok=True)
        bases = list_segments(self.pdir)
        if not bases:
            return None
        base = bases[-1]
        path = segment_path(self.pdir, base)
        data = path.read_bytes()
        if len(data) < HEADER_SIZE:
            if base < durable_end:
                raise CorruptRecordError(self.partition, base, path, 0,
                                         f"the segment's file header is cut short at {len(data)} bytes, but "
                                         f"records up to offset {durable_end - 1} were reported durable")
            # Crash while creating the segment: it never held a record.
            log.warning("capture partition %d: segment %s has a torn file header (%d bytes); recreating it",
                        self.partition, path.name, len(data))
            path.unlink()
            index_path(self.pdir, base).unlink(missing_ok=True)
            fsync_dir(self.pdir)
            if len(bases) == 1:
                self.next_offset = base
                return None
            # The previous segment is complete (fsynced before the roll); continue from its end.
            return self._recover_from_previous(base)
        header = parse_file_header(data[:HEADER_SIZE], path, SEGMENT_MAGIC)
        if header.partition != self.partition or header.base_offset != base:
            raise LogFormatError(f"{path}: header says partition {header.partition} base offset "
                                 f"{header.base_offset}; the file name and directory say {self.partition}, {base}")
        res = scan_records(data, HEADER_SIZE, len(data), base)
        truncated = 0
        if res.problem is not None:
            later = find_valid_after(data, res.end, len(data), res.next_offset)
            if later is not None:
                raise CorruptRecordError(self.partition, res.next_offset, path, res.end, res.problem)
            if res.next_offset < durable_end:
                # a torn write only ever damages what was not yet fsynced
                raise CorruptRecordError(self.partition, res.next_offset, path, res.end,
                                         f"{res.problem}; records up to offset {durable_end - 1} were "
                                         "reported durable")
            truncated = len(data) - res.end
            log.warning("capture partition %d: torn tail in %s at byte %d (offset %d, %s): "
                        "truncating %d bytes that were never durable",
                        self.partition, path.name, res.end, res.next_offset, res.problem, truncated)
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, res.end)
                os.fsync(fd)
            finally:
                os.close(fd)
        self._open_existing(base, header.base_seq, res.end, res.index)
        self.next_offset = res.next_offset
        seq_floor = header.base_seq if res.last_seq is None else res.last_seq + 1
        return Recovered(self.partition, res.next_offset, seq_floor, truncated)

    def _recover_from_previous(self, torn_base: int) -> Recovered:
        bases = list_segments(self.pdir)
        prev = bases[-1]
        path = segment_path(self.pdir, prev)
        data = path.read_bytes()
        header = parse_file_header(data[:HEADER_SIZE], path, SEGMENT_MAGIC)
        res = scan_records(data, HEADER_SIZE, len(data), prev)
        if res.problem is not None or res.next_offset != torn_base:
            raise CorruptRecordError(self.partition, res.next_offset, path, res.end,
                                     res.problem or f"segment ends at offset {res.next_offset}, the next one starts at {torn_base}")
        self.next_offset = torn_base
        seq_floor = header.base_seq if res.last_seq is None else res.last_seq + 1
        self.base_offset = -1  # create_first makes the new active segment
        return Recovered(self.partition, torn_base, seq_floor, 0)

    def _open_existing(self, base: int, base_seq: int, size: int, index: list[tuple[int, int]]) -> None:
        cloexec = getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(segment_path(self.pdir, base), os.O_WRONLY | os.O_APPEND | cloexec)
        # Records a crashed writer wrote but never fsynced are in the page
        # cache only: make them durable before anyone is told they exist.
        os.fdatasync(self._fd)
        # The index is derived data: rewrite it from the scan.
        ipath = index_path(self.pdir, base)
        self._idx_fd = os.open(ipath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | cloexec, 0o644)
        header = encode_file_header(INDEX_MAGIC, self.partition, base, base_seq)
        write_all(self._idx_fd, header + b"".join(INDEX_ENTRY.pack(o, p) for o, p in index))
        os.fdatasync(self._idx_fd)
        self.base_offset = base
        self.size = size
        self._last_index_pos = index[-1][1] if index else HEADER_SIZE
        self._synced = (base, size)

    @property
    def has_active(self) -> bool:
        return self._fd >= 0

    def create_first(self, base_seq: int) -> None:
        """Create the active segment when :meth:`recover` found none."""
        base = self.next_offset
        self._fd, self._idx_fd = create_segment(self.pdir, self.partition, base, base_seq)
        self.base_offset = base
        self.size = HEADER_SIZE
        self._last_index_pos = HEADER_SIZE
        self._synced = (base, HEADER_SIZE)

    # ---- writing (flusher thread) ----
    def write(self, records: list[bytes]) -> None:
        """Write records (already carrying this partition's next offsets, in
        order), rolling segments as needed. Not durable until :meth:`sync`."""
        chunk: list[bytes] = []
        entries: list[bytes] = []
        size = self.size
        offset = self.next_offset
        for rec in records:
            n = len(rec)
            if size + n > self.segment_bytes and size > HEADER_SIZE:
                self._write_out(chunk, entries)
                chunk, entries = [], []
                self.size, self.next_offset = size, offset
                self._roll(base_seq=_SEQ_AT.unpack_from(rec, 20)[0])
                size = self.size
            if size - self._last_index_pos >= INDEX_INTERVAL_BYTES:
                entries.append(INDEX_ENTRY.pack(offset, size))
                self._last_index_pos = size
            chunk.append(rec)
            size += n
            offset += 1
        self._write_out(chunk, entries)
        self.size, self.next_offset = size, offset

    def _write_out(self, chunk: list[bytes], entries: list[bytes]) -> None:
        if chunk:
            write_all(self._fd, b"".join(chunk) if len(chunk) > 1 else chunk[0])
            self._dirty = True
        if entries:
            write_all(self._idx_fd, b"".join(entries))

    def _roll(self, base_seq: int) -> None:
        old = self.base_offset
        os.fdatasync(self._fd)
        os.fdatasync(self._idx_fd)
        os.close(self._fd)
        os.close(self._idx_fd)
        self._fd = self._idx_fd = -1
        self._dirty = False
        self._fd, self._idx_fd = create_segment(self.pdir, self.partition, self.next_offset, base_seq)
        self.base_offset = self.next_offset
        self.size = HEADER_SIZE
        self._last_index_pos = HEADER_SIZE
        self._synced = (self.base_offset, HEADER_SIZE)
        log.debug("capture partition %d: rolled segment %d -> %d", self.partition, old, self.base_offset)

    def sync(self) -> None:
        """fdatasync the active segment (rolled ones were synced when rolled)."""
        if self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False
        self._synced = (self.base_offset, self.size)

    def rollback_unsynced(self) -> None:
        """After a failed write or sync: best effort to cut the active segment
        back to what was last synced, so records whose append failed do not
        reappear on reopen. Errors are logged, not raised."""
        base, size = self._synced
        if base != self.base_offset or self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            log.warning("capture partition %d: could not truncate after a failed write: %s", self.partition, exc)

    def close(self) -> None:
        """fsync data and index, close the files."""
        try:
            if self._fd >= 0:
                self.sync()
            if self._idx_fd >= 0:
                os.fdatasync(self._idx_fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close the files without syncing (after a failure)."""
        for fd in (self._fd, self._idx_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._idx_fd = -1
