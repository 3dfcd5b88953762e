"""MQTT 5 properties (MQTT 5.0 section 2.2.2): one table, one dataclass.

``PROPERTIES`` maps every property identifier of the standard to
``PropertySpec(name, wire, packets, may_repeat)``: the standard's name, its
wire type, the packets (``Scope``: packet types plus ``WILL`` for the Will
Properties of a CONNECT) it may appear in, and the packets in which it may
appear more than once (User Property everywhere, Subscription Identifier only
in PUBLISH).

Decoding contract (raises, with the rule id):

* Property Length or a value running past the end -> MalformedPacket [LG-truncated]
* identifier not defined -> MalformedPacket [LG-property-unknown]
* identifier not valid for the packet -> MalformedPacket [LG-property-not-allowed]
  (MQTT 5.0 section 2.2.2.2)
* single-valued property repeated -> ProtocolError [LG-property-duplicate]
* forbidden values -> ProtocolError: a 0/1 byte that is neither, Receive
  Maximum 0, Maximum Packet Size 0, Subscription Identifier 0
  [LG-property-value]; Topic Alias 0 [MQTT-3.3.2-8] (reason 0x94); a Response
  Topic with wildcards [MQTT-3.3.2-14]
* strings follow :mod:`bridge.mqtt.strings` (User Property: MQTT-1.5.7-1)

:class:`Properties` exposes each property by name (``None`` when absent);
``user_properties`` is a list of ``(name, value)`` tuples in wire order with
duplicates kept, ``subscription_identifiers`` a list of ints.
"""

from __future__ import annotations

import dataclasses
import struct
from enum import Enum
from typing import NamedTuple

from bridge.mqtt.base import safe_repr
from bridge.mqtt.reader import Reader
from bridge.mqtt.rules import violation
from bridge.mqtt.strings import encode_binary, encode_string
from bridge.mqtt.varint import encode_varint

__all__ = [
    "PROPERTIES",
    "Properties",
    "PropertySpec",
    "Scope",
    "WireType",
    "decode_properties",
    "encode_properties",
    "new_properties",
]


class WireType(Enum):
    BYTE = "Byte"
    TWO_BYTE_INTEGER = "Two Byte Integer"
    FOUR_BYTE_INTEGER = "Four Byte Integer"
    VARIABLE_BYTE_INTEGER = "Variable Byte Integer"
    UTF8_STRING = "UTF-8 Encoded String"
    BINARY_DATA = "Binary Data"
    UTF8_STRING_PAIR = "UTF-8 String Pair"


class Scope(Enum):
    """Where a property block occurs: a packet type, or the Will Properties."""

    CONNECT = "CONNECT"
    CONNACK = "CONNACK"
    PUBLISH = "PUBLISH"
    WILL = "Will Properties"
    PUBACK = "PUBACK"
    PUBREC = "PUBREC"
    PUBREL = "PUBREL"
    PUBCOMP = "PUBCOMP"
    SUBSCRIBE = "SUBSCRIBE"
    SUBACK = "SUBACK"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    UNSUBACK = "UNSUBACK"
    DISCONNECT = "DISCONNECT"
    AUTH = "AUTH"


class PropertySpec(NamedTuple):
    name: str
    wire: WireType
    packets: frozenset[Scope]
    may_repeat: frozenset[Scope]


_S = Scope
_W = WireType
_NEVER: frozenset[Scope] = frozenset()
_ALL = frozenset(_S)


def _p(name: str, wire: WireType, *packets: Scope, repeat=_NEVER) -> PropertySpec:
    return PropertySpec(name, wire, frozenset(packets), frozenset(repeat))


PROPERTIES: dict[int, PropertySpec] = {
    0x01: _p("Payload Format Indicator", _W.BYTE, _S.PUBLISH, _S.WILL),
    0x02: _p("Message Expiry Interval", _W.FOUR_BYTE_INTEGER, _S.PUBLISH, _S.WILL),
    0x03: _p("Content Type", _W.UTF8_STRING, _S.PUBLISH, _S.WILL),
    0x08: _p("Response Topic", _W.UTF8_STRING, _S.PUBLISH, _S.WILL),
    0x09: _p("Correlation Data", _W.BINARY_DATA, _S.PUBLISH, _S.WILL),
    0x0B: _p("Subscription Identifier", _W.VARIABLE_BYTE_INTEGER, _S.PUBLISH, _S.SUBSCRIBE,
             repeat={_S.PUBLISH}),
    0x11: _p("Session Expiry Interval", _W.FOUR_BYTE_INTEGER, _S.CONNECT, _S.CONNACK,
             _S.DISCONNECT),
    0x12: _p("Assigned Client Identifier", _W.UTF8_STRING, _S.CONNACK),
    0x13: _p("Server Keep Alive", _W.TWO_BYTE_INTEGER, _S.CONNACK),
    0x15: _p("Authentication Method", _W.UTF8_STRING, _S.CONNECT, _S.CONNACK, _S.AUTH),
    0x16: _p("Authentication Data", _W.BINARY_DATA, _S.CONNECT, _S.CONNACK, _S.AUTH),
    0x17: _p("Request Problem Information", _W.BYTE, _S.CONNECT),
    0x18: _p("Will Delay Interval", _W.FOUR_BYTE_INTEGER, _S.WILL),
    0x19: _p("Request Response Information", _W.BYTE, _S.CONNECT),
    0x1A: _p("Response Information", _W.UTF8_STRING, _S.CONNACK),
    0x1C: _p("Server Reference", _W.UTF8_STRING, _S.CONNACK, _S.DISCONNECT),
    0x1F: _p("Reason String", _W.UTF8_STRING, _S.CONNACK, _S.PUBACK, _S.PUBREC, _S.PUBREL,
             _S.PUBCOMP, _S.SUBACK, _S.UNSUBACK, _S.DISCONNECT, _S.AUTH),
    0x21: _p("Receive Maximum", _W.TWO_BYTE_INTEGER, _S.CONNECT, _S.CONNACK),
    0x22: _p("Topic Alias Maximum", _W.TWO_BYTE_INTEGER, _S.CONNECT, _S.CONNACK),
    0x23: _p("Topic Alias", _W.TWO_BYTE_INTEGER, _S.PUBLISH),
    0x24: _p("Maximum QoS", _W.BYTE, _S.CONNACK),
    0x25: _p("Retain Available", _W.BYTE, _S.CONNACK),
    0x26: _p("User Property", _W.UTF8_STRING_PAIR, *_ALL, repeat=_ALL),
    0x27: _p("Maximum Packet Size", _W.FOUR_BYTE_INTEGER, _S.CONNECT, _S.CONNACK),
    0x28: _p("Wildcard Subscription Available", _W.BYTE, _S.CONNACK),
    0x29: _p("Subscription Identifier Available", _W.BYTE, _S.CONNACK),
    0x2A: _p("Shared Subscription Available", _W.BYTE, _S.CONNACK),
}

# Attribute of Properties holding each identifier (plural for the lists).
_LIST_ATTRS = {0x0B: "subscription_identifiers", 0x26: "user_properties"}
ATTRS: dict[int, str] = {
    pid: _LIST_ATTRS.get(pid, spec.name.lower().replace(" ", "_"))
    for pid, spec in PROPERTIES.items()
}

# Byte-valued properties that must be 0 or 1; integers that must not be 0.
_BOOLEAN_BYTES = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
_NON_ZERO = frozenset({0x0B, 0x21, 0x27})


@dataclasses.dataclass(frozen=True, repr=False)
class Properties:
    """The properties of one MQTT 5 property block; ``None`` = absent.

    An empty ``Properties()`` is what every MQTT 3.x packet carries. Bytes
    values never appear in the repr (sizes only). Not slotted on purpose: the
    ``None`` defaults live on the class, so the decoder builds instances by
    filling ``__dict__`` with the present properties only (see
    :func:`new_properties`), which is several times faster than ``__init__``
    with 27 fields.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = dataclasses.field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __post_init__(self) -> None:
        # Accept any iterable; store lists (of tuples for user properties).
        user = self.user_properties
        if type(user) is not list or any(type(kv) is not tuple for kv in user):
            object.__setattr__(self, "user_properties",
                               [tuple(kv) for kv in self.user_properties])
        if type(self.subscription_identifiers) is not list:
            object.__setattr__(self, "subscription_identifiers",
                               list(self.subscription_identifiers))

    def __bool__(self) -> bool:
        """True when at least one property is present."""
        for value in self.__dict__.values():
            if value is not None and value != []:
                return True
        return False

    def __repr__(self) -> str:
        return safe_repr(self, skip_none=True)


_new = object.__new__


def new_properties(values: dict | None = None, user: list | None = None,
                   subids: list | None = None) -> Properties:
    """Fast constructor for the decoder: ``values`` maps attribute names to
    already validated values; the lists are taken as they are (not copied)."""
    p = _new(Properties)
    d = p.__dict__
    if values:
        d.update(values)
    d["user_properties"] = [] if user is None else user
    d["subscription_identifiers"] = [] if subids is None else subids
    return p


_ORDER = tuple((pid, spec, ATTRS[pid]) for pid, spec in sorted(PROPERTIES.items()))

# Decode-loop tables, derived from PROPERTIES once: per identifier (< 0x2B)
# the attribute, an integer wire code, the spec; per scope the identifiers
# allowed and those that may repeat (int sets: no Enum hashing in the loop).
_WIRE_CODE = {w: i for i, w in enumerate(WireType)}
_BYTE, _TWO, _FOUR, _VBI, _UTF8, _BIN, _PAIR = (_WIRE_CODE[w] for w in WireType)
_BY_ID: list[tuple[str, int, PropertySpec, str] | None] = [None] * 0x2B
for _pid, _spec in PROPERTIES.items():
    _BY_ID[_pid] = (ATTRS[_pid], _WIRE_CODE[_spec.wire], _spec, f"{_spec.name} value")
_ALLOWED = {scope: frozenset(pid for pid, spec in PROPERTIES.items() if scope in spec.packets)
            for scope in Scope}
_REPEATABLE = {scope: frozenset(pid for pid, spec in PROPERTIES.items()
                                if scope in spec.may_repeat) for scope in Scope}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def decode_properties(r: Reader, scope: Scope) -> Properties:
    """Read a Property Length and its properties from ``r`` for ``scope``."""
    length = r.varint("Property Length")
    start = r.pos
    end = start + length
    if end > r.end:
        raise violation(
            "LG-truncated",
            f"{r.name} Property Length {length} runs past the end of the packet",
            packet_type=r.packet_type,
        )
    if length == 0:
        return new_properties()
    allowed = _ALLOWED[scope]
    buf = r.buf
    outer_end = r.end
    r.end = end
    values: dict[str, object] = {}
    user: list[tuple[str, str]] = []
    subids: list[int] = []
    while r.pos < end:
        pid = buf[r.pos]
        if pid < 0x80:  # every defined identifier is one byte long
            r.pos += 1
        else:
            pid = r.varint("property identifier")
        entry = _BY_ID[pid] if pid < 0x2B else None
        if entry is None:
            raise violation("LG-property-unknown",
                            f"{r.name} has unknown property identifier 0x{pid:02X}",
                            packet_type=r.packet_type)
        attr, wire, spec, label = entry
        if pid not in allowed:
            raise violation("LG-property-not-allowed",
                            f"{spec.name} (0x{pid:02X}) is not allowed in {scope.value}",
                            packet_type=r.packet_type)
        if wire == _BYTE:
            value = r.u8(label)
            if value > 1 and pid in _BOOLEAN_BYTES:
                raise violation("LG-property-value", f"{spec.name} is {value}, not 0 or 1",
                                packet_type=r.packet_type)
        elif wire == _FOUR:
            value = r.u32(label)
            if value == 0 and pid in _NON_ZERO:
                raise violation("LG-property-value", f"{spec.name} is 0",
                                packet_type=r.packet_type)
        elif wire == _TWO:
            value = r.u16(label)
            if value == 0:
                if pid == 0x23:
                    raise violation("MQTT-3.3.2-8", "PUBLISH has Topic Alias 0",
                                    packet_type=r.packet_type)
                if pid in _NON_ZERO:
                    raise violation("LG-property-value", f"{spec.name} is 0",
                                    packet_type=r.packet_type)
        elif wire == _UTF8:
            value = r.string(spec.name)
            if pid == 0x08 and ("+" in value or "#" in value):
                raise violation("MQTT-3.3.2-14", "Response Topic contains a wildcard character",
                                packet_type=r.packet_type)
        elif wire == _PAIR:
            user.append((r.string("User Property name", pair=True),
                         r.string("User Property value", pair=True)))
            continue
        elif wire == _BIN:
            value = r.binary(spec.name)
        else:  # Variable Byte Integer: the Subscription Identifier
            value = r.varint(spec.name)
            if value == 0:
                raise violation("LG-property-value", f"{spec.name} is 0",
                                packet_type=r.packet_type)
            if subids and pid not in _REPEATABLE[scope]:
                raise violation("LG-property-duplicate",
                                f"{spec.name} appears more than once in {scope.value}",
                                packet_type=r.packet_type)
            subids.append(value)
            continue
        if attr in values:
            raise violation("LG-property-duplicate",
                            f"{spec.name} appears more than once in {scope.value}",
                            packet_type=r.packet_type)
        values[attr] = value
    r.end = outer_end
    return new_properties(values, user, subids)


def encode_properties(props: Properties, scope: Scope) -> bytes:
    """Property Length followed by the present properties, in identifier
    order (User Properties in their given order). ValueError for a property
    not valid in ``scope`` or a value that does not fit its wire type."""
    parts: list[bytes] = []
    for pid, spec, attr in _ORDER:
        value = getattr(props, attr)
        if value is None or (type(value) is list and not value):
            continue
        if scope not in spec.packets:
            raise ValueError(f"{spec.name} is not allowed in {scope.value}")
        wire = spec.wire
        prefix = bytes((pid,))
        try:
            if pid == 0x26:
                for name, val in value:
                    parts.append(prefix + encode_string(name) + encode_string(val))
            elif pid == 0x0B:
                if len(value) > 1 and scope not in spec.may_repeat:
                    raise ValueError(f"{spec.name} may appear only once in {scope.value}")
                for v in value:
                    parts.append(prefix + encode_varint(v))
            elif wire is _W.BYTE:
                parts.append(prefix + bytes((value,)))
            elif wire is _W.TWO_BYTE_INTEGER:
                parts.append(prefix + _U16.pack(value))
            elif wire is _W.FOUR_BYTE_INTEGER:
                parts.append(prefix + _U32.pack(value))
            elif wire is _W.UTF8_STRING:
                parts.append(prefix + encode_string(value))
            else:  # Binary Data
                parts.append(prefix + encode_binary(value))
        except struct.error as err:
            raise ValueError(f"{spec.name} value {value!r} does not fit: {err}") from None
    body = b"".join(parts)
    return encode_varint(len(body)) + body
