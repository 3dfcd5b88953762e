"""Vectorised validation of MQTT UTF-8 Encoded Strings (MQTT 5.0 1.5.4).

:func:`check_strings` validates many strings stored back to back (an Arrow
``binary`` value buffer and its offsets) at once and returns one status per
string, with the codec's precedence (:func:`bridge.mqtt.strings.decode_utf8`):

1. ``ILL_FORMED`` -- not RFC 3629 UTF-8: stray or missing continuation bytes,
   overlong forms, encoded surrogates (ED A0..BF ..), code points above
   U+10FFFF, C0/C1/F5..FF [MQTT-1.5.4-1];
2. ``NUL`` -- contains U+0000 [MQTT-1.5.4-2];
3. ``DISALLOWED`` -- contains U+0001..U+001F, U+007F..U+009F or a
   non-character (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF) [LG-utf8-disallowed].

How: one pass marks the bytes that are not printable ASCII (``b - 0x20``
wrapped to a byte is >= 0x5F); most strings have none and cost nothing more.
Only the marked bytes are classified: lead bytes check their continuation
bytes (with the second-byte ranges of E0, ED, F0, F4) inside their own
string, and a string is well formed when additionally its number of
continuation bytes equals the number its lead bytes claim (so no
continuation byte is orphaned). Code points are decoded at the lead bytes
only, for the disallowed set.

:func:`string_status` does the same for an Arrow ``string``/``binary``
array; :func:`range_status` for ranges of a larger buffer, which Arrow
copies back to back first
(:func:`bridge.parse.buffers.take_ranges`). :func:`has_wildcard` finds '+'
and '#' in strings stored back to back; :func:`range_has_wildcard` reads
ranges of a larger buffer in place as fixed-width rows (one numpy gather of
16, 32 or 64 bytes per range); only ranges longer than the window are
gathered exactly.

:func:`well_formed` checks only rule 1 (the Payload Format Indicator check:
NUL and control characters are fine in a payload). Bytes that never occur in
UTF-8 (C0, C1, F5..FF) condemn a row; a 64-byte window over the start of
every row finds them in binary data without touching the rest of its bytes.

Runs on executors; numpy and pyarrow only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bridge.parse.buffers import take_ranges, value_buffers

__all__ = [
    "DISALLOWED", "ILL_FORMED", "NUL", "OK", "check_strings", "has_non_ascii", "has_wildcard",
    "range_has_wildcard", "range_status", "string_status", "well_formed",
]

OK, ILL_FORMED, NUL, DISALLOWED = 0, 1, 2, 3


def _classify(data: np.ndarray, offsets: np.ndarray, pos: np.ndarray, strings: bool):
    """Per-row flags (ill, nul, disallowed) from the marked positions ``pos``."""
    n = len(offsets) - 1
    ill = np.zeros(n, dtype=bool)
    nul = np.zeros(n, dtype=bool)
    bad = np.zeros(n, dtype=bool)
    if len(pos) == 0:
        return ill, nul, bad
    row = np.searchsorted(offsets, pos, side="right") - 1
    b = data[pos]
    if strings:
        nul[row[b == 0]] = True
        bad[row[(b < 0x80) & (b != 0)]] = True  # U+0001..U+001F and U+007F
    hi = b >= 0x80
    pos, row, b = pos[hi], row[hi], b[hi]
    if len(pos) == 0:
        return ill, nul, bad
    cont = b < 0xC0
    # continuation bytes per row vs the number the lead bytes claim
    conts = np.bincount(row[cont], minlength=n)
    lead = ~cont
    lp, lr, lb = pos[lead], row[lead], b[lead].astype(np.int64)
    need = np.where(lb < 0xC2, -1, np.where(lb < 0xE0, 1, np.where(lb < 0xF0, 2,
                    np.where(lb < 0xF5, 3, -1))))
    ill[lr[need < 0]] = True
    need = np.maximum(need, 0)
    claimed = np.bincount(lr, weights=need, minlength=n).astype(np.int64)
    ill |= conts != claimed
    # each lead's followers must be continuation bytes inside the same row
    row_end = offsets[lr + 1]
    last = len(data) - 1
    c = [data[np.minimum(lp + j, last)].astype(np.int64) for j in (1, 2, 3)]
    ok = need > 0
    for j in (1, 2, 3):
        want = need >= j
        ok &= ~want | ((lp + j < row_end) & (c[j - 1] >= 0x80) & (c[j - 1] < 0xC0))
    second = c[0]
    ok &= ~((lb == 0xE0) & (second < 0xA0))   # overlong 3-byte
    ok &= ~((lb == 0xED) & (second >= 0xA0))  # surrogates U+D800..U+DFFF
    ok &= ~((lb == 0xF0) & (second < 0x90))   # overlong 4-byte
    ok &= ~((lb == 0xF4) & (second >= 0x90))  # above U+10FFFF
    ill[lr[~ok]] = True
    if strings:
        cp = np.where(need == 1, ((lb & 0x1F) << 6) | (c[0] & 0x3F),
             np.where(need == 2, ((lb & 0x0F) << 12) | ((c[0] & 0x3F) << 6) | (c[1] & 0x3F),
                      ((lb & 0x07) << 18) | ((c[0] & 0x3F) << 12) | ((c[1] & 0x3F) << 6)
                      | (c[2] & 0x3F)))
        dis = ok & (((cp >= 0x80) & (cp <= 0x9F)) | ((cp >= 0xFDD0) & (cp <= 0xFDEF))
                    | ((cp & 0xFFFE) == 0xFFFE))
        bad[lr[dis]] = True
    return ill, nul, bad


def check_strings(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One status per string ``data[offsets[i]:offsets[i+1]]`` (int8: OK,
    ILL_FORMED, NUL or DISALLOWED, in that precedence)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    status = np.zeros(max(n, 0), dtype=np.int8)
    if n <= 0:
        return status
    lo, hi = int(offsets[0]), int(offsets[-1])
    if hi <= lo:
        return status
    seg = data[lo:hi]
    mark = (seg - np.uint8(0x20)) >= np.uint8(0x5F)  # not printable ASCII
    pos = np.flatnonzero(mark)
    if len(pos) == 0:
        return status
    ill, nul, bad = _classify(data, offsets, pos + lo, strings=True)
    status[bad] = DISALLOWED
    status[nul] = NUL
    status[ill] = ILL_FORMED
    return status


def has_non_ascii(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per row: ``data[offsets[i]:offsets[i+1]]`` has a byte >= 0x80
    (one numpy pass over the bytes and one reduction per row; several times
    faster than Arrow's ``string_is_ascii``)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    out = np.zeros(max(n, 0), dtype=bool)
    if n <= 0 or offsets[-1] <= offsets[0]:
        return out
    lo, hi = int(offsets[0]), int(offsets[-1])
    high = data[lo:hi] >= 0x80
    rows = np.flatnonzero(np.diff(offsets) > 0)  # reduceat needs non-empty rows
    out[rows] = np.logical_or.reduceat(high, offsets[rows] - lo)
    return out


def well_formed(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per row: ``data[offsets[i]:offsets[i+1]]`` is well-formed UTF-8
    (what Python's strict codec accepts; NUL and controls allowed)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n <= 0:
        return np.ones(max(n, 0), dtype=bool)
    # Bytes that never occur in UTF-8 (C0, C1, F5..FF) condemn their row at
    # once. Binary data shows one early: a window over the first bytes of
    # every row condemns most binary rows before any byte-wise work.
    start, length = offsets[:-1], np.diff(offsets)
    bad = np.zeros(n, dtype=bool)
    fast, mat, inside = _window(data, start, np.minimum(length, _NEVER_WINDOW))
    if len(fast):
        bad[fast] = (((mat >= 0xF5) | ((mat & 0xFE) == 0xC0)) & inside).any(axis=1)
    if bad.any():
        rest = np.flatnonzero(~bad)
        data, offsets = _gather(data, start[rest], length[rest])
    else:
        rest = None
    lo, hi = int(offsets[0]), int(offsets[-1])
    pos = np.flatnonzero(data[lo:hi] >= 0x80) + lo
    if len(pos) == 0:
        return ~bad
    b = data[pos]
    row = np.searchsorted(offsets, pos, side="right") - 1
    never = (b >= 0xF5) | ((b & 0xFE) == 0xC0)
    worse = np.zeros(len(offsets) - 1, dtype=bool)
    worse[row[never]] = True
    ill, _, _ = _classify(data, offsets, pos[~worse[row]], strings=False)
    ill |= worse
    if rest is None:
        return ~ill
    bad[rest] = ill
    return ~bad


_NEVER_WINDOW = 64


def _gather(data: np.ndarray, start: np.ndarray, length: np.ndarray):
    """The bytes of the ranges back to back, and their offsets (for the few
    ranges the fixed-width fast paths leave over)."""
    off = np.zeros(len(start) + 1, dtype=np.int64)
    np.cumsum(length, out=off[1:])
    idx = np.repeat(start - off[:-1], length) + np.arange(off[-1], dtype=np.int64)
    return data[idx], off


def _window(data: np.ndarray, start: np.ndarray, length: np.ndarray):
    """Fixed-width fast path: (rows handled, their bytes as a (k, W) matrix,
    mask of the bytes inside each range). W is the smallest of 16/32/64 that
    covers nearly every range; ranges longer than W, or too close to the end
    of ``data``, are left to the caller's exact path."""
    # the narrowest window that holds at least 95 % of the ranges
    k = len(length)
    width = 64
    for w in (16, 32):
        if np.count_nonzero(length > w) * 20 <= k:
            width = w
            break
    size = len(data)
    fast = np.flatnonzero((length <= width) & (start + width <= size))
    if len(fast) == 0 or size < width:
        return np.zeros(0, dtype=np.int64), None, None
    rows = np.ndarray((size - width + 1,), dtype=f"V{width}", buffer=data, strides=(1,))
    mat = rows[start[fast]].view(np.uint8).reshape(-1, width)
    inside = np.arange(width) < length[fast, None]
    return fast, mat, inside


def string_status(strings: pa.Array) -> np.ndarray:
    """:func:`check_strings` for a ``string``/``binary`` array (null rows are
    OK), on its value buffer in place. (numpy's one pass over the bytes is
    several times faster here than Arrow's ``ascii_is_printable``.)"""
    if len(strings) == 0:
        return np.zeros(0, dtype=np.int8)
    status = check_strings(*value_buffers(strings))
    if strings.null_count:
        status[strings.is_null().to_numpy(zero_copy_only=False)] = OK
    return status


def range_status(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """:func:`string_status` for ranges ``data[start[i]:start[i]+length[i]]``,
    copied back to back by Arrow first."""
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    if len(start) == 0:
        return np.zeros(0, dtype=np.int8)
    return string_status(take_ranges(pa.py_buffer(data), data, start, length))


def has_wildcard(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per string ``values[offsets[i]:offsets[i+1]]``: contains '+' or
    '#' (one pass over the value buffer)."""
    n = len(offsets) - 1
    out = np.zeros(max(n, 0), dtype=bool)
    lo, hi = (int(offsets[0]), int(offsets[-1])) if n > 0 else (0, 0)
    if hi > lo:
        seg = values[lo:hi]
        hit = np.flatnonzero((seg == 0x2B) | (seg == 0x23)) + lo
        out[np.searchsorted(offsets, hit, side="right") - 1] = True
    return out


def range_has_wildcard(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Bool per range: contains '+' or '#'."""
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    out = np.zeros(len(start), dtype=bool)
    if len(start) == 0:
        return out
    fast, mat, inside = _window(data, start, length)
    rest = np.ones(len(start), dtype=bool)
    if len(fast):
        out[fast] = (((mat == 0x2B) | (mat == 0x23)) & inside).any(axis=1)
        rest[fast] = False
    ri = np.flatnonzero(rest)
    if len(ri):
        out[ri] = has_wildcard(*_gather(data, start[ri], length[ri]))
    return out
