"""PUBACK, PUBREC, PUBREL, PUBCOMP: one shape, one decoder (MQTT 5.0 3.4-3.7).

Body: Packet Identifier, then in MQTT 5 an optional Reason Code and an
optional property block (Remaining Length 2 means reason 0x00 and no
properties; 3 means no properties). In 3.x the body is exactly the Packet
Identifier.

Enforced: Packet Identifier non-zero [MQTT-2.2.1-5] (no PUBLISH can carry 0),
reason code valid for the family [MQTT-3.4.2-1, 3.5.2-1, 3.6.2-1, 3.7.2-1],
properties (Reason String, User Property only), no bytes left over
[LG-trailing-bytes]. PUBREL's fixed-header flags 0010 [MQTT-3.6.1-1] are
checked from byte 1 by the codec.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import ClassVar

from bridge.mqtt.base import PacketBase
from bridge.mqtt.fixed_header import PacketType, frame
from bridge.mqtt.properties import (
    Properties, Scope, decode_properties, encode_properties, new_properties,
)
from bridge.mqtt.reader import Reader
from bridge.mqtt.reason_codes import check_reason
from bridge.mqtt.rules import violation

__all__ = ["PubAck", "PubComp", "PubRec", "PubRel", "decode_ack", "encode_ack"]

_U16 = struct.Struct(">H")


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class _Ack(PacketBase):
    """Shared shape of the four publish acknowledgements."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PubAck(_Ack):
    """PUBACK (QoS 1 acknowledgement); reason codes: PubAckReason."""

    packet_type: ClassVar[int] = PacketType.PUBACK


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PubRec(_Ack):
    """PUBREC (QoS 2, part 1); reason codes: PubAckReason."""

    packet_type: ClassVar[int] = PacketType.PUBREC


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PubRel(_Ack):
    """PUBREL (QoS 2, part 2); reason codes: PubRelReason."""

    packet_type: ClassVar[int] = PacketType.PUBREL


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class PubComp(_Ack):
    """PUBCOMP (QoS 2, part 3); reason codes: PubRelReason."""

    packet_type: ClassVar[int] = PacketType.PUBCOMP


# packet type -> (class, byte 1, property scope)
_ACKS: dict[int, tuple[type[_Ack], int, Scope]] = {
    PacketType.PUBACK: (PubAck, 0x40, Scope.PUBACK),
    PacketType.PUBREC: (PubRec, 0x50, Scope.PUBREC),
    PacketType.PUBREL: (PubRel, 0x62, Scope.PUBREL),
    PacketType.PUBCOMP: (PubComp, 0x70, Scope.PUBCOMP),
}


def decode_ack(ptype: PacketType, buf, start: int, end: int, flags: int, level: int,
               from_client: bool) -> _Ack:
    """Decode the body of a PUBACK/PUBREC/PUBREL/PUBCOMP (``ptype``)."""
    cls, _first, scope = _ACKS[ptype]
    r = Reader(buf, start, end, ptype)
    packet_id = r.u16("Packet Identifier")
    if packet_id == 0:
        raise violation("MQTT-2.2.1-5", f"{ptype.name} has Packet Identifier 0",
                        packet_type=ptype)
    if level < 5 or not r.left():
        r.expect_end("Packet Identifier")
        return cls(packet_id, 0, new_properties())
    code = r.u8("Reason Code")
    check_reason(ptype, code, level, from_client)
    properties = decode_properties(r, scope) if r.left() else new_properties()
    r.expect_end()
    return cls(packet_id, code, properties)


def encode_ack(p: _Ack, level: int) -> bytes:
    """Encode in the shortest form the level allows (Remaining Length 2 when
    the reason is 0x00 and there are no properties)."""
    _cls, first, scope = _ACKS[p.packet_type]
    if not 1 <= p.packet_id <= 0xFFFF:
        raise ValueError(f"{type(p).__name__} Packet Identifier {p.packet_id} is not 1..65535")
    parts = [_U16.pack(p.packet_id)]
    if level >= 5:
        if p.properties:
            parts += [bytes((p.reason_code,)), encode_properties(p.properties, scope)]
        elif p.reason_code:
            parts.append(bytes((p.reason_code,)))
    elif p.reason_code or p.properties:
        raise ValueError(f"{type(p).__name__} reason codes and properties need MQTT 5")
    return frame(first, parts)
