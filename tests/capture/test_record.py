import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.capture.record import (
    FIXED_SIZE,
    INCOMPLETE,
    MAGIC,
    RecordFields,
    check_record,
    decode_record,
    encode_headers,
    encode_record,
    partition_for,
)
from schemas.capture import HEADER_KEYS

CALLER_KEYS = sorted(set(HEADER_KEYS) - {"seq"})


def _rec(offset=7, seq=99, ts=1_700_000_000_123_456, key=b"client", value=b"\x30\x03a/b",
         hdrs=(("conn_id", b"c1"), ("origin", b"client"))):
    blob, n = encode_headers(hdrs)
    return encode_record(offset, seq, ts, key, value, blob, n)


def test_round_trip_fields_and_headers():
    data = _rec()
    f = check_record(data, 0, len(data))
    assert isinstance(f, RecordFields)
    assert (f.offset, f.seq, f.timestamp_us, f.size) == (7, 99, 1_700_000_000_123_456, len(data))
    r = decode_record(data, f, partition=3)
    assert (r.partition, r.key, r.value) == (3, b"client", b"\x30\x03a/b")
    assert r.headers == [("conn_id", b"c1"), ("origin", b"client"), ("seq", b"99")]
    assert "a/b" not in repr(r) and "value_bytes=5" in repr(r)  # sizes, never payloads


def test_layout_is_documented_one():
    data = _rec()
    assert data[:4] == MAGIC
    (crc,) = struct.unpack_from("<I", data, 4)
    assert crc == zlib.crc32(data[8:])
    assert struct.unpack_from("<I", data, 8)[0] == len(data)
    assert struct.unpack_from("<Q", data, 12)[0] == 7
    assert len(data) == FIXED_SIZE + len(b"client") + 5 + 2 * 6 + len(b"conn_idc1originclient")


def test_every_proper_prefix_is_incomplete():
    data = _rec()
    for n in range(len(data)):
        assert check_record(data[:n], 0, n) == INCOMPLETE, n


@pytest.mark.parametrize("at", [4, 8, 12, 20, 28, 40, 52, -1])
def test_any_flipped_byte_is_detected(at):
    data = bytearray(_rec())
    data[at] ^= 0x01
    got = check_record(bytes(data), 0, len(data))
    assert got in ("CRC mismatch", "implausible size", INCOMPLETE)


def test_bad_magic():
    data = b"XXXX" + _rec()[4:]
    assert check_record(data, 0, len(data)) == "bad magic"


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(0, 2**63 - 1), seq=st.integers(0, 2**63 - 1), ts=st.integers(-(2**62), 2**62),
    key=st.binary(max_size=40), value=st.binary(max_size=300),
    hdrs=st.lists(st.tuples(st.sampled_from(CALLER_KEYS), st.binary(max_size=30)), max_size=6),
    flip=st.integers(0, 10_000),
)
def test_fuzz_round_trip_and_single_bit_flips(offset, seq, ts, key, value, hdrs, flip):
    blob, n = encode_headers(hdrs)
    data = encode_record(offset, seq, ts, key, value, blob, n)
    f = check_record(data, 0, len(data))
    r = decode_record(data, f, 0)
    assert (r.offset, r.seq, r.timestamp_us, r.key, r.value, list(r.stored_headers)) == (offset, seq, ts, key, value, hdrs)
    bad = bytearray(data)
    bad[flip % len(bad)] ^= 1 << (flip % 8)
    assert not isinstance(check_record(bytes(bad), 0, len(bad)), RecordFields)


def test_unknown_header_key_is_refused():
    with pytest.raises(ValueError, match=r"^unknown capture header key 'conn'; known keys are in schemas\.capture\.HEADER_KEYS$"):
        encode_headers([("conn", b"x")])


def test_seq_header_belongs_to_the_log():
    with pytest.raises(ValueError, match=r"^header 'seq' is assigned by the capture log"):
        encode_headers([("seq", b"1")])


def test_header_values_must_be_bytes():
    with pytest.raises(TypeError, match="value must be bytes"):
        encode_headers([("origin", "client")])


def test_partition_is_a_stable_hash():
    # CRC-32 of the UTF-8 key mod N: the same in every process and Python version.
    assert partition_for("edge:1", 4) == zlib.crc32(b"edge:1") % 4
    assert {partition_for(f"c{i}", 4) for i in range(100)} == {0, 1, 2, 3}
