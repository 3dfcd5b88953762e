"""UTF-8 Encoded Strings [MQTT-1.5.4-1/-2/-3], String Pairs [MQTT-1.5.7-1], Binary Data."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt import MalformedPacket
from bridge.mqtt.strings import decode_utf8, encode_binary, encode_string, string_problem


@pytest.mark.parametrize("raw, rule, message", [
    (b"\xed\xa0\x80", "MQTT-1.5.4-1", "Topic encodes a surrogate code point at byte 0"),
    (b"a\xed\xbf\xbf", "MQTT-1.5.4-1", "Topic encodes a surrogate code point at byte 1"),
    (b"\xc0\x80", "MQTT-1.5.4-1", "Topic is not well-formed UTF-8 at byte 0"),
    (b"\xf4\x90\x80\x80", "MQTT-1.5.4-1", "Topic is not well-formed UTF-8 at byte 0"),
    (b"ab\xe2\x82", "MQTT-1.5.4-1", "Topic is not well-formed UTF-8 at byte 2"),
    (b"a\x00", "MQTT-1.5.4-2", "Topic contains U+0000"),
    (b"\x1f", "LG-utf8-disallowed", "Topic contains the disallowed code point U+001F"),
    (b"\x7f", "LG-utf8-disallowed", "Topic contains the disallowed code point U+007F"),
    (b"\xc2\x80", "LG-utf8-disallowed", "Topic contains the disallowed code point U+0080"),
    (b"\xef\xb7\x90", "LG-utf8-disallowed", "Topic contains the disallowed code point U+FDD0"),
    (b"\xf4\x8f\xbf\xbe", "LG-utf8-disallowed",
     "Topic contains the disallowed code point U+10FFFE"),
], ids=lambda v: v if isinstance(v, str) and v.startswith(("MQTT", "LG")) else None)
def test_string_rules(raw, rule, message):
    with pytest.raises(MalformedPacket) as info:
        decode_utf8(memoryview(raw), "Topic")
    assert info.value.rule == rule
    assert str(info.value) == f"[{rule}] {message}"


def test_mqtt_1_5_7_1_pair_reports_its_own_rule():
    with pytest.raises(MalformedPacket) as info:
        decode_utf8(b"\x00", "User Property name", pair=True)
    assert str(info.value) == "[MQTT-1.5.7-1] User Property name contains U+0000"
    with pytest.raises(MalformedPacket) as info:
        decode_utf8(b"\x01", "User Property value", pair=True)
    assert info.value.rule == "LG-utf8-disallowed"


def test_mqtt_1_5_4_3_bom_is_kept():
    assert decode_utf8(b"\xef\xbb\xbfa", "Topic") == "\ufeffa"


@given(st.text(st.characters(blacklist_categories=("Cs", "Cc"),
                             blacklist_characters="\ufffe\uffff")))
def test_valid_text_round_trips(text):
    data = encode_string(text)
    if string_problem(text) is None:
        assert decode_utf8(data[2:], "s") == text


def test_length_limits():
    assert encode_string("x" * 65535)[:2] == b"\xff\xff"
    with pytest.raises(ValueError):
        encode_string("x" * 65536)
    with pytest.raises(ValueError):
        encode_binary(b"x" * 65536)
    with pytest.raises(ValueError):
        encode_string("\udc80")
