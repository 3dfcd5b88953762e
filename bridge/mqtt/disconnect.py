"""DISCONNECT, AUTH, PINGREQ, PINGRESP (MQTT 5.0 sections 3.12-3.15).

* PINGREQ/PINGRESP and the 3.x DISCONNECT have no body: any byte is
  [LG-trailing-bytes].
* MQTT 5 DISCONNECT: optional Reason Code (Remaining Length 0 = 0x00) valid
  for the sender [MQTT-3.14.2-1], optional properties; a Server must not send
  a Session Expiry Interval [MQTT-3.14.2-2].
* AUTH exists only in MQTT 5 (the codec rejects type 15 before that as a
  reserved type). Reason Code valid for the sender [MQTT-3.15.2-1]; the
  Authentication Method is mandatory [LG-auth-method-missing], which makes the
  Remaining Length 0 short form a Protocol Error as well.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bridge.mqtt.base import PacketBase
from bridge.mqtt.fixed_header import PacketType, frame
from bridge.mqtt.properties import (
    Properties, Scope, decode_properties, encode_properties, new_properties,
)
from bridge.mqtt.reader import Reader
from bridge.mqtt.reason_codes import check_reason
from bridge.mqtt.rules import violation

__all__ = [
    "Auth",
    "Disconnect",
    "PingReq",
    "PingResp",
    "decode_auth",
    "decode_disconnect",
    "decode_pingreq",
    "decode_pingresp",
    "encode_auth",
    "encode_disconnect",
    "encode_pingreq",
    "encode_pingresp",
]


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Disconnect(PacketBase):
    """DISCONNECT; ``reason_code`` and ``properties`` exist only in MQTT 5."""

    packet_type: ClassVar[int] = PacketType.DISCONNECT

    reason_code: int = 0
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Auth(PacketBase):
    """AUTH (MQTT 5 extended authentication). Authentication Data appears
    in the repr as a size only."""

    packet_type: ClassVar[int] = PacketType.AUTH

    reason_code: int = 0
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PingReq(PacketBase):
    packet_type: ClassVar[int] = PacketType.PINGREQ


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PingResp(PacketBase):
    packet_type: ClassVar[int] = PacketType.PINGRESP


_PINGREQ = PingReq()
_PINGRESP = PingResp()


def decode_pingreq(buf, start: int, end: int, flags: int, level: int,
                   from_client: bool) -> PingReq:
    Reader(buf, start, end, PacketType.PINGREQ).expect_end("fixed header")
    return _PINGREQ


def decode_pingresp(buf, start: int, end: int, flags: int, level: int,
                    from_client: bool) -> PingResp:
    Reader(buf, start, end, PacketType.PINGRESP).expect_end("fixed header")
    return _PINGRESP


def encode_pingreq(p: PingReq, level: int) -> bytes:
    return b"\xc0\x00"


def encode_pingresp(p: PingResp, level: int) -> bytes:
    return b"\xd0\x00"


def decode_disconnect(buf, start: int, end: int, flags: int, level: int,
                      from_client: bool) -> Disconnect:
    ptype = PacketType.DISCONNECT
    r = Reader(buf, start, end, ptype)
    if level < 5 or not r.left():
        r.expect_end("fixed header")
        return Disconnect(0, new_properties())
    code = r.u8("Reason Code")
    check_reason(ptype, code, level, from_client)
    properties = decode_properties(r, Scope.DISCONNECT) if r.left() else new_properties()
    r.expect_end()
    if not from_client and properties.session_expiry_interval is not None:
        raise violation("MQTT-3.14.2-2", "DISCONNECT from a Server has a Session Expiry Interval",
                        packet_type=ptype)
    return Disconnect(code, properties)


def encode_disconnect(p: Disconnect, level: int) -> bytes:
    if level < 5:
        if p.reason_code or p.properties:
            raise ValueError("DISCONNECT reason codes and properties need MQTT 5")
        return b"\xe0\x00"
    if p.properties:
        return frame(0xE0, [bytes((p.reason_code,)),
                            encode_properties(p.properties, Scope.DISCONNECT)])
    if p.reason_code:
        return bytes((0xE0, 1, p.reason_code))
    return b"\xe0\x00"


def decode_auth(buf, start: int, end: int, flags: int, level: int, from_client: bool) -> Auth:
    ptype = PacketType.AUTH
    r = Reader(buf, start, end, ptype)
    code = 0
    properties = new_properties()
    if r.left():
        code = r.u8("Reason Code")
        check_reason(ptype, code, level, from_client)
        if r.left():
            properties = decode_properties(r, Scope.AUTH)
            r.expect_end()
    else:
        check_reason(ptype, code, level, from_client)
    if properties.authentication_method is None:
        raise violation("LG-auth-method-missing", "AUTH has no Authentication Method",
                        packet_type=ptype)
    return Auth(code, properties)


def encode_auth(p: Auth, level: int) -> bytes:
    if level < 5:
        raise ValueError("AUTH needs MQTT 5")
    if not p.properties and not p.reason_code:
        return b"\xf0\x00"
    return frame(0xF0, [bytes((p.reason_code,)), encode_properties(p.properties, Scope.AUTH)])
