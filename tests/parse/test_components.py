"""The vectorised building blocks against the codec's scalar ones."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from bridge.mqtt.errors import MqttError
from bridge.mqtt.strings import decode_utf8
from bridge.mqtt.varint import decode_varint
from bridge.parse import utf8
from bridge.parse.buffers import (
    ranges_array, read_u16, read_u32, take_range_pairs, take_ranges, view_ranges,
)
from bridge.parse.varint import NOT_MINIMAL, OK, SHORT, TOO_LONG, decode_varints

_STATUS = {"MQTT-1.5.4-1": utf8.ILL_FORMED, "MQTT-1.5.4-2": utf8.NUL,
           "LG-utf8-disallowed": utf8.DISALLOWED}
_PIECES = [b"a", b"/", b" ", b"\x00", b"\x01", b"\x1f", b"\x7f", b"\x80", b"\xbf", b"\xc0",
           b"\xc1", b"\xc2", b"\xc2\x85", b"\xc2\xa0", b"\xdf\xbf", b"\xe0", b"\xe0\x80\x80",
           b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xb7\x90", b"\xef\xb7\xb0",
           b"\xef\xbf\xbe", b"\xef\xbf\xbd", b"\xf0\x90\x80\x80", b"\xf0\x8f\xbf\xbf",
           b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xf0\x9f\xbf\xbf",
           "é€𝄞".encode()]
strings = st.lists(st.sampled_from(_PIECES), max_size=8).map(b"".join)


def reference_status(raw: bytes) -> int:
    try:
        decode_utf8(raw, "s")
    except MqttError as err:
        return _STATUS[err.rule]
    return utf8.OK


def concat(items):
    data = np.frombuffer(b"".join(items) + b"\0", dtype=np.uint8)
    off = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in items], out=off[1:])
    return data, off


@settings(max_examples=200, deadline=None)
@given(st.lists(strings, min_size=1, max_size=40))
def test_check_strings_matches_the_codec(items):
    data, off = concat(items)
    assert utf8.check_strings(data, off).tolist() == [reference_status(x) for x in items]
    # in place, over ranges of a larger buffer
    assert utf8.range_status(data, off[:-1], np.diff(off)).tolist() == \
        [reference_status(x) for x in items]
    assert utf8.well_formed(data, off).tolist() == [_decodes(x) for x in items]
    assert utf8.range_has_wildcard(data, off[:-1], np.diff(off)).tolist() == \
        [b"+" in x or b"#" in x for x in items]


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# long rows: bytes that never occur in UTF-8 inside or past the 64-byte window,
# ill-formed sequences past it, and well-formed multi-byte text
_LONG_ROWS = [b"\xff" + b"a" * 100, b"a" * 63 + b"\xc0" + b"b" * 10, b"a" * 64 + b"\xf5" * 3,
              ("\u00e9" * 60).encode(), b"a" * 70 + b"\xe2\x82", b"a" * 70 + b"\x80",
              "\U0001d11e".encode() * 30, b"", b"\xc3\xa9" * 31 + b"\xc3", b"z" * 200]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_LONG_ROWS) | strings, min_size=1, max_size=30))
def test_well_formed_long_rows_match_the_codec(items):
    """The 64-byte window condemns binary rows early; the other rows still
    get the full check (gathered, or in place when none is condemned)."""
    data, off = concat(items)
    assert utf8.well_formed(data, off).tolist() == [_decodes(x) for x in items]


def test_long_strings_take_the_exact_path():
    items = [b"x" * 100 + b"\xed\xa0\x80", b"y" * 70, b"z" * 65 + b"\x00", b"#" + b"w" * 80]
    data, off = concat(items)
    assert utf8.range_status(data, off[:-1], np.diff(off)).tolist() == [
        utf8.ILL_FORMED, utf8.OK, utf8.NUL, utf8.OK]
    assert utf8.range_has_wildcard(data, off[:-1], np.diff(off)).tolist() == [False, False, False, True]


_VARINT = {None: SHORT, "too-long": TOO_LONG, "not-minimal": NOT_MINIMAL}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=6), st.integers(0, 6))
def test_decode_varints_matches_the_codec(raw, end):
    end = min(end, len(raw))
    data = np.frombuffer(raw + b"\0", dtype=np.uint8)
    value, nxt, status = decode_varints(data, np.array([0]), np.array([end]))
    ref = decode_varint(raw, 0, end)
    if isinstance(ref, tuple):
        assert (status[0], value[0], nxt[0]) == (OK, ref[0], ref[1])
    else:
        assert status[0] == _VARINT[ref]


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.data())
def test_take_ranges_cuts_the_ranges(raw, data):
    n = data.draw(st.integers(1, 20))
    starts = [data.draw(st.integers(0, len(raw))) for _ in range(n)]
    lens = [data.draw(st.integers(0, len(raw) - s)) for s in starts]
    valid = [data.draw(st.booleans()) for _ in range(n)]
    buf = pa.py_buffer(raw)
    arr = take_ranges(buf, np.frombuffer(buf, dtype=np.uint8), np.array(starts), np.array(lens),
                      np.array(valid))
    arr.validate(full=True)
    assert arr.to_pylist() == [raw[s:s + k] if v else None for s, k, v in zip(starts, lens, valid)]


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.data())
def test_take_ranges_in_buffer_order_and_not(raw, data):
    """Ranges in buffer order are cut by Arrow's take over the gaps-and-ranges
    array; the same ranges reversed (not in order) by the binary_view cast.
    Both give the same values."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), min_size=2, max_size=24)))
    starts = np.array(cuts[0:-1:2], dtype=np.int64)
    lens = np.array(cuts[1::2], dtype=np.int64) - starts
    valid = np.array([data.draw(st.booleans()) for _ in starts])
    buf = pa.py_buffer(raw)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    want = [raw[s:s + k] if v else None for s, k, v in zip(starts.tolist(), lens.tolist(), valid)]
    ranges = ranges_array(buf, u8, starts, lens)
    assert ranges is not None and ranges.to_pylist()[1::2] == [raw[s:s + k] for s, k in
                                                               zip(starts.tolist(), lens.tolist())]
    assert take_ranges(buf, u8, starts, lens, valid).to_pylist() == want
    if np.count_nonzero(lens) > 1:
        assert ranges_array(buf, u8, starts[::-1], lens[::-1]) is None
    back = take_ranges(buf, u8, starts[::-1], lens[::-1], valid[::-1])
    back.validate(full=True)
    assert back.to_pylist() == want[::-1]


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=1, max_size=120), st.data())
def test_view_ranges_point_at_the_ranges(raw, data):
    """Any ranges (any order, overlapping, empty, inline up to 12 bytes, up to
    the buffer's last byte) as views: Arrow's full validation (which checks
    each long view's 4-byte prefix against the bytes) passes and the values
    are the slices."""
    n = data.draw(st.integers(1, 30))
    starts = [data.draw(st.integers(0, len(raw))) for _ in range(n)]
    lens = [data.draw(st.integers(0, len(raw) - s)) for s in starts]
    valid = np.array([data.draw(st.booleans()) for _ in range(n)])
    buf = pa.py_buffer(raw)
    arr = view_ranges(buf, np.frombuffer(buf, dtype=np.uint8), np.array(starts), np.array(lens),
                      valid)
    arr.validate(full=True)
    assert arr.type == pa.binary_view() and arr.null_count == n - valid.sum()
    assert arr.to_pylist() == [raw[s:s + k] if v else None for s, k, v in zip(starts, lens, valid)]
    assert view_ranges(buf, np.frombuffer(buf, dtype=np.uint8), np.array(starts),
                       np.array(lens)).to_pylist() == [raw[s:s + k] for s, k in zip(starts, lens)]


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=4, max_size=64), st.data())
def test_read_big_endian_integers(raw, data):
    pos = np.array(data.draw(st.lists(st.integers(0, len(raw) - 4), min_size=1, max_size=10)))
    u8 = np.frombuffer(raw, dtype=np.uint8)
    assert read_u16(u8, pos).tolist() == [int.from_bytes(raw[p:p + 2], "big") for p in pos]
    assert read_u32(u8, pos).tolist() == [int.from_bytes(raw[p:p + 4], "big") for p in pos]


def test_ranges_array_refuses_overlapping_ranges():
    buf = pa.py_buffer(b"abcdefgh")
    u8 = np.frombuffer(buf, dtype=np.uint8)
    assert ranges_array(buf, u8, np.array([0, 2]), np.array([4, 2])) is None
    # an empty range may sit anywhere; a kept range after it is still checked
    arr = ranges_array(buf, u8, np.array([5, 0, 6]), np.array([1, 0, 2]))
    assert arr.to_pylist()[1::2] == [b"f", b"", b"gh"]


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=1, max_size=120), st.data())
def test_take_range_pairs_is_two_take_ranges(raw, data):
    """Pairs in buffer order (name before value, pair before pair, some
    empty) share one value buffer cut by one take; pairs out of order fall
    back to two take_ranges. The values are the slices either way."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), min_size=4, max_size=32)))
    cuts = cuts[:len(cuts) // 4 * 4]
    s1, e1, s2, e2 = (np.array(cuts[i::4], dtype=np.int64) for i in range(4))
    buf = pa.py_buffer(raw)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    for order in (slice(None), slice(None, None, -1)):
        a, b = s1[order], s2[order]
        la, lb = (e1 - s1)[order], (e2 - s2)[order]
        first, second = take_range_pairs(buf, u8, a, la, b, lb)
        first.validate(full=True)
        second.validate(full=True)
        assert first.to_pylist() == [raw[x:x + k] for x, k in zip(a.tolist(), la.tolist())]
        assert second.to_pylist() == [raw[x:x + k] for x, k in zip(b.tolist(), lb.tolist())]
        if order == slice(None) and len(a):
            assert first.buffers()[2].address == second.buffers()[2].address


@settings(max_examples=150, deadline=None)
@given(st.lists(strings, max_size=12), st.binary(max_size=3))
def test_has_non_ascii_per_row(rows, pad):
    """Rows back to back (empty rows included, the first one not at offset
    0): a row has a byte >= 0x80 exactly when it is not ASCII."""
    raw = pad + b"".join(rows)
    offsets = np.cumsum([len(pad)] + [len(r) for r in rows])
    got = utf8.has_non_ascii(np.frombuffer(raw or b"\0", dtype=np.uint8), offsets)
    assert got.tolist() == [not r.isascii() for r in rows]
