"""LogReader: read a capture log by offset ranges (the Spark source's side).

Read-only and lock-free: any number of readers, in any process, while the
writer appends. Readers see only durable records: the ``durable`` file gives
each partition's durable end (the high watermark); ``log stats``, ``log dump``
and the Spark source stop there.

Every record read is checked (magic, size, CRC, dense offsets). A damaged
record raises :class:`CorruptRecordError` naming the partition and offset;
nothing is skipped. Offsets retention has deleted, or that are not durable
yet, raise :class:`OffsetOutOfRangeError`.
"""

from __future__ import annotations

import bisect
import functools
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from bridge.capture.commits import read_commits
from bridge.capture.errors import CorruptRecordError, LogFormatError, OffsetOutOfRangeError
from bridge.capture.layout import partition_dir, read_durable, read_meta
from bridge.capture.record import (
    FIXED_SIZE,
    INCOMPLETE,
    MAGIC,
    MAX_RECORD_BYTES,
    Record,
    RecordFields,
    check_record,
    decode_record,
)
from bridge.capture.segment import (
    HEADER_SIZE,
    SEGMENT_MAGIC,
    index_path,
    list_segments,
    lookup_position,
    parse_file_header,
    read_index,
    scan_records,
    segment_path,
)
from schemas.capture import CAPTURE_RECORD_DDL

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["LogReader", "PartitionStats", "capture_arrow_schema"]

_HEAD3 = struct.Struct("<4sII")  # magic, crc, size
#: Arrow batches are cut at this many records or bytes, whichever comes first.
BATCH_RECORDS = 8192
BATCH_BYTES = 8 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def capture_arrow_schema() -> "pa.Schema":
    """The Arrow schema of capture records, from ``schemas.capture.CAPTURE_RECORD_DDL``."""
    from schemas.ddl import to_arrow

    return to_arrow(CAPTURE_RECORD_DDL)


@dataclass(frozen=True)
class PartitionStats:
    partition: int
    #: first offset still in the log (retention deletes below it)
    first_offset: int
    #: next offset after the last durable record
    next_offset: int
    records: int
    bytes: int
    segments: int
    #: consumer -> committed next offset
    committed: dict[str, int]


class LogReader:
    """A read-only view of the capture log at ``root`` (picklable: holds only the path)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        meta = read_meta(self.root)
        self.partitions = meta.partitions
        self.stream = meta.stream
        self.format = meta.format

    def __repr__(self) -> str:
        return f"LogReader({str(self.root)!r}, partitions={self.partitions})"

    # ------------------------------------------------------------- offsets
    def segments(self, partition: int) -> list[int]:
        """Base offsets of the partition's segments."""
        return list_segments(partition_dir(self.root, partition))

    def earliest_offsets(self) -> list[int]:
        """Per partition, the first offset still in the log."""
        out = []
        for p in range(self.partitions):
            bases = self.segments(p)
            out.append(bases[0] if bases else 0)
        return out

    def durable_offsets(self) -> list[int]:
        """Per partition, the end of the durable records (next offset)."""
        d = read_durable(self.root, self.partitions)
        if d is not None:
            return d
        return [self._scan_end(p) for p in range(self.partitions)]

    def _scan_end(self, p: int) -> int:
        pdir = partition_dir(self.root, p)
        bases = list_segments(pdir)
        if not bases:
            return 0
        data = segment_path(pdir, bases[-1]).read_bytes()
        if len(data) < HEADER_SIZE:
            return bases[-1]
        return scan_records(data, HEADER_SIZE, len(data), bases[-1]).next_offset

    # ------------------------------------------------------------- reading
    def _locate(self, p: int, start: int, end: int) -> tuple[Path, list[int], int] | None:
        """(partition dir, segment bases, index of the segment holding
        ``start``) for reading [start, end) of partition ``p``; None when the
        range is empty. Raises for a bad partition or a range outside the
        retained, durable records."""
        if not 0 <= p < self.partitions:
            raise ValueError(f"capture log has partitions 0-{self.partitions - 1}, not {p}")
        if start >= end:
            return None
        # The durable end first: every segment holding offsets below it exists
        # by then (a roll creates the segment before its records are durable).
        durable = self.durable_offsets()[p]
        pdir = partition_dir(self.root, p)
        bases = list_segments(pdir)
        if not bases or start < bases[0] or end > durable:
            raise OffsetOutOfRangeError(p, start, end, bases[0] if bases else 0, durable)
        return pdir, bases, bisect.bisect_right(bases, start) - 1

    def _iter_fields(self, p: int, start: int, end: int) -> Iterator[tuple[mmap.mmap, RecordFields]]:
        """(buffer, fields) of each record with start <= offset < end. The
        buffer is valid only until the next item."""
        located = self._locate(p, start, end)
        if located is None:
            return
        pdir, bases, i = located
        want = start
        nxt = bases[i]
        while want < end:
            if i >= len(bases):
                raise OffsetOutOfRangeError(p, want, end, bases[0], nxt)
            base = bases[i]
            path = segment_path(pdir, base)
            if base != nxt and i > 0:
                raise CorruptRecordError(p, nxt, path, 0, f"segment {base} follows a segment that ends at offset {nxt}")
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                now = list_segments(pdir)
                earliest = now[0] if now else 0
                raise OffsetOutOfRangeError(p, want, end, earliest, self.durable_offsets()[p]) from None
            with fh:
                size = os.fstat(fh.fileno()).st_size
                if size < HEADER_SIZE:
                    raise OffsetOutOfRangeError(p, want, end, bases[0], base)
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    h = parse_file_header(mm[:HEADER_SIZE], path, SEGMENT_MAGIC)
                    if h.partition != p or h.base_offset != base:
                        raise LogFormatError(f"{path}: header says partition {h.partition} base {h.base_offset}")
                    nxt, pos = base, HEADER_SIZE
                    if want > base:
                        ioff, ipos = lookup_position(read_index(pdir, p, base, size), want)
                        if ioff >= 0:
                            nxt, pos = ioff, ipos
                    last = i == len(bases) - 1
                    while want < end and pos < size:
                        f = check_record(mm, pos, size)
                        if not isinstance(f, RecordFields):
                            if f == INCOMPLETE and last:
                                break  # being written (or torn): not durable, so out of range below
                            raise CorruptRecordError(p, nxt, path, pos, "torn record" if f == INCOMPLETE else f)
                        if f.offset != nxt:
                            raise CorruptRecordError(p, nxt, path, pos, f"offset {f.offset} where {nxt} was expected")
                        if nxt >= want:
                            yield mm, f
                            want = nxt + 1
                        nxt += 1
                        pos += f.size
                finally:
                    mm.close()
            i += 1

    def records(self, partition: int, start: int, end: int) -> Iterator[Record]:
        """Decoded records with start <= offset < end."""
        for mm, f in self._iter_fields(partition, start, end):
            yield decode_record(mm, f, partition)

    def arrow_batches(self, partition: int, start: int, end: int, batch_records: int = BATCH_RECORDS,
                      batch_bytes: int = BATCH_BYTES) -> Iterator["pa.RecordBatch"]:
        """Records with start <= offset < end as Arrow record batches in the
        schema of ``schemas.capture.CAPTURE_RECORD_DDL`` (Spark's Kafka source
        rows). Runs on executors; imports numpy and pyarrow here.

        Reads the segment files in chunks of about ``batch_bytes``; one
        Python step per record (size and CRC), the columns with array
        operations. Any problem is diagnosed by the record-by-record path,
        so the errors are the same as :meth:`records` raises."""
        from bridge.capture import arrowcols

        for data, positions, first in self._chunks(partition, start, end, batch_records, batch_bytes):
            batch = arrowcols.to_record_batch(data, positions, first, partition, self.stream)
            if batch is None:  # a field check failed: find and report the exact record
                self._diagnose(partition, first, end)
            yield batch

    def _diagnose(self, partition: int, start: int, end: int) -> None:
        """Raise the precise error for a damaged record at or after ``start``."""
        for _ in self._iter_fields(partition, start, end):
            pass
        raise CorruptRecordError(partition, start, partition_dir(self.root, partition), 0,
                                 "records fail validation")

    def _chunks(self, p: int, start: int, end: int, batch_records: int,
                batch_bytes: int) -> Iterator[tuple[bytes, list[int], int]]:
        """(chunk bytes, positions in the chunk of records with offsets
        first.., first) for [start, end); sizes and CRCs checked."""
        located = self._locate(p, start, end)
        if located is None:
            return
        pdir, bases, i = located
        want = start
        unpack = _HEAD3.unpack_from
        crc32 = zlib.crc32
        while want < end:
            if i >= len(bases):
                raise OffsetOutOfRangeError(p, want, end, bases[0], want)
            base = bases[i]
            path = segment_path(pdir, base)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                now = list_segments(pdir)
                raise OffsetOutOfRangeError(p, want, end, now[0] if now else 0, self.durable_offsets()[p]) from None
            try:
                size = os.fstat(fd).st_size
                h = parse_file_header(os.pread(fd, HEADER_SIZE, 0), path, SEGMENT_MAGIC)
                if h.partition != p or h.base_offset != base:
                    raise LogFormatError(f"{path}: header says partition {h.partition} base {h.base_offset}")
                nxt, pos = base, HEADER_SIZE
                if want > base:
                    ioff, ipos = lookup_position(read_index(pdir, p, base, size), want)
                    if ioff >= 0:
                        nxt, pos = ioff, ipos
                need = batch_bytes
                while want < end and pos < size:
                    data = os.pread(fd, min(size - pos, max(need, 12)), pos)
                    mv = memoryview(data)
                    limit = len(data)
                    q = 0
                    first = max(nxt, want)
                    positions: list[int] = []
                    rsize = 0
                    while nxt < end and len(positions) < batch_records and limit - q >= 12:
                        magic, crc, rsize = unpack(data, q)
                        if magic != MAGIC or rsize < FIXED_SIZE or rsize > MAX_RECORD_BYTES:
                            self._diagnose(p, want, end)
                        if q + rsize > limit:
                            break
                        if crc32(mv[q + 8:q + rsize]) != crc:
                            self._diagnose(p, want, end)
                        if nxt >= want:
                            positions.append(q)
                        q += rsize
                        nxt += 1
                    if q == 0:
                        if pos + max(rsize, 12) > size:  # incomplete record at the end of the file
                            if i == len(bases) - 1:
                                break  # being written: not durable, out of range below
                            self._diagnose(p, want, end)
                        need = max(rsize, 12)  # a record larger than the chunk
                        continue
                    need = batch_bytes
                    mv.release()
                    pos += q
                    if positions:
                        yield data, positions, first
                        want = first + len(positions)
            finally:
                os.close(fd)
            i += 1
            if i < len(bases) and want < end and bases[i] != nxt:
                self._diagnose(p, want, end)

    # --------------------------------------------------------------- stats
    def close(self) -> None:
        """Nothing to release (files are opened per read); the Kafka reader's twin closes its consumers."""

    def stats(self) -> list[PartitionStats]:
        """Per partition: first and next offsets, record count, bytes on disk,
        segment count, committed offsets per consumer."""
        durable = self.durable_offsets()
        commits = read_commits(self.root)
        out = []
        for p in range(self.partitions):
            pdir = partition_dir(self.root, p)
            bases = list_segments(pdir)
            nbytes = 0
            for b in bases:
                for f in (segment_path(pdir, b), index_path(pdir, b)):
                    try:
                        nbytes += f.stat().st_size
                    except FileNotFoundError:
                        pass
            first = bases[0] if bases else 0
            nxt = max(durable[p], first)
            out.append(PartitionStats(p, first, nxt, nxt - first, nbytes, len(bases),
                                      {c: o.get(p, 0) for c, o in commits.items()}))
        return out
