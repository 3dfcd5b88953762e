"""The property table against the standard's Table 2-4, and table-driven
checks of every identifier in every property block."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bridge.mqtt import MalformedPacket, Properties, ProtocolError
from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.properties import (
    ATTRS, PROPERTIES, Scope, WireType, decode_properties, encode_properties,
)
from bridge.mqtt.reader import Reader

# MQTT 5.0 OASIS Standard, Table 2-4 Properties: identifier, name, type, and the
# packets (or Will Properties) it may appear in. Typed from the standard, not
# from the code under test.
SPEC_TABLE_2_4 = """
0x01 | Payload Format Indicator | Byte | PUBLISH, Will Properties
0x02 | Message Expiry Interval | Four Byte Integer | PUBLISH, Will Properties
0x03 | Content Type | UTF-8 Encoded String | PUBLISH, Will Properties
0x08 | Response Topic | UTF-8 Encoded String | PUBLISH, Will Properties
0x09 | Correlation Data | Binary Data | PUBLISH, Will Properties
0x0B | Subscription Identifier | Variable Byte Integer | PUBLISH, SUBSCRIBE
0x11 | Session Expiry Interval | Four Byte Integer | CONNECT, CONNACK, DISCONNECT
0x12 | Assigned Client Identifier | UTF-8 Encoded String | CONNACK
0x13 | Server Keep Alive | Two Byte Integer | CONNACK
0x15 | Authentication Method | UTF-8 Encoded String | CONNECT, CONNACK, AUTH
0x16 | Authentication Data | Binary Data | CONNECT, CONNACK, AUTH
0x17 | Request Problem Information | Byte | CONNECT
0x18 | Will Delay Interval | Four Byte Integer | Will Properties
0x19 | Request Response Information | Byte | CONNECT
0x1A | Response Information | UTF-8 Encoded String | CONNACK
0x1C | Server Reference | UTF-8 Encoded String | CONNACK, DISCONNECT
0x1F | Reason String | UTF-8 Encoded String | CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH
0x21 | Receive Maximum | Two Byte Integer | CONNECT, CONNACK
0x22 | Topic Alias Maximum | Two Byte Integer | CONNECT, CONNACK
0x23 | Topic Alias | Two Byte Integer | PUBLISH
0x24 | Maximum QoS | Byte | CONNACK
0x25 | Retain Available | Byte | CONNACK
0x26 | User Property | UTF-8 String Pair | CONNECT, CONNACK, PUBLISH, Will Properties, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH
0x27 | Maximum Packet Size | Four Byte Integer | CONNECT, CONNACK
0x28 | Wildcard Subscription Available | Byte | CONNACK
0x29 | Subscription Identifier Available | Byte | CONNACK
0x2A | Shared Subscription Available | Byte | CONNACK
"""


def _spec():
    rows = {}
    for line in SPEC_TABLE_2_4.strip().splitlines():
        ident, name, wire, packets = (cell.strip() for cell in line.split("|"))
        rows[int(ident, 16)] = (name, wire, {p.strip() for p in packets.split(",")})
    return rows


def test_table_covers_every_identifier_the_standard_lists():
    spec = _spec()
    assert len(spec) == 27
    assert sorted(PROPERTIES) == sorted(spec)
    for pid, (name, wire, packets) in spec.items():
        entry = PROPERTIES[pid]
        assert entry.name == name, hex(pid)
        assert entry.wire.value == wire, hex(pid)
        assert {s.value for s in entry.packets} == packets, hex(pid)


def test_only_user_property_and_publish_subscription_identifier_repeat():
    repeating = {pid: {s.value for s in spec.may_repeat}
                 for pid, spec in PROPERTIES.items() if spec.may_repeat}
    assert set(repeating) == {0x0B, 0x26}
    assert repeating[0x0B] == {"PUBLISH"}
    assert repeating[0x26] == {s.value for s in Scope}


def test_properties_dataclass_has_one_field_per_identifier():
    fields = [f.name for f in dataclasses.fields(Properties)]
    assert sorted(fields) == sorted(ATTRS.values())
    assert ATTRS[0x26] == "user_properties" and ATTRS[0x0B] == "subscription_identifiers"


SAMPLE = {
    WireType.BYTE: (1, "01"),
    WireType.TWO_BYTE_INTEGER: (513, "0201"),
    WireType.FOUR_BYTE_INTEGER: (0x01020304, "01020304"),
    WireType.VARIABLE_BYTE_INTEGER: (200, "C801"),
    WireType.UTF8_STRING: ("é", "0002C3A9"),
    WireType.BINARY_DATA: (b"\x00\xff", "000200FF"),
    WireType.UTF8_STRING_PAIR: (("k", "v"), "00016B 000176"),
}

ALLOWED = [(pid, scope) for pid, spec in PROPERTIES.items() for scope in spec.packets]
FORBIDDEN = [(pid, scope) for pid, spec in PROPERTIES.items() for scope in Scope
             if scope not in spec.packets]


def _props_with(pid, value) -> Properties:
    attr = ATTRS[pid]
    return Properties(**{attr: [value] if pid in (0x0B, 0x26) else value})


def _decode(block: bytes, scope: Scope) -> Properties:
    r = Reader(memoryview(block), 0, len(block), PacketType.PUBLISH)
    props = decode_properties(r, scope)
    r.expect_end()
    return props


def _id(pair):
    pid, scope = pair
    return f"0x{pid:02X}-{scope.name}"


@pytest.mark.parametrize("pid, scope", ALLOWED, ids=map(_id, ALLOWED))
def test_every_property_round_trips_where_allowed(pid, scope):
    value, hexed = SAMPLE[PROPERTIES[pid].wire]
    props = _props_with(pid, value)
    block = encode_properties(props, scope)
    body = bytes((pid,)) + bytes.fromhex(hexed.replace(" ", ""))
    assert block == bytes((len(body),)) + body
    assert _decode(block, scope) == props


@pytest.mark.parametrize("pid, scope", FORBIDDEN, ids=map(_id, FORBIDDEN))
def test_lg_property_not_allowed_for_every_forbidden_pair(pid, scope):
    value, hexed = SAMPLE[PROPERTIES[pid].wire]
    body = bytes((pid,)) + bytes.fromhex(hexed.replace(" ", ""))
    with pytest.raises(MalformedPacket) as info:
        _decode(bytes((len(body),)) + body, scope)
    assert info.value.rule == "LG-property-not-allowed" and info.value.reason_code == 0x81
    name = re.escape(PROPERTIES[pid].name)
    assert re.fullmatch(rf"\[LG-property-not-allowed\] {name} \(0x{pid:02X}\) is not allowed in "
                        rf"{re.escape(scope.value)}", str(info.value))
    with pytest.raises(ValueError):
        encode_properties(_props_with(pid, value), scope)


SINGLE = [(pid, next(iter(sorted(spec.packets, key=lambda s: s.name))))
          for pid, spec in PROPERTIES.items() if pid != 0x26]


@pytest.mark.parametrize("pid, scope", SINGLE, ids=map(_id, SINGLE))
def test_lg_property_duplicate_for_every_single_valued_property(pid, scope):
    if scope in PROPERTIES[pid].may_repeat:
        scope = Scope.SUBSCRIBE  # Subscription Identifier repeats only in PUBLISH
    value, hexed = SAMPLE[PROPERTIES[pid].wire]
    one = bytes((pid,)) + bytes.fromhex(hexed.replace(" ", ""))
    with pytest.raises(ProtocolError) as info:
        _decode(bytes((2 * len(one),)) + one + one, scope)
    assert info.value.rule == "LG-property-duplicate" and info.value.reason_code == 0x82


@pytest.mark.parametrize("pid", sorted(PROPERTIES), ids=lambda p: f"0x{p:02X}")
def test_lg_truncated_for_every_property_value(pid):
    scope = sorted(PROPERTIES[pid].packets, key=lambda s: s.name)[0]
    with pytest.raises(MalformedPacket) as info:
        _decode(bytes((1, pid)), scope)  # Property Length 1: the identifier, no value
    assert info.value.rule == "LG-truncated"


@pytest.mark.parametrize("pid", [0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A],
                         ids=lambda p: f"LG-property-value-0x{p:02X}")
def test_lg_property_value_booleans(pid):
    scope = sorted(PROPERTIES[pid].packets, key=lambda s: s.name)[0]
    assert _decode(bytes((2, pid, 1)), scope) == _props_with(pid, 1)
    with pytest.raises(ProtocolError) as info:
        _decode(bytes((2, pid, 2)), scope)
    assert str(info.value) == (f"[LG-property-value] {PROPERTIES[pid].name} is 2, not 0 or 1")


def test_repeated_user_properties_keep_order_and_duplicates():
    props = Properties(user_properties=[("a", "1"), ("b", "2"), ("a", "1"), ("a", "3")])
    assert _decode(encode_properties(props, Scope.PUBLISH), Scope.PUBLISH).user_properties == [
        ("a", "1"), ("b", "2"), ("a", "1"), ("a", "3")]


def test_properties_normalise_iterables_and_report_presence():
    p = Properties(user_properties=(["k", "v"],), subscription_identifiers=(1, 2))
    assert p.user_properties == [("k", "v")] and p.subscription_identifiers == [1, 2]
    assert not Properties() and Properties(topic_alias=1)
    assert repr(Properties(correlation_data=b"xyz")) == "Properties(correlation_data=<3 bytes>)"


def test_encode_rejects_values_that_do_not_fit():
    with pytest.raises(ValueError):
        encode_properties(Properties(topic_alias=70000), Scope.PUBLISH)
    with pytest.raises(ValueError):
        encode_properties(Properties(subscription_identifiers=[1, 2]), Scope.SUBSCRIBE)
    with pytest.raises(ValueError):
        encode_properties(Properties(subscription_identifiers=[268_435_456]), Scope.PUBLISH)
