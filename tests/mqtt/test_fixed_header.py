"""Fixed header: framing, the size limit before the body, reserved types and flags."""

from __future__ import annotations

import pytest

from bridge.mqtt import (
    IncompleteData, MalformedPacket, PacketType, ProtocolError, decode_packet, frame_length,
)
from bridge.mqtt.fixed_header import encode_fixed_header, parse_fixed_header
from tests.mqtt.helpers import Bad, check_bad, params

M, P = MalformedPacket, ProtocolError

CASES = [
    Bad("LG-remaining-length-five-bytes", None, """
        10              # CONNECT
        FFFFFFFF        # four Remaining Length bytes, all with continuation
        """, M, "LG-remaining-length", 0x81, "Remaining Length continues past its fourth byte"),
    Bad("LG-remaining-length-five-bytes-publish", 5, """
        30 FFFFFFFF7F   # PUBLISH with a five-byte Remaining Length
        0004 4D515454   # whatever follows is never looked at
        """, M, "LG-remaining-length", 0x81, "Remaining Length continues past its fourth byte"),
    Bad("MQTT-1.5.5-1-remaining-length-not-minimal", 5, """
        C0 8000         # PINGREQ with Remaining Length 0 in two bytes
        """, M, "MQTT-1.5.5-1", 0x81,
        "Remaining Length is encoded in 2 bytes, more than the minimum"),
    Bad("MQTT-3.2.2-15-packet-too-large-before-body", 5, """
        30 FF7F         # PUBLISH of 16386 bytes; only the header has arrived
        """, P, "MQTT-3.2.2-15", 0x95,
        "PUBLISH of 16386 bytes exceeds the Maximum Packet Size of 1024 bytes",
        max_packet_bytes=1024),
    Bad("MQTT-3.2.2-15-packet-too-large-3.1.1", 4, """
        32 15           # PUBLISH of 23 bytes
        """, P, "MQTT-3.2.2-15", 0x95,
        "PUBLISH of 23 bytes exceeds the Maximum Packet Size of 20 bytes", max_packet_bytes=20),
    Bad("MQTT-3.1.2-24-packet-too-large-from-server", 5, """
        30 16           # PUBLISH of 24 bytes received by a client
        """, P, "MQTT-3.1.2-24", 0x95,
        "PUBLISH of 24 bytes exceeds the Maximum Packet Size of 20 bytes",
        from_client=False, max_packet_bytes=20),
    Bad("LG-packet-type-reserved-0", 4, """
        00 00           # packet type 0
        """, P, "LG-packet-type-reserved", 0x82, "packet type 0 is reserved"),
    Bad("LG-packet-type-reserved-0-before-connect", None, """
        08              # packet type 0 as the first byte of a connection
        """, P, "LG-packet-type-reserved", 0x82, "packet type 0 is reserved"),
    Bad("MQTT-3.1.0-1-pingreq-before-connect", None, """
        C0 00           # PINGREQ as the first packet
        """, P, "MQTT-3.1.0-1", 0x82, "first packet is PINGREQ, not CONNECT"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_malformed_fixed_header(case: Bad):
    check_bad(case)


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152,
                                    268_435_455])
def test_remaining_length_boundaries(length):
    header = encode_fixed_header(0x30, length)
    assert len(header) == 1 + (1 if length < 128 else 2 if length < 16_384
                               else 3 if length < 2_097_152 else 4)
    fh = parse_fixed_header(header)
    assert (fh.packet_type, fh.remaining_length, fh.header_length) == (3, length, len(header))
    assert frame_length(header) == len(header) + length
    with pytest.raises(ValueError):
        encode_fixed_header(0x30, 268_435_456)


def test_frame_length_needs_the_whole_header():
    assert frame_length(b"") is None
    assert frame_length(b"\x30") is None
    assert frame_length(b"\x30\x80") is None
    assert frame_length(b"\x30\x80\x01") == 3 + 128


def test_size_limit_is_checked_before_the_body_arrives():
    header = encode_fixed_header(0x30, 10_000_000)
    with pytest.raises(ProtocolError) as info:
        frame_length(header, max_packet_bytes=65536)
    assert info.value.reason_code == 0x95
    with pytest.raises(ProtocolError):
        decode_packet(header, 5, max_packet_bytes=65536)
    # At or under the limit the same prefix is just incomplete.
    with pytest.raises(IncompleteData) as inc:
        decode_packet(header, 5, max_packet_bytes=10_000_005)
    assert inc.value.needed == 10_000_005


def test_five_byte_remaining_length_is_detected_at_the_fourth_byte():
    with pytest.raises(MalformedPacket):
        frame_length(b"\x30\xff\xff\xff\xff")
    assert frame_length(b"\x30\xff\xff\xff") is None


# MQTT-1.5.5-1 is MQTT 5's (section 1.5.5). MQTT 3.1.1 section 2.2.3 describes
# the Remaining Length encoding with no minimum-bytes statement ("The maximum
# number of bytes in the Remaining Length field is four" is its only bound),
# and MQTT 3.1 neither: levels 3 and 4 accept a non-minimal one.
NOT_MINIMAL_PUBLISH = b"\x30\x87\x00\x00\x03a/bhi"  # Remaining Length 7 as 0x87 0x00


@pytest.mark.parametrize("level", [3, 4])
def test_remaining_length_not_minimal_is_accepted_in_3_1_and_3_1_1(level):
    p, used = decode_packet(NOT_MINIMAL_PUBLISH, level)
    assert used == 10 and (p.topic, p.payload) == ("a/b", b"hi")
    ping, used = decode_packet(b"\xc0\x80\x80\x00", level)  # 0 in three bytes
    assert used == 4
    assert frame_length(NOT_MINIMAL_PUBLISH, minimal=False) == 10


def test_mqtt_1_5_5_1_remaining_length_not_minimal_is_refused_in_5():
    with pytest.raises(MalformedPacket) as info:
        decode_packet(NOT_MINIMAL_PUBLISH, 5)
    assert info.value.rule == "MQTT-1.5.5-1"


@pytest.mark.parametrize("level, name, accepted", [(3, b"MQIsdp", True), (4, b"MQTT", True),
                                                   (5, b"MQTT", False)])
def test_first_connect_with_a_non_minimal_remaining_length_is_judged_by_its_level(
        level, name, accepted):
    body = len(name).to_bytes(2, "big") + name + bytes((level, 2, 0, 10))
    body += b"\x00" if level == 5 else b""
    body += b"\x00\x01c"
    frame = bytes((0x10, len(body) | 0x80, 0x00)) + body
    # the level is unknown until its byte arrives: a prefix is just incomplete
    with pytest.raises(IncompleteData):
        decode_packet(frame[:5], None)
    if accepted:
        p, used = decode_packet(frame, None)
        assert used == len(frame) and p.protocol_level == level
    else:
        with pytest.raises(MalformedPacket) as info:
            decode_packet(frame[:3 + 2 + len(name) + 1], None)  # judged at the level byte
        assert (info.value.rule, info.value.protocol_level) == ("MQTT-1.5.5-1", 5)


def test_packet_type_enum_matches_the_standard():
    assert [(t.name, t.value) for t in PacketType] == [
        ("CONNECT", 1), ("CONNACK", 2), ("PUBLISH", 3), ("PUBACK", 4), ("PUBREC", 5),
        ("PUBREL", 6), ("PUBCOMP", 7), ("SUBSCRIBE", 8), ("SUBACK", 9), ("UNSUBSCRIBE", 10),
        ("UNSUBACK", 11), ("PINGREQ", 12), ("PINGRESP", 13), ("DISCONNECT", 14), ("AUTH", 15),
    ]


@pytest.mark.parametrize("first", [0x41, 0x52, 0x64, 0x78, 0x81, 0x93, 0xA4, 0xB1, 0xC8,
                                   0xD2, 0xE4])
def test_mqtt_3_1_does_not_check_flag_bits(first):
    # MQTT 3.1 defines no reserved flag values; decoding goes on to the body.
    from_client = first >> 4 not in (9, 11, 13)
    try:
        decode_packet(bytes((first,)), 3, from_client=from_client)
    except IncompleteData:
        pass
