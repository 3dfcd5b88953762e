"""Capture records in a byte chunk -> one Arrow record batch, with array operations.

Plain functions over numpy and pyarrow, no Spark, no I/O: the reader has
found the records (their positions in the chunk) and checked their sizes and
CRCs; this module gathers the columns and checks the remaining fields
(declared lengths, dense offsets, header table). Runs on executors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Sequence

from bridge.capture.record import FIXED_SIZE
from schemas.capture import TIMESTAMP_TYPE_LOG_APPEND

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["to_record_batch"]

_HENTRY_SIZE = 6  # u16 key_len, u32 value_len


@functools.lru_cache(maxsize=1)
def _fixed_dtype():
    import numpy as np

    return np.dtype([
        ("magic", "V4"), ("crc", "<u4"), ("size", "<u4"), ("offset", "<u8"), ("seq", "<u8"),
        ("ts", "<i8"), ("kl", "<u4"), ("vl", "<u4"), ("hl", "<u4"), ("hc", "<u2"), ("attr", "<u2"),
    ])


def _slices(buf: "np.ndarray", chunk: bytes, starts: "np.ndarray", lengths: "np.ndarray",
            typ: "pa.DataType") -> "pa.Array":
    """An Arrow array (``typ``: binary or string) of ``chunk[s:s+l]`` for each span.

    Builds a binary-view array whose views point into the chunk (inline
    bytes for spans of at most 12 bytes, as the view layout requires), then
    casts it to ``typ``: one C++ copy, no loop per span in Python. The cast
    is unchecked: the spans were CRC-checked, and string spans (header keys)
    were ASCII when written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(starts)
    if n == 0:
        return pa.array([], typ)
    views = np.zeros((n, 4), dtype=np.uint32)
    views[:, 0] = lengths
    at = starts[:, None] + np.arange(12)
    np.minimum(at, len(buf) - 1, out=at)
    head = buf[at]
    head[np.arange(12)[None, :] >= lengths[:, None]] = 0
    views.view(np.uint8).reshape(n, 16)[:, 4:16] = head    # inline bytes, or the 4-byte prefix
    long = lengths > 12
    views[long, 2] = 0                                      # data buffer 0: the chunk
    views[long, 3] = starts[long]                           # offset into it
    arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(chunk)])
    return pc.cast(arr, typ, safe=False)


def _u16(buf: "np.ndarray", at: "np.ndarray") -> "np.ndarray":
    import numpy as np

    return buf[at].astype(np.int64) | (buf[at + 1].astype(np.int64) << 8)


def _u32(buf: "np.ndarray", at: "np.ndarray") -> "np.ndarray":
    import numpy as np

    return (buf[at].astype(np.int64) | (buf[at + 1].astype(np.int64) << 8)
            | (buf[at + 2].astype(np.int64) << 16) | (buf[at + 3].astype(np.int64) << 24))


def to_record_batch(chunk: bytes, positions: Sequence[int], first_offset: int, partition: int,
                    stream: str) -> "pa.RecordBatch | None":
    """The records at ``positions`` of ``chunk`` (offsets ``first_offset``,
    ``first_offset + 1``, ...) as a record batch in the capture schema, or
    None when a field check fails (the caller then reports the exact record).
    """
    import numpy as np
    import pyarrow as pa

    from bridge.capture.reader import capture_arrow_schema

    schema = capture_arrow_schema()
    buf = np.frombuffer(chunk, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    n = len(pos)
    fixed = buf[pos[:, None] + np.arange(FIXED_SIZE)].view(_fixed_dtype()).reshape(n)
    kl = fixed["kl"].astype(np.int64)
    vl = fixed["vl"].astype(np.int64)
    hl = fixed["hl"].astype(np.int64)
    hc = fixed["hc"].astype(np.int64)
    if not (np.array_equal(fixed["size"], FIXED_SIZE + kl + vl + hl)
            and np.array_equal(fixed["offset"], np.arange(first_offset, first_offset + n, dtype=np.uint64))):
        return None


    # Headers: locate every table entry of every record at once.
    hpos = pos + FIXED_SIZE + kl + vl
    total = int(hc.sum())
    rec = np.repeat(np.arange(n), hc)                      # record of each header
    first_h = np.cumsum(hc) - hc                           # index of each record's first header
    j = np.arange(total) - first_h[rec]                    # header number within its record
    entry = hpos[rec] + _HENTRY_SIZE * j
    hk_len = _u16(buf, entry)
    hv_len = _u32(buf, entry + 2)
    lens = hk_len + hv_len
    before = np.cumsum(lens) - lens                        # bytes of earlier headers, over all records
    within = before - before[first_h[rec]] if total else before
    kpos = hpos[rec] + _HENTRY_SIZE * hc[rec] + within
    per_record = np.bincount(rec, weights=lens, minlength=n).astype(np.int64) if total else np.zeros(n, np.int64)
    if not np.array_equal(per_record + _HENTRY_SIZE * hc, hl):
        return None
    stored_k = _slices(buf, chunk, kpos, hk_len, pa.string())
    stored_v = _slices(buf, chunk, kpos + hk_len, hv_len, pa.binary())

    # Each record's list: its stored headers, then ("seq", decimal seq).
    seq_v = pa.array(fixed["seq"].astype(np.int64)).cast(pa.string()).cast(pa.binary())
    seq_k = pa.repeat(pa.scalar("seq", pa.string()), n)
    all_k = pa.concat_arrays([stored_k, seq_k])
    all_v = pa.concat_arrays([stored_v, seq_v])
    order = np.empty(total + n, dtype=np.int64)
    list_off = (first_h + np.arange(n)).astype(np.int64)   # where each record's list starts
    order[list_off[rec] + j] = np.arange(total)
    order[list_off + hc] = total + np.arange(n)
    hfields = list(schema.field("headers").type.value_type)
    entries = pa.StructArray.from_arrays([all_k.take(order), all_v.take(order)], fields=hfields)
    headers = pa.ListArray.from_arrays(pa.array(np.append(list_off, total + n).astype(np.int32)), entries)

    return pa.RecordBatch.from_arrays([
        _slices(buf, chunk, pos + FIXED_SIZE, kl, pa.binary()),
        _slices(buf, chunk, pos + FIXED_SIZE + kl, vl, pa.binary()),
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        pa.array(fixed["ts"].astype(np.int64), pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(TIMESTAMP_TYPE_LOG_APPEND, pa.int32()), n),
        headers,
    ], schema=schema)
