"""Variable Byte Integer: boundaries, minimal encoding [MQTT-1.5.5-1], four-byte limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.varint import MAX_VARINT, decode_varint, encode_varint, varint_size

# MQTT 5.0 Table 1-1: boundaries of each size.
BOUNDARIES = [
    (0, "00"), (127, "7F"), (128, "8001"), (16_383, "FF7F"), (16_384, "808001"),
    (2_097_151, "FFFF7F"), (2_097_152, "80808001"), (268_435_455, "FFFFFF7F"),
]


@pytest.mark.parametrize("value, hexed", BOUNDARIES)
def test_table_1_1_boundaries(value, hexed):
    data = bytes.fromhex(hexed)
    assert encode_varint(value) == data
    assert varint_size(value) == len(data)
    assert decode_varint(data, 0, len(data)) == (value, len(data))


@given(st.integers(0, MAX_VARINT))
def test_round_trip(value):
    data = encode_varint(value)
    assert decode_varint(b"\x00" + data + b"\x00", 1, len(data) + 1) == (value, len(data) + 1)


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1])
def test_encode_out_of_range_is_a_caller_error(value):
    with pytest.raises(ValueError):
        encode_varint(value)


@pytest.mark.parametrize("hexed", ["8000", "FF00", "808000", "80808000"],
                         ids=lambda h: f"MQTT-1.5.5-1-{h}")
def test_mqtt_1_5_5_1_non_minimal_encodings(hexed):
    data = bytes.fromhex(hexed)
    assert decode_varint(data, 0, len(data)) == "not-minimal"


def test_lg_varint_length_fifth_byte():
    assert decode_varint(bytes.fromhex("8080808001"), 0, 5) == "too-long"
    assert decode_varint(bytes.fromhex("FFFFFFFF"), 0, 4) == "too-long"


def test_short_input_is_none():
    assert decode_varint(b"", 0, 0) is None
    assert decode_varint(b"\x80\x80", 0, 2) is None
    assert decode_varint(b"\x80\x01", 0, 1) is None  # end bounds the read
