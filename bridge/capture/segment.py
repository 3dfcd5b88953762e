"""Segment files and their offset index (format version 1).

A partition directory ``p<N>/`` holds segments named by their base offset
(``00000000000000001234.log``) and a sparse offset index beside each
(``00000000000000001234.idx``). Both start with a 64-byte file header::

    0   magic         8   b"LAKEGSEG" (segment) or b"LAKEGIDX" (index)
    8   version       u16 format version, 1
    10  header_size   u16 64
    12  partition     u32
    16  base_offset   u64 offset of the first record in the segment
    24  base_seq      u64 capture sequence of the first record (a floor when empty)
    32  created_us    i64
    40  crc           u32 CRC-32 of bytes [0, 40)
    44  reserved      zeros up to 64

Segment records follow (see :mod:`bridge.capture.record`). Index entries are
``u64 offset, u64 position``, one per ``INDEX_INTERVAL_BYTES`` of records;
the index is derived data: recovery rebuilds the active segment's, and a
reader falls back to scanning when an index is missing or implausible.

The functions here that scan take a buffer; only ``create_segment`` and the
small file helpers do I/O.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from bridge.capture.errors import LogFormatError
from bridge.capture.record import FIXED_SIZE, INCOMPLETE, MAGIC, RecordFields, check_record

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "INDEX_ENTRY",
    "INDEX_INTERVAL_BYTES",
    "INDEX_MAGIC",
    "SEGMENT_MAGIC",
    "ScanResult",
    "SegmentHeader",
    "create_segment",
    "encode_file_header",
    "find_valid_after",
    "fsync_dir",
    "index_path",
    "list_segments",
    "lookup_position",
    "parse_file_header",
    "read_index",
    "scan_records",
    "segment_path",
    "write_all",
]

FORMAT_VERSION = 1
HEADER_SIZE = 64
SEGMENT_MAGIC = b"LAKEGSEG"
INDEX_MAGIC = b"LAKEGIDX"
INDEX_INTERVAL_BYTES = 4096
_HEAD = struct.Struct("<8sHHIQQq")
_CRC = struct.Struct("<I")
INDEX_ENTRY = struct.Struct("<QQ")


@dataclass(frozen=True)
class SegmentHeader:
    magic: bytes
    version: int
    partition: int
    base_offset: int
    base_seq: int
    created_us: int


def segment_path(pdir: Path, base_offset: int) -> Path:
    return pdir / f"{base_offset:020d}.log"


def index_path(pdir: Path, base_offset: int) -> Path:
    return pdir / f"{base_offset:020d}.idx"


def list_segments(pdir: Path) -> list[int]:
    """Base offsets of the segments in a partition directory, ascending."""
    try:
        names = os.listdir(pdir)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if n.endswith(".log") and len(n) == 24 and n[:20].isdigit():
            out.append(int(n[:20]))
    out.sort()
    return out


def encode_file_header(magic: bytes, partition: int, base_offset: int, base_seq: int,
                       created_us: int | None = None) -> bytes:
    created = time.time_ns() // 1000 if created_us is None else created_us
    head = _HEAD.pack(magic, FORMAT_VERSION, HEADER_SIZE, partition, base_offset, base_seq, created)
    out = head + _CRC.pack(zlib.crc32(head))
    return out + b"\0" * (HEADER_SIZE - len(out))


def parse_file_header(data: bytes, path: Path | str, magic: bytes) -> SegmentHeader:
    """Parse and check a file header; raises LogFormatError naming the file."""
    if len(data) < HEADER_SIZE:
        raise LogFormatError(f"{path}: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte file header")
    m, version, hsize, partition, base, base_seq, created = _HEAD.unpack_from(data, 0)
    if m != magic:
        raise LogFormatError(f"{path}: not a lakegate capture {'segment' if magic == SEGMENT_MAGIC else 'index'} file (bad magic)")
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    if zlib.crc32(data[:_HEAD.size]) != crc:
        raise LogFormatError(f"{path}: file header CRC mismatch")
    if version != FORMAT_VERSION:
        raise LogFormatError(f"{path}: capture log format version {version}; this lakegate reads version {FORMAT_VERSION}")
    if hsize != HEADER_SIZE:
        raise LogFormatError(f"{path}: header size {hsize}, expected {HEADER_SIZE}")
    return SegmentHeader(m, version, partition, base, base_seq, created)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that file creations and deletions in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until everything is written (a short write then an error raises)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def create_segment(pdir: Path, partition: int, base_offset: int, base_seq: int) -> tuple[int, int]:
    """Create a segment and its index (headers written and fsynced, directory
    fsynced). Returns (segment fd, index fd), both O_WRONLY|O_APPEND."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
    seg_fd = os.open(segment_path(pdir, base_offset), flags, 0o644)
    try:
        idx_fd = os.open(index_path(pdir, base_offset), flags, 0o644)
    except BaseException:
        os.close(seg_fd)
        raise
    try:
        write_all(seg_fd, encode_file_header(SEGMENT_MAGIC, partition, base_offset, base_seq))
        write_all(idx_fd, encode_file_header(INDEX_MAGIC, partition, base_offset, base_seq))
        os.fdatasync(seg_fd)
        os.fdatasync(idx_fd)
        fsync_dir(pdir)
    except BaseException:
        os.close(seg_fd)
        os.close(idx_fd)
        raise
    return seg_fd, idx_fd


def read_index(pdir: Path, partition: int, base_offset: int, segment_size: int) -> list[tuple[int, int]]:
    """The index entries of a segment, or [] when the index is missing or
    implausible (the reader then scans from the segment's start)."""
    try:
        data = index_path(pdir, base_offset).read_bytes()
    except OSError:
        return []
    try:
        h = parse_file_header(data, "index", INDEX_MAGIC)
    except LogFormatError:
        return []
    if h.partition != partition or h.base_offset != base_offset:
        return []
    n = (len(data) - HEADER_SIZE) // INDEX_ENTRY.size  # a torn last entry is ignored
    entries = []
    prev_off, prev_pos = base_offset, HEADER_SIZE - 1
    for i in range(n):
        off, pos = INDEX_ENTRY.unpack_from(data, HEADER_SIZE + i * INDEX_ENTRY.size)
        if off < prev_off or pos <= prev_pos or pos >= segment_size:
            break  # keep the plausible prefix
        entries.append((off, pos))
        prev_off, prev_pos = off, pos
    return entries


def lookup_position(entries: list[tuple[int, int]], offset: int) -> tuple[int, int]:
    """(offset, position) of the last index entry at or below ``offset``,
    or (-1, HEADER_SIZE) to scan from the start."""
    i = bisect.bisect_right(entries, (offset, 1 << 63)) - 1
    if i < 0:
        return -1, HEADER_SIZE
    return entries[i]


@dataclass
class ScanResult:
    """What a sequential scan of a segment's records found."""

    #: position just after the last valid record
    end: int
    #: offset the next record would have
    next_offset: int
    #: seq of the last valid record, None when none
    last_seq: int | None
    count: int = 0
    index: list[tuple[int, int]] = field(default_factory=list)
    #: None when the scan reached ``limit`` exactly; else what is wrong at ``end``
    problem: str | None = None


def scan_records(buf, start: int, limit: int, expect_offset: int) -> ScanResult:
    """Validate records from ``start`` to ``limit``: magic, size, CRC, and
    offsets dense from ``expect_offset``. Stops at the first problem."""
    pos = start
    nxt = expect_offset
    last_seq = None
    count = 0
    index: list[tuple[int, int]] = []
    last_idx = start
    while pos < limit:
        f = check_record(buf, pos, limit)
        if not isinstance(f, RecordFields):
            return ScanResult(pos, nxt, last_seq, count, index, "torn record" if f == INCOMPLETE else f)
        if f.offset != nxt:
            return ScanResult(pos, nxt, last_seq, count, index, f"offset {f.offset} where {nxt} was expected")
        if pos - last_idx >= INDEX_INTERVAL_BYTES:
            index.append((nxt, pos))
            last_idx = pos
        nxt += 1
        last_seq = f.seq
        count += 1
        pos += f.size
    return ScanResult(pos, nxt, last_seq, count, index, None)


def find_valid_after(buf, pos: int, limit: int, min_offset: int) -> RecordFields | None:
    """The first intact record after ``pos`` whose offset is at least
    ``min_offset``: proof that the damage at ``pos`` is in the middle of the
    log, not a torn tail. Finds candidates by the record magic. ``buf`` is
    bytes, bytearray or mmap."""
    q = pos
    while True:
        q = buf.find(MAGIC, q + 1, limit)  # bytes, bytearray and mmap all have find(sub, start, end)
        if q < 0 or limit - q < FIXED_SIZE:
            return None
        f = check_record(buf, q, limit)
        if isinstance(f, RecordFields) and f.offset >= min_offset:
            return f

