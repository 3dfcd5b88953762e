"""Vectorised Variable Byte Integer decoding (MQTT 5.0 section 1.5.5).

:func:`decode_varints` decodes one integer per row at ``pos`` without reading
at or past ``end``, for all rows at once (masked byte reads over the rows
that still need a byte: no loop over rows). Outcomes mirror
:func:`bridge.mqtt.varint.decode_varint` exactly:

* ``OK`` -- ``value`` and ``next`` are set;
* ``SHORT`` -- ``end`` was reached before the last byte;
* ``TOO_LONG`` -- the fourth byte still has its continuation bit;
* ``NOT_MINIMAL`` -- the last byte is 0 after a continuation [MQTT-1.5.5-1].

Runs on executors; numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NOT_MINIMAL", "OK", "SHORT", "TOO_LONG", "decode_varints"]

OK, SHORT, TOO_LONG, NOT_MINIMAL = 0, 1, 2, 3


def decode_varints(data: np.ndarray, pos: np.ndarray, end: np.ndarray):
    """Return ``(value, next, status)`` int64/int64/int8 arrays for the
    integers starting at ``data[pos]`` and bounded by ``end`` (exclusive)."""
    n = len(pos)
    pos = np.asarray(pos, dtype=np.int64)
    status = np.full(n, SHORT, dtype=np.int8)
    if n == 0:
        return np.zeros(0, dtype=np.int64), pos.copy(), status
    last = len(data) - 1
    have = pos < end
    first = data[np.minimum(pos, last)]
    if not (first >= 0x80).any() and have.all():
        # every integer is one byte long (the common case): nothing to loop over
        return first.astype(np.int64), pos + 1, np.zeros(n, dtype=np.int8)
    first = first.astype(np.int64)
    value = np.where(have, first & 0x7F, 0)
    one = have & (first < 0x80)
    status[one] = OK
    nxt = pos + 1
    # only integers that continue are read further (one byte is the common case)
    idx = np.flatnonzero(have & (first >= 0x80))
    for k in range(1, 4):
        if len(idx) == 0:
            break
        at = pos[idx] + k
        ok = at < end[idx]
        idx = idx[ok]
        at = at[ok]
        byte = data[at].astype(np.int64)
        value[idx] |= (byte & 0x7F) << (7 * k)
        stop = byte < 0x80
        done = idx[stop]
        status[done] = np.where(byte[stop] == 0, NOT_MINIMAL, OK)
        nxt[done] = at[stop] + 1
        idx = idx[~stop]
    status[idx] = TOO_LONG
    return value, nxt, status
