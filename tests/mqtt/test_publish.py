"""PUBLISH: malformed-input table (layer 3) and the session helpers."""

from __future__ import annotations

import re

import pytest

from bridge.mqtt import (
    MalformedPacket, Properties, ProtocolError, Publish, check_payload_format, check_topic_alias,
    decode_packet,
)
from bridge.mqtt.publish import decode_publish
from tests.mqtt.helpers import Bad, check_bad, params, wire

M, P = MalformedPacket, ProtocolError

CASES = [
    Bad("MQTT-3.3.1-4-qos3-is-malformed", 4, """
        36              # PUBLISH, QoS bits 11
        0E              # Remaining Length 14
        0005 746F706963 # Topic Name "topic"
        7061796C6F6164  # payload "payload"
        """, M, "MQTT-3.3.1-4", 0x81, "PUBLISH has both QoS bits set"),
    Bad("MQTT-3.3.1-4-qos3-is-malformed-in-3.1", 3, """
        3E              # PUBLISH, DUP, QoS bits 11
        10              # Remaining Length 16
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        7061796C6F6164  # payload
        """, M, "MQTT-3.3.1-4", 0x81, "PUBLISH has both QoS bits set"),
    Bad("MQTT-3.3.1-4-qos3-judged-from-byte-1", 5, """
        36              # PUBLISH, QoS bits 11 -- nothing else has arrived yet
        """, M, "MQTT-3.3.1-4", 0x81, "PUBLISH has both QoS bits set"),
    Bad("MQTT-3.3.1-2-dup-on-qos0-is-malformed", 5, """
        38              # PUBLISH, DUP 1, QoS 0
        0F              # Remaining Length 15
        0005 746F706963 # Topic Name "topic"
        00              # Property Length 0
        7061796C6F6164  # payload
        """, M, "MQTT-3.3.1-2", 0x81, "PUBLISH has DUP set with QoS 0"),
    Bad("MQTT-3.3.2-1-topic-missing", 4, """
        30              # PUBLISH QoS 0
        01              # Remaining Length 1
        00              # half a Topic Name length
        """, M, "MQTT-3.3.2-1", 0x81, "PUBLISH ends before the Topic Name"),
    Bad("MQTT-3.3.2-1-topic-runs-past-end", 5, """
        30              # PUBLISH QoS 0
        04              # Remaining Length 4
        0005 746F       # Topic Name claims 5 bytes, 2 present
        """, M, "MQTT-3.3.2-1", 0x81, "PUBLISH Topic Name of 5 bytes runs past the end"),
    Bad("MQTT-3.3.2-2-plus-in-topic", 4, """
        30              # PUBLISH QoS 0
        0E              # Remaining Length 14
        0005 2B6F706963 # Topic Name "+opic"
        7061796C6F6164  # payload
        """, M, "MQTT-3.3.2-2", 0x81, "PUBLISH Topic Name contains a wildcard character"),
    Bad("MQTT-3.3.2-2-hash-in-topic", 5, """
        30              # PUBLISH QoS 0
        0F              # Remaining Length 15
        0005 236F706963 # Topic Name "#opic"
        00              # Property Length 0
        7061796C6F6164  # payload
        """, M, "MQTT-3.3.2-2", 0x81, "PUBLISH Topic Name contains a wildcard character"),
    Bad("MQTT-1.5.4-2-null-in-topic", 4, """
        30              # PUBLISH QoS 0
        0E              # Remaining Length 14
        0005 746F700000 # Topic Name "top" U+0000 U+0000
        7061796C6F6164  # payload
        """, M, "MQTT-1.5.4-2", 0x81, r"Topic Name contains U\+0000"),
    Bad("MQTT-1.5.4-1-surrogate-in-topic", 5, """
        30              # PUBLISH QoS 0
        0F              # Remaining Length 15
        0005 746FEDA080 # Topic Name "to" + encoded U+D800
        00              # Property Length 0
        7061796C6F6164  # payload
        """, M, "MQTT-1.5.4-1", 0x81, "Topic Name encodes a surrogate code point at byte 2"),
    Bad("MQTT-1.5.4-1-ill-formed-topic", 4, """
        30              # PUBLISH QoS 0
        0E              # Remaining Length 14
        0005 746F70FF70 # Topic Name with byte FF (never valid UTF-8)
        7061796C6F6164  # payload
        """, M, "MQTT-1.5.4-1", 0x81, "Topic Name is not well-formed UTF-8 at byte 3"),
    Bad("MQTT-1.5.4-1-overlong-slash", 4, """
        30              # PUBLISH QoS 0
        09              # Remaining Length 9
        0003 61C0AF     # Topic Name "a" + overlong encoding of "/"
        7061796C        # payload
        """, M, "MQTT-1.5.4-1", 0x81, "Topic Name is not well-formed UTF-8 at byte 1"),
    Bad("LG-utf8-disallowed-control-in-topic", 4, """
        30              # PUBLISH QoS 0
        0E              # Remaining Length 14
        0005 746F700170 # Topic Name "top" U+0001 "p"
        7061796C6F6164  # payload
        """, M, "LG-utf8-disallowed", 0x81,
        r"Topic Name contains the disallowed code point U\+0001"),
    Bad("LG-utf8-disallowed-c1-control-in-topic", 5, """
        30              # PUBLISH QoS 0
        0F              # Remaining Length 15
        0005 746FC29F70 # Topic Name "to" U+009F "p"
        00              # Property Length 0
        7061796C6F6164  # payload
        """, M, "LG-utf8-disallowed", 0x81,
        r"Topic Name contains the disallowed code point U\+009F"),
    Bad("LG-utf8-disallowed-noncharacter-in-topic", 5, """
        30              # PUBLISH QoS 0
        0F              # Remaining Length 15
        0005 74EFBFBF70 # Topic Name "t" U+FFFF "p"
        00              # Property Length 0
        7061796C6F6164  # payload
        """, M, "LG-utf8-disallowed", 0x81,
        r"Topic Name contains the disallowed code point U\+FFFF"),
    Bad("LG-topic-name-empty-3.1.1", 4, """
        30              # PUBLISH QoS 0
        09              # Remaining Length 9
        0000            # Topic Name ""
        7061796C6F6164  # payload
        """, P, "LG-topic-name-empty", 0x82, "PUBLISH has an empty Topic Name"),
    Bad("LG-topic-name-empty-without-alias-5", 5, """
        30              # PUBLISH QoS 0
        0A              # Remaining Length 10
        0000            # Topic Name ""
        00              # Property Length 0 (no Topic Alias)
        7061796C6F6164  # payload
        """, P, "LG-topic-name-empty", 0x82,
        "PUBLISH has an empty Topic Name and no Topic Alias"),
    Bad("MQTT-2.2.1-3-packet-id-0-from-client", 5, """
        32              # PUBLISH QoS 1
        11              # Remaining Length 17
        0005 746F706963 # Topic Name "topic"
        0000            # Packet Identifier 0
        00              # Property Length 0
        7061796C6F6164  # payload
        """, P, "MQTT-2.2.1-3", 0x82, "PUBLISH with QoS 1 has Packet Identifier 0"),
    Bad("MQTT-2.2.1-4-packet-id-0-from-server", 4, """
        34              # PUBLISH QoS 2
        10              # Remaining Length 16
        0005 746F706963 # Topic Name "topic"
        0000            # Packet Identifier 0
        7061796C6F6164  # payload
        """, P, "MQTT-2.2.1-4", 0x82, "PUBLISH with QoS 2 has Packet Identifier 0",
        from_client=False),
    Bad("LG-truncated-packet-id-missing-for-qos1", 4, """
        32              # PUBLISH QoS 1
        07              # Remaining Length 7
        0005 746F706963 # Topic Name "topic", then nothing
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the Packet Identifier"),
    Bad("LG-truncated-packet-id-half-present", 4, """
        32              # PUBLISH QoS 1
        08              # Remaining Length 8
        0005 746F706963 # Topic Name "topic"
        12              # one byte of the Packet Identifier
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the Packet Identifier"),
    Bad("MQTT-3.3.2-8-topic-alias-0", 5, """
        30              # PUBLISH QoS 0
        0B              # Remaining Length 11
        0005 746F706963 # Topic Name "topic"
        03              # Property Length 3
        23 0000         # Topic Alias 0
        """, P, "MQTT-3.3.2-8", 0x94, "PUBLISH has Topic Alias 0"),
    Bad("MQTT-3.3.4-6-subscription-identifier-from-client", 5, """
        32              # PUBLISH QoS 1
        13              # Remaining Length 19
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        02              # Property Length 2
        0B 01           # Subscription Identifier 1
        7061796C6F6164  # payload
        """, P, "MQTT-3.3.4-6", 0x82, "PUBLISH from a Client contains a Subscription Identifier"),
    Bad("MQTT-3.3.2-14-response-topic-wildcard", 5, """
        32              # PUBLISH QoS 1
        15              # Remaining Length 21
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        04              # Property Length 4
        08 0001 23      # Response Topic "#"
        7061796C6F6164  # payload
        """, P, "MQTT-3.3.2-14", 0x82, "Response Topic contains a wildcard character"),
    Bad("LG-property-duplicate-payload-format-indicator", 5, """
        32              # PUBLISH QoS 1
        15              # Remaining Length 21
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        04              # Property Length 4
        01 01           # Payload Format Indicator 1
        01 01           # Payload Format Indicator 1 again
        7061796C6F6164  # payload
        """, P, "LG-property-duplicate", 0x82,
        "Payload Format Indicator appears more than once in PUBLISH"),
    Bad("LG-property-duplicate-topic-alias", 5, """
        32              # PUBLISH QoS 1
        17              # Remaining Length 23
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        06              # Property Length 6
        23 0001         # Topic Alias 1
        23 0002         # Topic Alias 2
        7061796C6F6164  # payload
        """, P, "LG-property-duplicate", 0x82, "Topic Alias appears more than once in PUBLISH"),
    Bad("LG-property-not-allowed-reason-string", 5, """
        32              # PUBLISH QoS 1
        15              # Remaining Length 21
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        04              # Property Length 4
        1F 0001 70      # Reason String "p" (not a PUBLISH property)
        7061796C6F6164  # payload
        """, M, "LG-property-not-allowed", 0x81, r"Reason String \(0x1F\) is not allowed in PUBLISH"),
    Bad("LG-property-not-allowed-will-delay", 5, """
        32              # PUBLISH QoS 1
        16              # Remaining Length 22
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        05              # Property Length 5
        18 00000001     # Will Delay Interval (Will Properties only)
        7061796C6F6164  # payload
        """, M, "LG-property-not-allowed", 0x81,
        r"Will Delay Interval \(0x18\) is not allowed in PUBLISH"),
    Bad("LG-property-unknown-0x04", 5, """
        32              # PUBLISH QoS 1
        13              # Remaining Length 19
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        02              # Property Length 2
        04 01           # property 0x04 does not exist
        7061796C6F6164  # payload
        """, M, "LG-property-unknown", 0x81, "PUBLISH has unknown property identifier 0x04"),
    Bad("LG-property-unknown-0x80-two-byte-id", 5, """
        32              # PUBLISH QoS 1
        14              # Remaining Length 20
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        03              # Property Length 3
        8001 01         # property identifier 128 (a Variable Byte Integer)
        7061796C6F6164  # payload
        """, M, "LG-property-unknown", 0x81, "PUBLISH has unknown property identifier 0x80"),
    Bad("MQTT-1.5.5-1-property-id-not-minimal", 5, """
        32              # PUBLISH QoS 1
        14              # Remaining Length 20
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        03              # Property Length 3
        8000 01         # identifier 0 encoded in two bytes
        7061796C6F6164  # payload
        """, M, "MQTT-1.5.5-1", 0x81, "PUBLISH property identifier is not minimally encoded"),
    Bad("LG-property-value-payload-format-indicator-2", 5, """
        32              # PUBLISH QoS 1
        13              # Remaining Length 19
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        02              # Property Length 2
        01 02           # Payload Format Indicator 2
        7061796C6F6164  # payload
        """, P, "LG-property-value", 0x82, "Payload Format Indicator is 2, not 0 or 1"),
    Bad("LG-property-value-subscription-identifier-0-from-server", 5, """
        32              # PUBLISH QoS 1
        13              # Remaining Length 19
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        02              # Property Length 2
        0B 00           # Subscription Identifier 0
        7061796C6F6164  # payload
        """, P, "LG-property-value", 0x82, "Subscription Identifier is 0", from_client=False),
    Bad("MQTT-1.5.5-1-subscription-identifier-not-minimal", 5, """
        32              # PUBLISH QoS 1
        14              # Remaining Length 20
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        03              # Property Length 3
        0B 8000         # Subscription Identifier 0 in two bytes
        7061796C6F6164  # payload
        """, M, "MQTT-1.5.5-1", 0x81, "PUBLISH Subscription Identifier is not minimally encoded"),
    Bad("LG-varint-length-subscription-identifier-5-bytes", 5, """
        32              # PUBLISH QoS 1
        17              # Remaining Length 23
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        06              # Property Length 6
        0B 8080808001   # Subscription Identifier in five bytes
        7061796C6F6164  # payload
        """, M, "LG-varint-length", 0x81,
        "PUBLISH Subscription Identifier is longer than four bytes"),
    Bad("LG-truncated-property-value-missing", 5, """
        32              # PUBLISH QoS 1
        12              # Remaining Length 18
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        01              # Property Length 1
        01              # Payload Format Indicator, value outside the block
        7061796C6F6164  # payload
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the Payload Format Indicator value"),
    Bad("LG-truncated-string-property-missing", 5, """
        32              # PUBLISH QoS 1
        12              # Remaining Length 18
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        01              # Property Length 1
        08              # Response Topic, no length
        7061796C6F6164  # payload
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the Response Topic"),
    Bad("LG-truncated-property-length-past-end", 5, """
        32              # PUBLISH QoS 1
        0A              # Remaining Length 10
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        05              # Property Length 5, nothing follows
        """, M, "LG-truncated", 0x81, "PUBLISH Property Length 5 runs past the end of the packet"),
    Bad("LG-truncated-property-length-missing", 5, """
        32              # PUBLISH QoS 1
        09              # Remaining Length 9
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier, then no Property Length
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the Property Length"),
    Bad("MQTT-1.5.7-1-user-property-name-with-null", 5, """
        32              # PUBLISH QoS 1
        11              # Remaining Length 17
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        07              # Property Length 7
        26 0001 00      # User Property name U+0000
           0001 71      # value "q"
        """, M, "MQTT-1.5.7-1", 0x81, r"User Property name contains U\+0000"),
    Bad("MQTT-1.5.7-1-user-property-value-ill-formed", 5, """
        32              # PUBLISH QoS 1
        11              # Remaining Length 17
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        07              # Property Length 7
        26 0001 70      # User Property name "p"
           0001 C3      # value: a lone UTF-8 lead byte
        """, M, "MQTT-1.5.7-1", 0x81, "User Property value is not well-formed UTF-8 at byte 0"),
    Bad("LG-truncated-user-property-missing-value", 5, """
        32              # PUBLISH QoS 1
        15              # Remaining Length 21
        0005 746F706963 # Topic Name "topic"
        1234            # Packet Identifier
        04              # Property Length 4
        26 0001 70      # User Property name "p", no value
        7061796C6F6164  # payload
        """, M, "LG-truncated", 0x81, "PUBLISH ends before the User Property value"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_malformed_publish(case: Bad):
    err = check_bad(case)
    assert err.protocol_level == case.level


def test_topic_alias_with_empty_topic_is_accepted_by_the_decoder():
    frame = wire("""
        32              # PUBLISH QoS 1
        0C              # Remaining Length 12
        0000            # Topic Name "" (alias in use)
        000A            # Packet Identifier 10
        03              # Property Length 3
        23 0001         # Topic Alias 1
        64617461        # payload "data"
    """)
    packet, used = decode_packet(frame, 5)
    assert (packet.topic, packet.properties.topic_alias, packet.payload) == ("", 1, b"data")
    assert used == 14


def test_payload_is_everything_after_the_properties():
    packet, _ = decode_packet(wire("31 07 0005 746F706963"), 4)  # retained, empty payload
    assert packet == Publish(retain=True, topic="topic")
    big = Publish(topic="t", payload=b"\x00\xff" * 100_000)
    from bridge.mqtt import encode
    assert decode_packet(encode(big, 5), 5)[0] == big


def test_u_plus_feff_and_supplementary_characters_are_kept():
    packet, _ = decode_packet(wire("30 0E 0005 41F0AA9B94 7061796C6F6164"), 4)
    assert packet.topic == "A\U0002A6D4"
    packet, _ = decode_packet(wire("30 07 0003 EFBBBF 7061"), 4)
    assert packet.topic == "\ufeff"  # MQTT-1.5.4-3: not stripped


def test_dup_on_qos0_is_tolerated_in_mqtt_3_1():
    packet, _ = decode_packet(wire("38 07 0005 746F706963"), 3)
    assert packet.dup and packet.qos == 0


def test_direct_decoder_also_rejects_qos3():
    with pytest.raises(MalformedPacket, match=r"^\[MQTT-3\.3\.1-4\] "):
        decode_publish(memoryview(wire("0005 746F706963")), 0, 7, 0x06, 4, True)


def test_repr_shows_payload_size_never_bytes():
    p = Publish(qos=1, topic="t", packet_id=1, payload=b"secret-payload",
                properties=Properties(correlation_data=b"corr"))
    text = repr(p)
    assert "secret" not in text and "corr'" not in text
    assert "payload=<14 bytes>" in text and "correlation_data=<4 bytes>" in text


# -- session helpers ----------------------------------------------------------

def test_mqtt_3_3_2_9_topic_alias_above_maximum_helper():
    p = Publish(topic="t", properties=Properties(topic_alias=11))
    with pytest.raises(ProtocolError) as info:
        check_topic_alias(p, 10)
    err = info.value
    assert (err.rule, err.reason_code) == ("MQTT-3.3.2-9", 0x94)
    assert re.fullmatch(r"\[MQTT-3\.3\.2-9\] PUBLISH Topic Alias 11 exceeds the Topic Alias "
                        r"Maximum 10", str(err))
    check_topic_alias(p, 11)
    check_topic_alias(Publish(topic="t"), 0)
    with pytest.raises(ProtocolError, match=r"^\[MQTT-3\.3\.2-11\] "):
        check_topic_alias(p, 0, from_client=False)


def test_lg_payload_format_invalid_helper():
    bad = Publish(topic="t", payload=b"\xff", properties=Properties(payload_format_indicator=1))
    with pytest.raises(ProtocolError) as info:
        check_payload_format(bad)
    assert (info.value.rule, info.value.reason_code) == ("LG-payload-format-invalid", 0x99)
    assert re.fullmatch(r"\[LG-payload-format-invalid\] PUBLISH payload of 1 bytes is not UTF-8 "
                        r"\(byte 0\) although Payload Format Indicator is 1", str(info.value))
    check_payload_format(Publish(topic="t", payload=b"\xff"))
    check_payload_format(Publish(topic="t", payload="é".encode(),
                                 properties=Properties(payload_format_indicator=1)))


# A PUBLISH with a one-byte Remaining Length takes the codec's fast path; the
# same frame with the Remaining Length in two bytes (allowed in 3.1 and
# 3.1.1, section 2.2.3) takes the general one. Both must give the same
# packet, or the same error with the same rule.
_BODIES = [
    (0x30, b"\x00\x03a/b" + b"hello"),                  # QoS 0
    (0x32, b"\x00\x03a/b\x00\x07" + b"x" * 64),         # QoS 1
    (0x3D, b"\x00\x03a/b\x00\x07" + b"x"),              # QoS 2, DUP, RETAIN
    (0x38, b"\x00\x03a/bp"),                            # DUP with QoS 0 [MQTT-3.3.1-2] in 3.1.1
    (0x36, b"\x00\x03a/b\x00\x07"),                     # QoS 3 [MQTT-3.3.1-4]
    (0x32, b"\x00\x03a/+\x00\x07"),                     # wildcard [MQTT-3.3.2-2]
    (0x30, b"\x00\x00p"),                               # empty Topic Name
    (0x32, b"\x00\x03a/b\x00\x00"),                     # Packet Identifier 0 [MQTT-2.2.1-3]
    (0x30, b"\x00\x09a/b"),                             # Topic Name past the end
    (0x32, b"\x00\x03a/b\x00"),                         # Packet Identifier cut short
    (0x30, b"\x00"),                                    # no Topic Name length
    (0x30, b"\x00\x02\xc3\x28"),                        # not UTF-8 [MQTT-1.5.4-1]
    (0x30, b"\x00\x02a\x00"),                           # U+0000 [MQTT-1.5.4-2]
]


def _outcome(frame: bytes, level: int):
    from bridge.mqtt import MqttError
    from bridge.mqtt.codec import decode_packet

    try:
        packet, _used = decode_packet(frame, level)
    except MqttError as err:
        return ("error", err.rule, err.reason_code, err.packet_type, err.protocol_level, str(err))
    return ("ok", packet)


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("b0, body", _BODIES)
def test_publish_fast_path_agrees_with_the_general_decoder(level, b0, body):
    short = bytes((b0, len(body))) + body
    long = bytes((b0, 0x80 | len(body), 0x00)) + body  # the same length in two bytes
    fast, slow = _outcome(short, level), _outcome(long, level)
    if fast[0] == "ok":
        assert slow[0] == "ok" and fast[1] == slow[1]
    else:
        assert fast == slow
