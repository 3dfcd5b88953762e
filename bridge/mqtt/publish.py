"""PUBLISH (MQTT 5.0 section 3.3; 3.1.1 section 3.3; 3.1).

Decoding enforces (besides the fixed-header checks of codec/fixed_header:
QoS 3 [MQTT-3.3.1-4], DUP on QoS 0 [MQTT-3.3.1-2]):

* Topic Name present [MQTT-3.3.2-1], UTF-8 rules [MQTT-1.5.4-1/-2], no
  wildcards [MQTT-3.3.2-2], non-empty unless MQTT 5 with a Topic Alias
  [LG-topic-name-empty];
* Packet Identifier present when QoS > 0 [LG-truncated] and non-zero
  [MQTT-2.2.1-3 from a client, MQTT-2.2.1-4 from a server];
* MQTT 5 properties (PUBLISH scope, Topic Alias 0 [MQTT-3.3.2-8] ...) and no
  Subscription Identifier from a client [MQTT-3.3.4-6].

The payload is copied into ``bytes`` (the caller may reuse its buffer).
Session-layer helpers: :func:`check_topic_alias` (alias above the announced
maximum, reason 0x94) and :func:`check_payload_format` (Payload Format
Indicator 1 with a payload that is not UTF-8, reason 0x99).
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
from bridge.mqtt.rules import violation
from bridge.mqtt.strings import decode_utf8, encode_string

__all__ = [
    "Publish",
    "check_payload_format",
    "check_topic_alias",
    "decode_publish",
    "encode_publish",
]

_U16 = struct.Struct(">H")
_PUBLISH = PacketType.PUBLISH


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Publish(PacketBase):
    """PUBLISH. ``packet_id`` is None exactly when ``qos`` is 0. The repr
    shows the payload size, never its bytes."""

    packet_type: ClassVar[int] = PacketType.PUBLISH

    dup: bool = False
    qos: int = 0
    retain: bool = False
    topic: str = ""
    packet_id: int | None = None
    properties: Properties = dataclasses.field(default_factory=Properties)
    payload: bytes = b""


# Building a Publish through its slots: the frozen dataclass's __init__
# assigns each field with object.__setattr__, twice as slow on the hot path.
_NEW = object.__new__
_SET = tuple(getattr(Publish, f.name).__set__ for f in dataclasses.fields(Publish))


def _publish(dup: bool, qos: int, retain: bool, topic: str, packet_id: int | None,
             properties: Properties, payload: bytes) -> Publish:
    p = _NEW(Publish)
    s_dup, s_qos, s_retain, s_topic, s_pid, s_props, s_payload = _SET
    s_dup(p, dup)
    s_qos(p, qos)
    s_retain(p, retain)
    s_topic(p, topic)
    s_pid(p, packet_id)
    s_props(p, properties)
    s_payload(p, payload)
    return p


def decode_publish(buf, start: int, end: int, flags: int, level: int,
                   from_client: bool) -> Publish:
    """Decode a PUBLISH body ``buf[start:end]`` with fixed-header ``flags``."""
    qos = (flags >> 1) & 0x03
    if qos == 3:  # also caught from byte 1 by the codec; kept for direct callers
        raise violation("MQTT-3.3.1-4", "PUBLISH has both QoS bits set", packet_type=_PUBLISH)
    # Topic Name and Packet Identifier read in place; a field cut short is
    # left to the Reader, which raises the error it names
    t0 = start + 2
    if t0 > end:
        Reader(buf, start, end, _PUBLISH).string("Topic Name", "MQTT-3.3.2-1")
    pos = t0 + ((buf[start] << 8) | buf[start + 1])
    if pos > end:
        Reader(buf, start, end, _PUBLISH).string("Topic Name", "MQTT-3.3.2-1")
    topic = decode_utf8(buf[t0:pos], "Topic Name", _PUBLISH)
    if "+" in topic or "#" in topic:
        raise violation("MQTT-3.3.2-2", "PUBLISH Topic Name contains a wildcard character",
                        packet_type=_PUBLISH)
    packet_id = None
    if qos:
        if pos + 2 > end:
            Reader(buf, pos, end, _PUBLISH).u16("Packet Identifier")
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        if packet_id == 0:
            raise violation("MQTT-2.2.1-3" if from_client else "MQTT-2.2.1-4",
                            f"PUBLISH with QoS {qos} has Packet Identifier 0",
                            packet_type=_PUBLISH)
    if level >= 5:
        r = Reader(buf, pos, end, _PUBLISH)
        properties = decode_properties(r, Scope.PUBLISH)
        pos = r.pos
        if not topic and properties.topic_alias is None:
            raise violation("LG-topic-name-empty",
                            "PUBLISH has an empty Topic Name and no Topic Alias",
                            packet_type=_PUBLISH)
        if from_client and properties.subscription_identifiers:
            raise violation("MQTT-3.3.4-6", "PUBLISH from a Client contains a Subscription "
                            "Identifier", packet_type=_PUBLISH)
    else:
        if not topic:
            raise violation("LG-topic-name-empty", "PUBLISH has an empty Topic Name",
                            packet_type=_PUBLISH)
        properties = new_properties()
    return _publish(bool(flags & 0x08), qos, bool(flags & 0x01), topic, packet_id, properties,
                    bytes(buf[pos:end]))


def encode_publish(p: Publish, level: int) -> bytes:
    """Encode a PUBLISH. ValueError for QoS outside 0..2, a Packet Identifier
    missing or out of range for QoS > 0, one present for QoS 0
    [MQTT-2.2.1-2], or properties before MQTT 5."""
    qos = p.qos
    if qos not in (0, 1, 2):
        raise ValueError(f"PUBLISH QoS {qos} is not 0, 1 or 2")
    first = 0x30 | (0x08 if p.dup else 0) | (qos << 1) | (0x01 if p.retain else 0)
    parts = [encode_string(p.topic)]
    if qos:
        if p.packet_id is None or not 1 <= p.packet_id <= 0xFFFF:
            raise ValueError(f"PUBLISH with QoS {qos} needs a Packet Identifier 1..65535, "
                             f"got {p.packet_id!r}")
        parts.append(_U16.pack(p.packet_id))
    elif p.packet_id is not None:
        raise ValueError("[MQTT-2.2.1-2] a QoS 0 PUBLISH cannot carry a Packet Identifier")
    if level >= 5:
        parts.append(encode_properties(p.properties, Scope.PUBLISH))
    elif p.properties:
        raise ValueError("PUBLISH properties need MQTT 5")
    parts.append(p.payload)
    return frame(first, parts)


def check_topic_alias(publish: Publish, maximum: int, *, from_client: bool = True) -> None:
    """Session helper: raise ProtocolError (reason 0x94 Topic Alias invalid)
    when the PUBLISH's Topic Alias exceeds the maximum the receiver announced
    (``maximum`` 0 or absent: no alias is acceptable) [MQTT-3.3.2-9 for a
    Client's PUBLISH, MQTT-3.3.2-11 for a Server's]."""
    alias = publish.properties.topic_alias
    if alias is not None and alias > maximum:
        raise violation("MQTT-3.3.2-9" if from_client else "MQTT-3.3.2-11",
                        f"PUBLISH Topic Alias {alias} exceeds the Topic Alias Maximum {maximum}",
                        packet_type=_PUBLISH, protocol_level=5)


def check_payload_format(publish, *, what: str = "PUBLISH payload",
                         packet_type: int = _PUBLISH) -> None:
    """Session helper (optional validation the standard allows): raise
    ProtocolError [LG-payload-format-invalid] (reason 0x99) when the Payload
    Format Indicator is 1 and the payload is not well-formed UTF-8.
    ``publish``: a :class:`Publish`, or anything with ``properties`` and
    ``payload`` (a CONNECT's ``Will``, with ``what="Will Payload"``)."""
    if publish.properties.payload_format_indicator != 1:
        return
    try:
        publish.payload.decode("utf-8")
    except UnicodeDecodeError as err:
        raise violation("LG-payload-format-invalid",
                        f"{what} of {len(publish.payload)} bytes is not UTF-8 "
                        f"(byte {err.start}) although Payload Format Indicator is 1",
                        packet_type=packet_type, protocol_level=5) from None
