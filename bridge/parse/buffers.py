"""Arrow buffers <-> numpy for the vectorised frame parser (no Spark).

* :func:`frames_array` turns any accepted batch (pyarrow Binary/LargeBinary
  array or ChunkedArray, pandas Series or a sequence of bytes) into one
  ``large_binary`` array; :func:`frame_buffers` exposes its offset and value
  buffers as numpy arrays without copying.
* :func:`read_u8`, :func:`read_u16`, :func:`read_u32` read big-endian integers
  at a vector of positions (callers check bounds first).
* :func:`take_ranges` builds a ``binary`` array of ``data[start:start+len]``
  for every row, in one C++ copy: ranges in buffer order are the odd rows of
  a ``binary`` array over ``data`` (no copy) that Arrow ``take``s; others are
  described as a ``binary_view`` array that points into ``data`` (no copy),
  which Arrow then casts to ``binary``.
* :func:`view_ranges` describes the same ranges as a ``binary_view`` array
  pointing into the frames' buffer: no copy of the bytes at all.

Runs on executors (inside the parser's pandas UDF); imports only numpy and
pyarrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = [
    "FrameBuffers",
    "frame_buffers",
    "frames_array",
    "read_u16",
    "read_u32",
    "ranges_array",
    "read_u8",
    "take_range_pairs",
    "take_ranges",
    "value_buffers",
    "view_ranges",
]


def frames_array(frames) -> pa.LargeBinaryArray:
    """One ``large_binary`` array of the frames (nulls kept).

    Accepts a pyarrow Binary/LargeBinary/BinaryView array or ChunkedArray, a
    pandas Series of bytes (None for null) or any sequence of bytes. Raises
    TypeError for any other Arrow type.
    """
    if isinstance(frames, pa.ChunkedArray):
        frames = (frames.cast(pa.large_binary()).combine_chunks()
                  if frames.num_chunks != 1 else frames.chunk(0))
    if not isinstance(frames, pa.Array):
        # pandas Series (object dtype of bytes), numpy object array or a list:
        # Arrow's converter walks the objects in C++.
        values = frames
        if hasattr(frames, "to_numpy"):
            values = frames.to_numpy(dtype=object, na_value=None)
        frames = pa.array(values, type=pa.large_binary(), from_pandas=True)
    t = frames.type
    if t == pa.large_binary():
        return frames
    if t in (pa.binary(), pa.binary_view(), pa.large_string(), pa.string(), pa.string_view()):
        return frames.cast(pa.large_binary())
    raise TypeError(f"frames must be binary, got Arrow type {t}")


class FrameBuffers:
    """numpy views of a ``large_binary`` array: ``data`` (uint8, the whole
    value buffer), ``start``/``end`` (int64 per row) and ``null`` (bool)."""

    __slots__ = ("buffer", "data", "start", "end", "null")

    def __init__(self, buffer, data, start, end, null) -> None:
        self.buffer = buffer
        self.data = data
        self.start = start
        self.end = end
        self.null = null


def frame_buffers(arr: pa.LargeBinaryArray) -> FrameBuffers:
    """Zero-copy numpy views of ``arr``'s buffers (a null row is empty).

    ``data`` covers exactly the bytes of ``arr``'s rows, so that positions
    (``start``/``end``) are relative to them."""
    n = len(arr)
    validity, offsets, values = arr.buffers()
    off = np.frombuffer(offsets, dtype=np.int64, count=arr.offset + n + 1)[arr.offset:]
    base = int(off[0])
    if values is None or off[-1] == base:
        values = pa.py_buffer(b"\0")
    else:
        values = values.slice(base, int(off[-1]) - base)  # positions fit in 32 bits
    data = np.frombuffer(values, dtype=np.uint8)
    start = off[:-1] - base
    end = off[1:] - base
    if arr.null_count:
        null = arr.is_null().to_numpy(zero_copy_only=False)
        end = np.where(null, start, end)
    else:
        null = np.zeros(n, dtype=bool)
    return FrameBuffers(values, data, start, end, null)


def value_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of a ``binary``/``string`` array as numpy, no
    copy: row i is ``values[offsets[i]:offsets[i+1]]`` (int64 offsets; a
    slice's offsets index the shared value buffer)."""
    _, ob, vb = arr.buffers()
    off = np.frombuffer(ob, dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset:]
    vals = np.frombuffer(vb, dtype=np.uint8) if vb is not None and vb.size else np.zeros(1, np.uint8)
    return vals, off.astype(np.int64)


def read_u8(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``data[pos]`` as int64."""
    return data[pos].astype(np.int64)


def read_u16(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian Two Byte Integers at ``pos`` (two byte gathers: faster in
    numpy than one gather of unaligned big-endian pairs)."""
    return (data[pos].astype(np.int64) << 8) | data[pos + 1]


def read_u32(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian Four Byte Integers at ``pos`` (four byte gathers, as
    :func:`read_u16`)."""
    v = data[pos].astype(np.int64) << 24
    for k, shift in ((1, 16), (2, 8), (3, 0)):
        v |= data[pos + k].astype(np.int64) << shift
    return v


_INLINE = 12  # binary_view inlines values of up to 12 bytes
_I32_MAX = np.iinfo(np.int32).max  # binary arrays have 32-bit offsets
_J12 = np.arange(_INLINE, dtype=np.int64)


def _validity(valid: np.ndarray | None, n: int) -> tuple[pa.Buffer | None, int]:
    """(validity bitmap or None, null count) of ``n`` rows valid where ``valid``."""
    if valid is None or valid.all():
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), int(n - np.count_nonzero(valid))


def view_ranges(buffer: pa.Buffer, data: np.ndarray, start: np.ndarray, length: np.ndarray,
                valid: np.ndarray | None = None, out_type=pa.binary_view()) -> pa.Array:
    """A ``binary_view`` (or ``string_view``) array whose row i is
    ``data[start[i]:start[i]+length[i]]`` (null where ``valid`` is False),
    pointing into ``buffer`` -- the bytes are not copied; the array keeps
    ``buffer`` alive. ``data`` is the numpy view of ``buffer``.

    The 16-byte views are built with numpy: length, then 12 inline bytes or
    a 4-byte prefix, buffer 0 and the offset. Ranges may come in any order
    and overlap."""
    n = len(start)
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    if valid is not None:
        length = np.where(valid, length, 0)
    views = np.zeros((n, 4), dtype=np.int32)
    views[:, 0] = length
    size = len(data)
    long = length > _INLINE
    if long.any():
        # every row at once (position 0 for the others, then masked): cheaper
        # than indexing the long rows, which are most rows of payloads
        ls = np.where(long, start, 0)
        if ls.max() > _I32_MAX:
            raise ValueError("view_ranges: a value starts beyond 2 GiB into its buffer")
        # the 4-byte prefix: four byte gathers (numpy gathers unaligned
        # 4-byte words by a slower path)
        prefix = data[ls].astype(np.uint32)
        for k in (1, 2, 3):
            prefix |= data[ls + k].astype(np.uint32) << (8 * k)
        prefix[~long] = 0
        views[:, 1] = prefix.view(np.int32)
        views[:, 3] = ls
    short = (length > 0) & ~long
    if short.any():
        si = np.flatnonzero(short)
        ss, sl = start[si], length[si]
        inline = np.zeros((len(si), _INLINE), dtype=np.uint8)
        safe = ss + _INLINE <= size
        if size >= _INLINE and safe.any():
            v12 = np.ndarray((size - _INLINE + 1,), dtype=f"V{_INLINE}", buffer=data,
                             strides=(1,))
            inline[safe] = v12[ss[safe]].view(np.uint8).reshape(-1, _INLINE)
        if not safe.all():
            idx = ss[~safe, None] + _J12
            inline[~safe] = data[np.minimum(idx, size - 1)]
        inline[_J12 >= sl[:, None]] = 0
        views[si, 1:4] = inline.view(np.int32)
    bitmap, nulls = _validity(valid, n)
    return pa.Array.from_buffers(out_type, n, [bitmap, pa.py_buffer(views), buffer],
                                 null_count=nulls)


def take_ranges(buffer: pa.Buffer, data: np.ndarray, start: np.ndarray, length: np.ndarray,
                valid: np.ndarray | None = None) -> pa.BinaryArray:
    """A ``binary`` array whose row i is ``data[start[i]:start[i]+length[i]]``
    (null where ``valid`` is False). ``data`` is the numpy view of ``buffer``.

    One C++ copy of just those bytes, two ways:

    * the ranges come in buffer order without overlapping (what the parser
      cuts: fields of frames stored in row order): they and the gaps between
      them are the rows of one ``binary`` array over ``buffer`` (its offsets
      are the range bounds, interleaved by numpy; no copy), and Arrow's
      ``take`` of the odd rows copies the ranges;
    * otherwise, the ranges become a ``binary_view`` array pointing into
      ``buffer`` (built with numpy, values of at most 12 bytes inlined), which
      Arrow casts to ``binary``.

    Either way only the non-empty ranges of valid rows reach Arrow; the
    offsets of all rows (empty for the others) are a numpy cumulative sum.
    """
    n = len(start)
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    keep = length > 0 if valid is None else (valid & (length > 0))
    lens = np.where(keep, length, 0)
    total = int(lens.sum())
    if total > _I32_MAX:
        raise ValueError("take_ranges: more than 2 GiB of values for a binary array")
    bitmap, nulls = _validity(valid, n)
    sel = np.flatnonzero(keep)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    values = pa.py_buffer(b"")
    if len(sel):
        # only the kept ranges go to Arrow; every row's offsets come from numpy
        ranges = ranges_array(buffer, data, start[sel], length[sel])
        if ranges is not None:
            values = _take_odd(ranges, np.arange(len(sel), dtype=np.int32))
        else:
            part = view_ranges(buffer, data, start[sel], length[sel])
            values = part.cast(pa.binary()).buffers()[2]
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offsets), values],
                                 null_count=nulls)


def take_range_pairs(buffer: pa.Buffer, data: np.ndarray, start1: np.ndarray,
                     length1: np.ndarray, start2: np.ndarray,
                     length2: np.ndarray) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    """:func:`take_ranges` of two sets of ranges at once: row i of the first
    array is ``data[start1[i]:start1[i]+length1[i]]``, of the second
    ``data[start2[i]:...]``. When the ranges come in buffer order pair by
    pair (a User Property's name before its value, pair i before pair i+1),
    one Arrow ``take`` copies the firsts and then the seconds into one value
    buffer that both arrays share; otherwise two :func:`take_ranges`."""
    k = len(start1)
    length1 = np.asarray(length1, dtype=np.int64)
    length2 = np.asarray(length2, dtype=np.int64)
    start = np.empty(2 * k, dtype=np.int64)
    length = np.empty(2 * k, dtype=np.int64)
    start[0::2], start[1::2] = start1, start2
    length[0::2], length[1::2] = length1, length2
    sel = np.flatnonzero(length > 0)
    off1 = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(length1, out=off1[1:])
    off2 = np.empty(k + 1, dtype=np.int64)
    off2[0] = off1[-1]
    np.cumsum(length2, out=off2[1:])
    off2[1:] += off1[-1]
    if off2[-1] > _I32_MAX:
        raise ValueError("take_range_pairs: more than 2 GiB of values for a binary array")
    values = pa.py_buffer(b"")
    if len(sel):
        ranges = ranges_array(buffer, data, start[sel], length[sel])
        if ranges is None:
            return (take_ranges(buffer, data, start1, length1),
                    take_ranges(buffer, data, start2, length2))
        # the kept ranges: the firsts, then the seconds
        kept = np.arange(len(sel), dtype=np.int32)
        firsts = (sel & 1) == 0
        values = _take_odd(ranges, np.concatenate([kept[firsts], kept[~firsts]]))
    return tuple(pa.Array.from_buffers(pa.binary(), k, [None, pa.py_buffer(o.astype(np.int32)),
                                                        values]) for o in (off1, off2))


def _take_odd(ranges: pa.BinaryArray, which: np.ndarray) -> pa.Buffer:
    """The value buffer of Arrow's copy of the ranges ``which`` (int32, in
    the order wanted) of a :func:`ranges_array` (range i is its row 2i+1)."""
    odd = 2 * which + 1
    return ranges.take(pa.Array.from_buffers(pa.int32(), len(odd),
                                             [None, pa.py_buffer(odd)])).buffers()[2]


def ranges_array(buffer: pa.Buffer, data: np.ndarray, start: np.ndarray,
                 length: np.ndarray) -> pa.BinaryArray | None:
    """The ranges ``data[start[i]:start[i]+length[i]]`` as the odd rows of
    one ``binary`` array over ``buffer``, without copying: row 2i is the gap
    before range i, row 2i+1 range i.
    Arrow kernels then run over the ranges in place (a ``take`` of the odd
    rows copies them; a string predicate judges them).

    None when the non-empty ranges are not in buffer order or overlap, or
    the buffer is over 2 GiB (the caller falls back to views)."""
    n = len(start)
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    if len(data) > _I32_MAX:
        return None
    keep = length > 0
    bounds = np.empty(2 * n + 1, dtype=np.int32)
    bounds[0] = 0
    if keep.all():
        # the common case (take_ranges passes only non-empty ranges): in
        # order when each range starts at or after the end of the one before
        end = start + length
        if n > 1 and (start[1:] < end[:-1]).any():
            return None
        bounds[1::2] = start
        bounds[2::2] = end
    else:
        # an empty range sits where the range before it ended
        wide = np.empty(2 * n + 1, dtype=np.int64)
        wide[0] = 0
        starts = wide[1::2]
        starts[:] = np.where(keep, start, 0)
        np.add(starts, np.where(keep, length, 0), out=wide[2::2])
        np.maximum.accumulate(wide, out=wide)
        # a kept range that starts before the previous one ends was moved: refuse
        if not np.array_equal(starts, np.where(keep, start, starts)):
            return None
        bounds[:] = wide
    return pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(bounds), buffer])
