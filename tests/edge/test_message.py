"""The PUBLISH the edge sends to a subscriber (bridge/edge/message.py), built
from the frame as it was captured. Sans-IO: bytes in, bytes out.

Test names carry the rule id they check (OASIS MQTT 5.0 numbering)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.edge.message import Message, publish_parts
from bridge.mqtt import Properties, Publish
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.varint import encode_varint
from tests.edge.util import publish


# ------------------------------------------------------------------ raw frames
def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack(">H", len(b)) + b


def prop(pid: int, value: bytes) -> bytes:
    return bytes((pid,)) + value


PFI = prop(0x01, b"\x01")
CONTENT_TYPE = prop(0x03, s("text/plain"))
RESPONSE_TOPIC = prop(0x08, s("reply/here"))
CORRELATION = prop(0x09, struct.pack(">H", 4) + b"\x00\xff\x10\x80")
USER_1 = prop(0x26, s("k") + s("v1"))
USER_2 = prop(0x26, s("a") + s("v2"))
USER_3 = prop(0x26, s("k") + s("v3"))  # the same name again: order is what tells them apart
ALIAS = prop(0x23, struct.pack(">H", 7))


def expiry(seconds: int) -> bytes:
    return prop(0x02, struct.pack(">I", seconds))


def raw_publish(topic: str, props: bytes | None, payload: bytes = b"hello", qos: int = 0,
                pid: int = 9, retain: bool = False, dup: bool = False) -> bytes:
    """A PUBLISH frame built by hand, properties in exactly the order given
    (``props`` None: an MQTT 3.x frame without a property block)."""
    body = s(topic) + (struct.pack(">H", pid) if qos else b"")
    if props is not None:
        body += encode_varint(len(props)) + props
    body += payload
    first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    return bytes((first,)) + encode_varint(len(body)) + body


def props_of(frame: bytes, level: int = 5) -> bytes:
    """The raw property block of a PUBLISH frame."""
    _f, _t0, _t1, p0, pay = publish_parts(frame, level)
    return frame[p0:pay]


def decoded(frame: bytes, level: int) -> Publish:
    p, n = decode_packet(frame, level, from_client=False)
    assert n == len(frame)
    return p


# ------------------------------------------------------------------ topic
def test_mqtt_3_3_2_3_topic_is_the_one_published_and_an_inbound_alias_is_resolved():
    # the publisher used Topic Alias 7 with an empty Topic Name; the session resolved it
    frame = raw_publish("", ALIAS + CONTENT_TYPE, qos=1)
    msg = Message.from_frame(frame, 5, topic="site/7/temp")
    out = decoded(msg.frame(5, 1, 3), 5)
    assert out.topic == "site/7/temp" and out.packet_id == 3
    assert out.properties.topic_alias is None


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_mqtt_3_3_2_3_the_publishers_topic_alias_is_not_forwarded(where):
    parts = [CONTENT_TYPE, USER_1]
    parts.insert({"first": 0, "middle": 1, "last": 2}[where], ALIAS)
    msg = Message.from_frame(raw_publish("a/b", b"".join(parts)), 5)
    assert props_of(msg.frame(5, 0, None)) == CONTENT_TYPE + USER_1


# ------------------------------------------------------------------ properties
ODD_ORDER = USER_1 + CORRELATION + PFI + USER_2 + RESPONSE_TOPIC + CONTENT_TYPE + USER_3


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_3_3_2_17_and_18_properties_are_forwarded_byte_for_byte_in_their_order(qos):
    frame = raw_publish("a/b", ODD_ORDER, qos=qos)
    msg = Message.from_frame(frame, 5)
    out = msg.frame(5, qos, 5 if qos else None)
    assert props_of(out) == ODD_ORDER
    assert decoded(out, 5).properties.user_properties == [("k", "v1"), ("a", "v2"), ("k", "v3")]


def test_mqtt_3_3_2_4_payload_format_indicator_is_sent_unaltered():
    msg = Message.from_frame(raw_publish("a/b", PFI, payload="é".encode()), 5)
    out = decoded(msg.frame(5, 0, None), 5)
    assert out.properties.payload_format_indicator == 1 and out.payload == "é".encode()


def test_mqtt_3_3_2_15_16_20_response_topic_correlation_data_and_content_type_unaltered():
    msg = Message.from_frame(raw_publish("a/b", RESPONSE_TOPIC + CORRELATION + CONTENT_TYPE), 5)
    p = decoded(msg.frame(5, 0, None), 5).properties
    assert (p.response_topic, p.correlation_data, p.content_type) == (
        "reply/here", b"\x00\xff\x10\x80", "text/plain")


def test_a_publish_without_properties_goes_out_with_an_empty_property_block():
    msg = Message.from_frame(raw_publish("a/b", b"", payload=b"p"), 5)
    assert msg.frame(5, 0, None) == raw_publish("a/b", b"", payload=b"p")


# ------------------------------------------------------------------ expiry
@pytest.mark.parametrize("waited, left", [(0.0, 60), (0.999, 60), (1.0, 59), (30.5, 30),
                                          (59.9, 1)])
def test_mqtt_3_3_2_6_message_expiry_interval_is_decremented_by_the_time_waited(waited, left):
    # the expiry sits between other properties: only its 4 value bytes change
    props = USER_1 + expiry(60) + CONTENT_TYPE
    msg = Message.from_frame(raw_publish("a/b", props, qos=1), 5, received=1000.0)
    out = msg.frame(5, 1, 1, now=1000.0 + waited)
    assert props_of(out) == USER_1 + expiry(left) + CONTENT_TYPE
    assert msg.remaining(1000.0 + waited) == left


@pytest.mark.parametrize("waited", [60.0, 61.0, 1e6])
def test_mqtt_3_3_2_5_a_message_whose_interval_has_passed_has_none_left(waited):
    msg = Message.from_frame(raw_publish("a/b", expiry(60)), 5, received=10.0)
    assert msg.remaining(10.0 + waited) <= 0


def test_mqtt_3_3_2_6_a_clock_that_went_back_takes_nothing_off():
    msg = Message.from_frame(raw_publish("a/b", expiry(60)), 5, received=10.0)
    assert msg.remaining(5.0) == 60


def test_no_expiry_means_no_interval_and_none_is_added():
    msg = Message.from_frame(raw_publish("a/b", CONTENT_TYPE), 5, received=0.0)
    assert msg.remaining(1e9) is None
    assert props_of(msg.frame(5, 0, None, now=1e9)) == CONTENT_TYPE


# ------------------------------------------------------------------ subscription identifiers
def test_mqtt_3_3_4_3_subscription_identifiers_are_appended_after_the_published_properties():
    msg = Message.from_frame(raw_publish("a/b", USER_1 + expiry(9)), 5)
    out = msg.frame(5, 1, 4, sub_ids=(1, 268435455))
    assert props_of(out) == (USER_1 + expiry(9) + b"\x0b\x01" + b"\x0b" + encode_varint(268435455))
    assert decoded(out, 5).properties.subscription_identifiers == [1, 268435455]


def test_mqtt_3_3_4_3_identifiers_of_one_subscriber_do_not_leak_into_the_next_copy():
    msg = Message.from_frame(raw_publish("a/b", CONTENT_TYPE), 5)
    msg.frame(5, 0, None, sub_ids=(5,))
    assert props_of(msg.frame(5, 0, None)) == CONTENT_TYPE
    assert props_of(msg.frame(5, 0, None, sub_ids=(6,))) == CONTENT_TYPE + b"\x0b\x06"


# ------------------------------------------------------------------ fixed header
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("published_retain, published_dup", [(False, False), (True, True)])
def test_mqtt_3_3_1_3_qos_dup_and_retain_are_the_deliverys_not_the_publishers(
        qos, published_retain, published_dup):
    frame = raw_publish("a/b", b"", qos=2, pid=77, retain=published_retain, dup=published_dup)
    msg = Message.from_frame(frame, 5)
    first = msg.frame(5, qos, 3 if qos else None)
    assert first[0] == 0x30 | (qos << 1)
    out = decoded(first, 5)
    assert (out.qos, out.dup, out.retain, out.packet_id) == (qos, False, False,
                                                             3 if qos else None)
    again = msg.frame(5, qos, 3 if qos else None, dup=qos > 0, retain=True)
    assert again[0] == 0x31 | (qos << 1) | (8 if qos else 0)


def test_mqtt_3_3_1_9_the_publishers_retain_flag_is_kept_on_the_message():
    msg = Message.from_frame(raw_publish("a/b", b"", retain=True, qos=1), 5)
    assert (msg.retain, msg.qos) == (True, 1)


# ------------------------------------------------------------------ versions
@pytest.mark.parametrize("published_at", [3, 4, 5])
def test_the_same_delivery_encoded_for_mqtt_3_1_3_1_1_and_5(published_at):
    props = Properties(content_type="c", user_properties=[("u", "1")])
    frame = publish(published_at, "site/x", b"\x00payload", qos=1, packet_id=42,
                    properties=props if published_at == 5 else Properties())
    msg = Message.from_frame(frame, published_at, received=0.0)
    f3 = msg.frame(3, 1, 8, sub_ids=(2,))
    f4 = msg.frame(4, 1, 8, sub_ids=(2,))
    f5 = msg.frame(5, 1, 8, sub_ids=(2,))
    # 3.1 and 3.1.1 PUBLISH are the same bytes: no properties, no identifiers
    assert f3 == f4 == raw_publish("site/x", None, b"\x00payload", qos=1, pid=8)
    for level, f in ((3, f3), (4, f4), (5, f5)):
        p = decoded(f, level)
        assert (p.topic, p.qos, p.packet_id, p.payload) == ("site/x", 1, 8, b"\x00payload")
    p5 = decoded(f5, 5).properties
    assert p5.subscription_identifiers == [2]
    if published_at == 5:
        assert (p5.content_type, p5.user_properties) == ("c", [("u", "1")])
    else:  # a 3.x message reaches an MQTT 5 subscriber with only its identifier
        assert props_of(f5) == b"\x0b\x02"


# ------------------------------------------------------------------ size
_prop_parts = st.sampled_from([PFI, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION, USER_1, ALIAS,
                               expiry(100), prop(0x26, s("x" * 200) + s("y" * 200))])


@settings(max_examples=60, deadline=None)
@given(level=st.sampled_from([3, 4, 5]), qos=st.integers(0, 2),
       props=st.lists(_prop_parts, max_size=6, unique=True), payload=st.binary(max_size=300),
       topic=st.text(st.sampled_from("ab/é$z0"), min_size=1, max_size=40),
       sub_ids=st.lists(st.integers(1, 268435455), max_size=3))
def test_mqtt_3_1_2_25_frame_size_is_the_size_of_the_frame(level, qos, props, payload, topic,
                                                           sub_ids):
    msg = Message.from_frame(raw_publish(topic, b"".join(props), payload), 5, received=0.0)
    f = msg.frame(level, qos, 1 if qos else None, sub_ids=tuple(sub_ids), now=3.0)
    assert msg.frame_size(level, qos, tuple(sub_ids)) == len(f)
    assert decoded(f, level).payload == payload


def test_the_repr_shows_the_payload_size_not_the_payload():
    msg = Message.from_frame(raw_publish("a/b", b"", payload=b"secret-bytes"), 5)
    assert "secret" not in repr(msg) and "12 bytes" in repr(msg)
