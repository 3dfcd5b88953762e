"""One test per rule the vectorised parser enforces; the test name carries
the rule id. Frames are written byte by byte (commented); each test checks
the rule, the reason code, the anchored error text and that the scalar codec
reports the same rule."""

from __future__ import annotations

import re

import pytest

from bridge.mqtt import Connect, Properties, PubAck, Publish, encode
from bridge.parse import parse_frames
from tests.parse.reference import reference_row



def lp(data: bytes) -> bytes:
    """Two-byte length prefix."""
    return len(data).to_bytes(2, "big") + data


def frame(first: int, body: bytes) -> bytes:
    """Byte 1, a minimal Remaining Length, the body."""
    n = len(body)
    rl = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        rl.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes([first]) + bytes(rl) + body


def publish(topic: bytes = b"a/b", props: bytes = b"\x00", payload: bytes = b"hi", *,
            first: int = 0x30, pid: bytes = b"") -> bytes:
    """A PUBLISH: topic, packet id (give it for QoS > 0), MQTT 5 property block."""
    return frame(first, lp(topic) + pid + props + payload)


def one(frame_bytes: bytes, level=5, alias=None, *, from_client=True, max_packet_bytes=None):
    row = parse_frames([frame_bytes], [level], [alias], from_client=from_client,
                       max_packet_bytes=max_packet_bytes).to_pylist()[0]
    ref = reference_row(frame_bytes, level, alias, from_client, max_packet_bytes)
    assert row["rule"] == ref["rule"], (row["error"], ref)
    return row


def broken(frame_bytes: bytes, rule: str, code: int, level=5, **kw) -> dict:
    row = one(frame_bytes, level, **kw)
    assert row["valid"] is False
    assert row["rule"] == rule
    assert row["error_code"] == code
    assert re.match(rf"^\[{re.escape(rule)}\] \S", row["error"]), row["error"]
    for col in ("topic", "payload", "packet_id", "user_properties"):
        assert row[col] is None
    return row


# -- fixed header -------------------------------------------------------------

def test_mqtt_3_3_1_4_qos3_is_malformed():
    row = broken(publish(first=0x36, pid=b"\x00\x01"), "MQTT-3.3.1-4", 0x81)
    assert row["packet_type"] == 3 and row["qos"] == 3  # the header stays readable


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_3_3_1_2_dup_on_qos0(level):
    props = b"\x00" if level == 5 else b""
    broken(publish(first=0x38, props=props), "MQTT-3.3.1-2", 0x81, level)


def test_mqtt_3_3_1_2_not_checked_for_mqtt_3_1():
    assert one(publish(first=0x38, props=b""), 3)["valid"] is True


@pytest.mark.parametrize("first, rule", [
    (0x41, "MQTT-2.1.3-1"),   # PUBACK with flags 0001
    (0x60, "MQTT-3.6.1-1"),   # PUBREL with flags 0000 instead of 0010
    (0xC1, "MQTT-2.1.3-1"),   # PINGREQ with flags 0001
])
def test_mqtt_2_1_3_1_reserved_flag_bits(first, rule):
    broken(frame(first, b"\x00\x01" if first < 0xC0 else b""), rule, 0x81)


def test_mqtt_2_1_3_1_reserved_flags_not_checked_for_mqtt_3_1():
    assert one(frame(0x41, b"\x00\x01"), 3)["valid"] is True


def test_lg_packet_type_reserved():
    broken(b"\x00\x00", "LG-packet-type-reserved", 0x82)                 # type 0
    broken(b"\xf0\x00", "LG-packet-type-reserved", 0x82, level=4)        # AUTH before MQTT 5


def test_lg_packet_direction():
    broken(b"\xd0\x00", "LG-packet-direction", 0x82)                     # PINGRESP from a client
    broken(b"\xc0\x00", "LG-packet-direction", 0x82, from_client=False)  # PINGREQ from a server


def test_mqtt_3_1_0_1_without_a_protocol_level_only_connect_is_accepted():
    broken(publish(), "MQTT-3.1.0-1", 0x82, level=None)


def test_lg_remaining_length_of_five_bytes():
    broken(b"\x30\xff\xff\xff\xff\x01" + b"\x00" * 8, "LG-remaining-length", 0x81)


def test_mqtt_1_5_5_1_remaining_length_not_minimal():
    # 0x30, Remaining Length 7 written as 0x87 0x00, then a 7-byte body
    broken(b"\x30\x87\x00" + lp(b"a/b") + b"\x00hi", "MQTT-1.5.5-1", 0x81)


@pytest.mark.parametrize("level", [3, 4])
def test_remaining_length_not_minimal_is_valid_in_3_1_and_3_1_1(level):
    # MQTT-1.5.5-1 is MQTT 5's; MQTT 3.1.1 section 2.2.3 (and 3.1) set no
    # minimum on the Remaining Length's bytes, so the edge accepts these.
    row = one(b"\x30\x87\x00" + lp(b"a/b") + b"hi", level)
    assert row["valid"] and (row["remaining_length"], row["topic"], row["payload"]) == (
        7, "a/b", b"hi")
    assert one(b"\xc0\x80\x00", level)["valid"]  # PINGREQ, 0 in two bytes
    connect = encode(Connect.for_level(level, client_id="c"), level)
    row = one(bytes((0x10, connect[1] | 0x80, 0)) + connect[2:], None)  # first CONNECT
    assert row["valid"] and row["connect_protocol_level"] == level


def test_mqtt_3_2_2_15_packet_beyond_the_maximum_packet_size():
    broken(publish(payload=b"x" * 100), "MQTT-3.2.2-15", 0x95, max_packet_bytes=50)
    broken(publish(payload=b"x" * 100), "MQTT-3.1.2-24", 0x95, max_packet_bytes=50,
           from_client=False)


def test_lg_truncated_record_shorter_than_its_remaining_length():
    good = publish()
    broken(good[:-1], "LG-truncated", 0x81)      # one byte missing
    broken(good[:1], "LG-truncated", 0x81)       # only byte 1
    broken(b"", "LG-truncated", 0x81)            # empty record


def test_lg_trailing_bytes_record_longer_than_its_remaining_length():
    broken(publish() + b"\x00", "LG-trailing-bytes", 0x81)


def test_seed_publish_examples_have_wrong_remaining_lengths():
    # Seed 000 section 5.3.6: Remaining Length 0x0E for 13 bytes and 0x0B for 12.
    qos0 = b"\x30\x0e" + lp(b"a/b/c") + b"\x00" + b"test"
    qos1 = b"\x32\x0b" + lp(b"") + b"\x00\x0a" + b"\x03\x23\x00\x01" + b"data"
    broken(qos0, "LG-truncated", 0x81)
    broken(qos1, "LG-trailing-bytes", 0x81, alias="a/b")


# -- PUBLISH variable header ----------------------------------------------------

def test_mqtt_3_3_2_1_topic_name_missing():
    broken(frame(0x30, b"\x00"), "MQTT-3.3.2-1", 0x81)                  # 1 byte: no length
    broken(frame(0x30, b"\x00\x09a/b"), "MQTT-3.3.2-1", 0x81)           # length 9, 3 bytes


def test_mqtt_3_3_2_2_wildcard_in_topic_name():
    broken(publish(b"a/+/c"), "MQTT-3.3.2-2", 0x81)
    broken(publish(b"a/#"), "MQTT-3.3.2-2", 0x81)


@pytest.mark.parametrize("topic", [b"a/\xff", b"a/\xc0\xaf", b"a/\xed\xa0\x80", b"\xe2\x82"])
def test_mqtt_1_5_4_1_topic_ill_formed_utf8_or_surrogate(topic):
    broken(publish(topic), "MQTT-1.5.4-1", 0x81)


def test_mqtt_1_5_4_2_topic_contains_null_character():
    broken(publish(b"a/\x00/b"), "MQTT-1.5.4-2", 0x81)


@pytest.mark.parametrize("topic", [b"a/\x01", b"a/\x7f", b"a/\xc2\x85", b"a/\xef\xbf\xbf"])
def test_lg_utf8_disallowed_code_points_in_topic(topic):
    broken(publish(topic), "LG-utf8-disallowed", 0x81)


def test_ill_formed_utf8_wins_over_null_character():
    broken(publish(b"\x00\xff"), "MQTT-1.5.4-1", 0x81)


def test_lg_truncated_packet_identifier_missing():
    broken(frame(0x32, lp(b"a/b") + b"\x00"), "LG-truncated", 0x81)


def test_mqtt_2_2_1_3_packet_identifier_zero_from_client():
    broken(publish(first=0x32, pid=b"\x00\x00"), "MQTT-2.2.1-3", 0x82)


def test_mqtt_2_2_1_4_packet_identifier_zero_from_server():
    broken(publish(first=0x34, pid=b"\x00\x00"), "MQTT-2.2.1-4", 0x82, from_client=False)


def test_lg_topic_name_empty():
    broken(publish(b""), "LG-topic-name-empty", 0x82)
    broken(publish(b"", props=b""), "LG-topic-name-empty", 0x82, level=4)


# -- PUBLISH properties ---------------------------------------------------------

def test_lg_truncated_property_length_past_the_end():
    broken(publish(props=b"\x09\x01\x01", payload=b""), "LG-truncated", 0x81)


def test_lg_truncated_property_value_of_the_wrong_size():
    # Message Expiry Interval (four bytes) with two: the block ends inside it
    broken(publish(props=b"\x03\x02\x00\x00", payload=b""), "LG-truncated", 0x81)
    # Content Type whose length runs past the block
    broken(publish(props=b"\x04\x03\x00\x05a", payload=b"xxxx"), "LG-truncated", 0x81)


def test_lg_property_unknown():
    broken(publish(props=b"\x02\x2f\x00"), "LG-property-unknown", 0x81)
    broken(publish(props=b"\x03\x81\x01\x00"), "LG-property-unknown", 0x81)  # id 129


def test_mqtt_1_5_5_1_property_identifier_not_minimal():
    broken(publish(props=b"\x03\x81\x00\x00"), "MQTT-1.5.5-1", 0x81)


def test_lg_property_not_allowed_in_publish():
    broken(publish(props=b"\x03\x21\x00\x0a"), "LG-property-not-allowed", 0x81)  # Receive Maximum


def test_lg_property_duplicate():
    broken(publish(props=b"\x04\x01\x00\x01\x01"), "LG-property-duplicate", 0x82)
    broken(publish(props=b"\x06\x23\x00\x01\x23\x00\x02"), "LG-property-duplicate", 0x82)


def test_lg_property_value():
    broken(publish(props=b"\x02\x01\x02"), "LG-property-value", 0x82)  # PFI 2


def test_mqtt_3_3_2_8_topic_alias_zero_is_0x94():
    broken(publish(props=b"\x03\x23\x00\x00"), "MQTT-3.3.2-8", 0x94)


def test_mqtt_3_3_2_14_response_topic_wildcard():
    broken(publish(props=frame_props(b"\x08" + lp(b"r/#"))), "MQTT-3.3.2-14", 0x82)


def test_mqtt_1_5_7_1_user_property_not_utf8():
    broken(publish(props=frame_props(b"\x26" + lp(b"k\xff") + lp(b"v"))), "MQTT-1.5.7-1", 0x81)
    broken(publish(props=frame_props(b"\x26" + lp(b"k") + lp(b"\x00"))), "MQTT-1.5.7-1", 0x81)


def test_mqtt_1_5_4_1_content_type_not_utf8():
    broken(publish(props=frame_props(b"\x03" + lp(b"\xed\xbf\xbf"))), "MQTT-1.5.4-1", 0x81)


def test_lg_varint_length_subscription_identifier_of_five_bytes():
    broken(publish(props=frame_props(b"\x0b\xff\xff\xff\xff\x01")), "LG-varint-length", 0x81,
           from_client=False)


def test_mqtt_3_3_4_6_subscription_identifier_from_a_client():
    frame_bytes = publish(props=frame_props(b"\x0b\x05"))
    broken(frame_bytes, "MQTT-3.3.4-6", 0x82)
    row = one(frame_bytes, from_client=False)  # a broker's PUBLISH may carry it
    assert row["valid"] and row["subscription_identifiers"] == [5]


def test_lg_topic_alias_unmapped_without_resolved_topic():
    broken(publish(b"", props=b"\x03\x23\x00\x07"), "LG-topic-alias-unmapped", 0x82)


def test_lg_payload_format_invalid_is_0x99():
    broken(publish(props=b"\x02\x01\x01", payload=b"\xff\xfe"), "LG-payload-format-invalid", 0x99)


def test_payload_format_indicator_0_allows_any_payload():
    assert one(publish(props=b"\x02\x01\x00", payload=b"\xff\xfe"))["valid"] is True


def test_payload_text_may_contain_control_characters():
    assert one(publish(props=b"\x02\x01\x01", payload=b"a\x00\n\x7f"))["valid"] is True


# -- acknowledgements -------------------------------------------------------------

def test_mqtt_2_2_1_5_ack_packet_identifier_zero():
    broken(b"\x40\x02\x00\x00", "MQTT-2.2.1-5", 0x82)


def test_mqtt_3_4_2_1_puback_reason_code_not_defined():
    broken(b"\x40\x03\x00\x01\x01", "MQTT-3.4.2-1", 0x82)


def test_mqtt_3_6_2_1_pubrel_reason_code_not_defined():
    broken(b"\x62\x03\x00\x01\x10", "MQTT-3.6.2-1", 0x82)


def test_lg_trailing_bytes_in_a_3x_ack():
    broken(b"\x40\x03\x00\x01\x00", "LG-trailing-bytes", 0x81, level=4)


def test_lg_property_not_allowed_in_puback():
    broken(b"\x40\x06\x00\x01\x00\x02\x01\x01", "LG-property-not-allowed", 0x81)


def frame_props(body: bytes) -> bytes:
    """A property block: length + properties (lengths < 128)."""
    return bytes([len(body)]) + body


def test_codec_built_frames_are_valid():
    for f in (encode(Publish(qos=2, topic="x/y", packet_id=9, payload=b"p",
                             properties=Properties(content_type="c")), 5),
              encode(PubAck(packet_id=3), 5)):
        assert one(f)["valid"] is True


# -- a bad string before a later failure ----------------------------------------------
# The parser checks the property strings once per batch, after walking the
# blocks; a row's first bad string must still win over whatever the walk
# found after it, as in the codec (which stops at the string).

CT_BAD = b"\x03" + lp(b"\xff")           # Content Type, not UTF-8
CT_GOOD = b"\x03" + lp(b"text/plain")
RT_WILD = b"\x08" + lp(b"r/#")            # Response Topic with a wildcard
RT_GOOD = b"\x08" + lp(b"r/1")


@pytest.mark.parametrize("props, rule, says", [
    (CT_BAD + b"\x2f\x00", "MQTT-1.5.4-1", "Content Type"),       # then an unknown property
    (CT_BAD + CT_GOOD, "MQTT-1.5.4-1", "Content Type"),           # then a repetition
    (CT_GOOD + CT_BAD, "MQTT-1.5.4-1", "Content Type"),           # the repeated one is bad
    (CT_BAD + b"\x02\x00\x00", "MQTT-1.5.4-1", "Content Type"),   # then a value cut short
    (b"\x26" + lp(b"k\xff") + b"\x00\x09v", "MQTT-1.5.7-1", "name"),  # value past the end
    (b"\x26" + lp(b"k") + lp(b"v\x00") + CT_BAD, "MQTT-1.5.7-1", "value"),
    (b"\x26" + lp(b"k") + lp(b"v") + CT_BAD + b"\x26" + lp(b"\xc0") + lp(b"v"),
     "MQTT-1.5.4-1", "Content Type"),
    (RT_WILD + RT_GOOD, "MQTT-3.3.2-14", "wildcard"),             # then a repetition
    (RT_GOOD + RT_WILD, "MQTT-3.3.2-14", "wildcard"),             # the repeated one has it
    (b"\x08" + lp(b"r/\xff/#"), "MQTT-1.5.4-1", "Response Topic"),  # UTF-8 before wildcards
    (RT_WILD + CT_BAD, "MQTT-3.3.2-14", "wildcard"),
    (CT_GOOD + RT_WILD + b"\x01\x05", "MQTT-3.3.2-14", "wildcard"),  # then a bad value
])
def test_mqtt_1_5_4_1_first_bad_string_wins_over_later_failures(props, rule, says):
    row = broken(publish(props=frame_props(props)), rule, 0x82 if "3.3.2" in rule else 0x81)
    assert says in row["error"]


def test_mqtt_1_5_4_1_bad_reason_string_in_an_ack_wins_over_a_later_failure():
    props = b"\x1f" + lp(b"\xff") + b"\x2f\x00"  # Reason String not UTF-8, then unknown
    broken(b"\x40" + bytes([4 + len(props)]) + b"\x00\x01\x00" + bytes([len(props)]) + props,
           "MQTT-1.5.4-1", 0x81)


def test_strings_of_rows_that_fail_are_not_in_the_output_columns():
    good = publish(props=frame_props(CT_GOOD + b"\x26" + lp(b"k") + lp(b"v")))
    bad = publish(props=frame_props(CT_GOOD + b"\x26" + lp(b"k") + lp(b"v") + CT_BAD))
    late = publish(props=frame_props(RT_GOOD + b"\x26" + lp(b"a") + lp(b"b") + b"\x01\x01"),
                   payload=b"\xff")  # fails after the walk: a payload that is not UTF-8
    rows = parse_frames([good, bad, good, late], 5).to_pylist()
    assert [r["valid"] for r in rows] == [True, False, True, False]
    for r in (rows[0], rows[2]):
        assert r["content_type"] == "text/plain"
        assert r["user_properties"] == [{"key": "k", "value": "v"}]
    for r in (rows[1], rows[3]):
        assert r["content_type"] is None and r["response_topic"] is None
        assert r["user_properties"] is None
    table = parse_frames([good, bad, good], 5)
    # the list column holds only the entries of the valid rows
    assert table.column("user_properties").combine_chunks().values.to_pylist() == \
        [{"key": "k", "value": "v"}] * 2
