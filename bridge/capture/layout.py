"""The capture log directory: its metadata file and its durable-offsets file.

::

    <capture_dir>/
      meta.json        format version, stream name, partition count (fixed at creation)
      writer.lock      flock'd by the one writer process; holds its pid
      durable          the high watermark: per partition, the next offset
                       whose records are all fsynced (readers read up to here)
      consumers/       one <name>.json per consumer: committed offsets
      holds/           one <name>.json per holder: offsets retention must keep
                       (the edge's persistent sessions; never a consumer)
      p0/ ... p<N-1>/  segments and indexes

``durable`` is 8 bytes of magic, one u64 per partition and a CRC-32 of both,
rewritten with one pwrite after every group commit (not fsynced itself: it
is written only after the data it describes is fsynced, so it never runs
ahead of the data). A reader that catches a half-done pwrite sees a CRC
mismatch and reads again.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from bridge.capture.errors import LogFormatError
from bridge.capture.segment import FORMAT_VERSION, fsync_dir

__all__ = [
    "LogMeta",
    "atomic_write",
    "durable_path",
    "meta_path",
    "partition_dir",
    "read_durable",
    "read_meta",
    "write_durable",
    "write_meta",
]

DURABLE_MAGIC = b"LGDURBL1"


@dataclass(frozen=True)
class LogMeta:
    format: int
    stream: str
    partitions: int
    created_us: int


def meta_path(root: Path) -> Path:
    return root / "meta.json"


def durable_path(root: Path) -> Path:
    return root / "durable"


def partition_dir(root: Path, partition: int) -> Path:
    return root / f"p{partition}"


def atomic_write(path: Path, data: bytes) -> None:
    """Write a small file durably: temp file, fsync, rename, fsync directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_meta(root: Path, stream: str, partitions: int) -> LogMeta:
    meta = LogMeta(FORMAT_VERSION, stream, partitions, time.time_ns() // 1000)
    atomic_write(meta_path(root), (json.dumps(meta.__dict__, indent=2) + "\n").encode())
    return meta


def read_meta(root: Path) -> LogMeta:
    """The log's metadata; FileNotFoundError when ``root`` holds no capture log."""
    p = meta_path(root)
    try:
        d = json.loads(p.read_text())
        meta = LogMeta(int(d["format"]), str(d["stream"]), int(d["partitions"]), int(d.get("created_us", 0)))
    except FileNotFoundError:
        raise FileNotFoundError(f"no capture log at {root} ({p.name} is missing)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise LogFormatError(f"{p}: not a valid capture log metadata file ({exc})") from None
    if meta.format != FORMAT_VERSION:
        raise LogFormatError(f"{p}: capture log format version {meta.format}; this lakegate reads version {FORMAT_VERSION}")
    if meta.partitions <= 0:
        raise LogFormatError(f"{p}: partitions must be positive, got {meta.partitions}")
    return meta


def write_durable(fd: int, next_offsets: list[int]) -> None:
    """One pwrite of the whole durable-offsets file (fd opened O_RDWR)."""
    data = DURABLE_MAGIC + struct.pack(f"<{len(next_offsets)}Q", *next_offsets)
    os.pwrite(fd, data + struct.pack("<I", zlib.crc32(data)), 0)


def read_durable(root: Path, partitions: int, attempts: int = 50) -> list[int] | None:
    """Next durable offset per partition, or None when the file is missing or
    damaged (the reader then scans the segments)."""
    size = 8 + 8 * partitions + 4
    for _ in range(attempts):
        try:
            data = durable_path(root).read_bytes()
        except FileNotFoundError:
            return None
        if len(data) != size or data[:8] != DURABLE_MAGIC:
            return None
        if struct.unpack_from("<I", data, size - 4)[0] == zlib.crc32(data[:size - 4]):
            return list(struct.unpack_from(f"<{partitions}Q", data, 8))
        # caught the writer mid-pwrite: read again
    return None
