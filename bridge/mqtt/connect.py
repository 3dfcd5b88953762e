"""CONNECT and CONNACK (MQTT 5.0 sections 3.1, 3.2; 3.1.1; 3.1 ``MQIsdp``).

CONNECT decoding learns the protocol level from the packet itself:
``MQIsdp``/3 is MQTT 3.1, ``MQTT``/4 is 3.1.1 and ``MQTT``/5 is 5. Any other
name raises ProtocolError [MQTT-3.1.2-1] (close without CONNACK); a known name
with another level raises ProtocolError [MQTT-3.1.2-2] with reason 0x84, which
the edge answers with a 3.x CONNACK return code 0x01 before closing. Errors
found after the level is known carry it in ``err.protocol_level`` so the edge
can choose the CONNACK format (reason code in 5, close or return code in 3.x).

Enforced on CONNECT: fixed-header flags (3.1.1/5), reserved Connect Flag
[MQTT-3.1.2-3] (3.1.1/5), Will QoS/Retain without Will [MQTT-3.1.2-11/-13],
Will QoS 3 [MQTT-3.1.2-12], password without user name before MQTT 5
[MQTT-3.1.2-22 of 3.1.1], missing fields [MQTT-3.1.3-3, 3.1.2-9, -17, -19],
left-over fields [MQTT-3.1.2-16, -18], UTF-8 rules on every string, Will
Topic non-empty without wildcards [MQTT-4.7.3-1, MQTT-4.7.0-1], MQTT 5
properties (CONNECT and Will scopes) and Authentication Data without Method.

Client Identifier length/emptiness is a session decision:
:func:`check_client_id` raises the right ProtocolError (reason 0x85,
3.x return code 0x02) for the session layer.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import ClassVar

from bridge.mqtt.base import PacketBase, safe_repr
from bridge.mqtt.fixed_header import PacketType, check_flags, encode_fixed_header
from bridge.mqtt.properties import (
    Properties, Scope, decode_properties, encode_properties, new_properties,
)
from bridge.mqtt.reader import Reader
from bridge.mqtt.reason_codes import check_reason
from bridge.mqtt.rules import violation
from bridge.mqtt.strings import encode_binary, encode_string

__all__ = [
    "PROTOCOL_NAMES",
    "Connack",
    "Connect",
    "Will",
    "check_client_id",
    "decode_connack",
    "decode_connect",
    "encode_connack",
    "encode_connect",
]

# protocol level -> the Protocol Name it must come with
PROTOCOL_NAMES: dict[int, str] = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
_LEVELS_FOR_NAME = {b"MQTT": (4, 5), b"MQIsdp": (3,)}
_U16 = struct.Struct(">H")

_RESERVED = 0x01
_CLEAN = 0x02
_WILL = 0x04
_WILL_QOS = 0x18
_WILL_RETAIN = 0x20
_PASSWORD = 0x40
_USERNAME = 0x80


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Will:
    """The Will Message of a CONNECT (``properties`` are MQTT 5 Will Properties)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = dataclasses.field(default_factory=Properties)

    def __repr__(self) -> str:
        return safe_repr(self)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Connect(PacketBase):
    """CONNECT. ``clean_start`` is Clean Session in 3.x. Use
    :meth:`for_level` to get the matching Protocol Name."""

    packet_type: ClassVar[int] = PacketType.CONNECT

    protocol_name: str = "MQTT"
    protocol_level: int = 4
    clean_start: bool = True
    keepalive: int = 60
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = dataclasses.field(default_factory=Properties)

    @classmethod
    def for_level(cls, level: int, **fields) -> Connect:
        """A CONNECT for protocol level 3, 4 or 5 with its Protocol Name."""
        return cls(protocol_name=PROTOCOL_NAMES[level], protocol_level=level, **fields)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Connack(PacketBase):
    """CONNACK. ``reason_code`` is the return code (0..5) in 3.x."""

    packet_type: ClassVar[int] = PacketType.CONNACK

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = dataclasses.field(default_factory=Properties)


def _unsupported(name: bytes, level: int) -> Exception:
    shown = name.decode("ascii", "replace")
    return violation(
        "MQTT-3.1.2-2",
        f"CONNECT Protocol Version {level} is not supported with Protocol Name {shown!r}",
        packet_type=PacketType.CONNECT,
    )


def decode_connect(buf, start: int, end: int, flags: int, level: int | None,
                   from_client: bool) -> Connect:
    """Decode a CONNECT body ``buf[start:end]``. ``level`` is ignored: the
    packet's own Protocol Version decides the format."""
    r = Reader(buf, start, end, PacketType.CONNECT)
    name = bytes(r.raw("Protocol Name"))
    levels = _LEVELS_FOR_NAME.get(name)
    if levels is None:
        raise violation("MQTT-3.1.2-1",
                        f"CONNECT Protocol Name of {len(name)} bytes is neither MQTT nor MQIsdp",
                        packet_type=PacketType.CONNECT)
    level = r.u8("Protocol Version")
    if level not in levels:
        raise _unsupported(name, level)
    if level >= 4:
        check_flags(PacketType.CONNECT, flags, level)
    cflags = r.u8("Connect Flags")
    if cflags & _RESERVED and level >= 4:
        raise violation("MQTT-3.1.2-3", "CONNECT reserved Connect Flag is 1",
                        packet_type=PacketType.CONNECT)
    will_flag = cflags & _WILL
    will_qos = (cflags & _WILL_QOS) >> 3
    if not will_flag:
        if will_qos:
            raise violation("MQTT-3.1.2-11", f"CONNECT has Will QoS {will_qos} without Will Flag",
                            packet_type=PacketType.CONNECT)
        if cflags & _WILL_RETAIN:
            raise violation("MQTT-3.1.2-13", "CONNECT has Will Retain without Will Flag",
                            packet_type=PacketType.CONNECT)
    elif will_qos == 3:
        raise violation("MQTT-3.1.2-12", "CONNECT has Will QoS 3", packet_type=PacketType.CONNECT)
    if cflags & _PASSWORD and not cflags & _USERNAME and level < 5:
        raise violation("MQTT-3.1.2-22", "CONNECT has the Password Flag without the User Name Flag",
                        packet_type=PacketType.CONNECT)
    keepalive = r.u16("Keep Alive")
    properties = new_properties()
    if level >= 5:
        properties = decode_properties(r, Scope.CONNECT)
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise violation("LG-auth-data-without-method",
                            "CONNECT has Authentication Data without Authentication Method",
                            packet_type=PacketType.CONNECT)
    client_id = r.string("Client Identifier", "MQTT-3.1.3-3")
    will = None
    if will_flag:
        if not r.left():
            raise r.truncated("Will Message", "MQTT-3.1.2-9")
        will_props = decode_properties(r, Scope.WILL) if level >= 5 else new_properties()
        topic = r.string("Will Topic", "MQTT-3.1.2-9")
        payload = r.binary("Will Payload", "MQTT-3.1.2-9")
        if not topic:
            raise violation("MQTT-4.7.3-1", "CONNECT Will Topic is empty",
                            packet_type=PacketType.CONNECT)
        if "+" in topic or "#" in topic:
            raise violation("MQTT-4.7.0-1", "CONNECT Will Topic contains a wildcard character",
                            packet_type=PacketType.CONNECT)
        will = Will(topic, payload, will_qos, bool(cflags & _WILL_RETAIN), will_props)
    username = r.string("User Name", "MQTT-3.1.2-17") if cflags & _USERNAME else None
    password = r.binary("Password", "MQTT-3.1.2-19") if cflags & _PASSWORD else None
    if r.left():
        if not cflags & _USERNAME:
            raise violation("MQTT-3.1.2-16",
                            f"CONNECT has {r.left()} bytes after its fields "
                            "but the User Name Flag is 0", packet_type=PacketType.CONNECT)
        if not cflags & _PASSWORD:
            raise violation("MQTT-3.1.2-18",
                            f"CONNECT has {r.left()} bytes after its fields "
                            "but the Password Flag is 0", packet_type=PacketType.CONNECT)
        r.expect_end("Password")
    return Connect(
        protocol_name=name.decode("ascii"), protocol_level=level,
        clean_start=bool(cflags & _CLEAN), keepalive=keepalive, client_id=client_id,
        will=will, username=username, password=password, properties=properties,
    )


def encode_connect(p: Connect, level: int) -> bytes:
    """Encode a CONNECT. ValueError when ``level`` differs from
    ``p.protocol_level`` or the fields cannot be represented at that level."""
    if level != p.protocol_level:
        raise ValueError(f"CONNECT has protocol level {p.protocol_level}, "
                         f"asked to encode as {level}")
    cflags = _CLEAN if p.clean_start else 0
    parts = [encode_string(p.protocol_name), bytes((level,)), b"", _U16.pack(p.keepalive)]
    if level >= 5:
        parts.append(encode_properties(p.properties, Scope.CONNECT))
    elif p.properties:
        raise ValueError("CONNECT properties need MQTT 5")
    parts.append(encode_string(p.client_id))
    if p.will is not None:
        w = p.will
        if w.qos not in (0, 1, 2):
            raise ValueError(f"Will QoS {w.qos} is not 0, 1 or 2")
        cflags |= _WILL | (w.qos << 3) | (_WILL_RETAIN if w.retain else 0)
        if level >= 5:
            parts.append(encode_properties(w.properties, Scope.WILL))
        elif w.properties:
            raise ValueError("Will properties need MQTT 5")
        parts += [encode_string(w.topic), encode_binary(w.payload)]
    if p.username is not None:
        cflags |= _USERNAME
        parts.append(encode_string(p.username))
    if p.password is not None:
        if p.username is None and level < 5:
            raise ValueError("MQTT 3.x cannot send a password without a user name")
        cflags |= _PASSWORD
        parts.append(encode_binary(p.password))
    parts[2] = bytes((cflags,))
    body = b"".join(parts)
    return encode_fixed_header(0x10, len(body)) + body


def decode_connack(buf, start: int, end: int, flags: int, level: int,
                   from_client: bool) -> Connack:
    """Decode a CONNACK body (normally received by a client: from_client=False)."""
    r = Reader(buf, start, end, PacketType.CONNACK)
    ack_flags = r.u8("Connect Acknowledge Flags")
    if ack_flags & 0xFE and level >= 4:
        raise violation("MQTT-3.2.2-1",
                        f"CONNACK Connect Acknowledge Flags 0x{ack_flags:02X} "
                        "has reserved bits set",
                        packet_type=PacketType.CONNACK)
    code = r.u8("Connect Reason Code")
    check_reason(PacketType.CONNACK, code, level, from_client)
    session_present = bool(ack_flags & 0x01)
    if session_present and code:
        raise violation("MQTT-3.2.2-6",
                        f"CONNACK has Session Present 1 with reason code 0x{code:02X}",
                        packet_type=PacketType.CONNACK)
    properties = decode_properties(r, Scope.CONNACK) if level >= 5 else new_properties()
    r.expect_end()
    return Connack(session_present, code, properties)


def encode_connack(p: Connack, level: int) -> bytes:
    if level >= 5:
        body = (bytes((1 if p.session_present else 0, p.reason_code))
                + encode_properties(p.properties, Scope.CONNACK))
    else:
        if p.properties:
            raise ValueError("CONNACK properties need MQTT 5")
        body = bytes((1 if p.session_present else 0, p.reason_code))
    return encode_fixed_header(0x20, len(body)) + body


def check_client_id(connect: Connect) -> None:
    """Session-layer check of the Client Identifier; raises ProtocolError
    [MQTT-3.1.3-8] (reason 0x85, 3.x return code 0x02) when a server must
    reject it: MQTT 3.1 requires 1..23 characters; 3.1.1 rejects an empty one
    with Clean Session 0. MQTT 5 leaves it to the server (it assigns one)."""
    cid = connect.client_id
    if connect.protocol_level == 3 and not 1 <= len(cid) <= 23:
        raise violation("MQTT-3.1.3-8",
                        f"MQTT 3.1 Client Identifier has {len(cid)} characters, not 1..23",
                        packet_type=PacketType.CONNECT, protocol_level=3)
    if connect.protocol_level == 4 and not cid and not connect.clean_start:
        raise violation("MQTT-3.1.3-8", "empty Client Identifier with Clean Session 0",
                        packet_type=PacketType.CONNECT, protocol_level=4)
