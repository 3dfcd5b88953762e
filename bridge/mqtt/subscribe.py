"""SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK (MQTT 5.0 sections 3.8-3.11).

Decoding enforces:

* Packet Identifier non-zero [MQTT-2.2.1-3 for SUBSCRIBE/UNSUBSCRIBE,
  MQTT-2.2.1-6 for SUBACK/UNSUBACK];
* at least one Topic Filter [MQTT-3.8.3-2, MQTT-3.10.3-2] (Protocol Errors);
* every Topic Filter: UTF-8 rules, non-empty [MQTT-4.7.3-1], ``#`` alone and
  last [MQTT-4.7.1-1], ``+`` a whole level [MQTT-4.7.1-2]; in MQTT 5 a
  ``$share/`` filter needs a ShareName [MQTT-4.8.2-1] without ``/+#`` followed
  by ``/`` and a filter [MQTT-4.8.2-2], and may not set No Local [MQTT-3.8.3-4];
* Subscription Options: reserved bits [MQTT-3.8.3-5] (bits 7-6 in 5,
  7-2 in 3.1.1, unchecked in 3.1), Maximum QoS 3 [LG-subscription-qos],
  Retain Handling 3 [LG-retain-handling];
* SUBACK/UNSUBACK reason codes valid for the level [MQTT-3.9.3-2, MQTT-3.11.3-2].
"""

from __future__ import annotations

import dataclasses
import struct
from typing import ClassVar

from bridge.mqtt.base import PacketBase, safe_repr
from bridge.mqtt.errors import MqttError
from bridge.mqtt.fixed_header import PacketType, frame
from bridge.mqtt.properties import (
    Properties, Scope, decode_properties, encode_properties, new_properties,
)
from bridge.mqtt.reader import Reader
from bridge.mqtt.reason_codes import valid_reasons
from bridge.mqtt.rules import violation
from bridge.mqtt.strings import encode_string

__all__ = [
    "FilterDecoder",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "check_topic_filter",
    "decode_suback",
    "decode_subscribe",
    "decode_unsuback",
    "decode_unsubscribe",
    "encode_suback",
    "encode_subscribe",
    "encode_unsuback",
    "encode_unsubscribe",
]

_U16 = struct.Struct(">H")
_SHARE = "$share/"


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Subscription:
    """One Topic Filter with its Subscription Options (the last three are MQTT 5)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def __repr__(self) -> str:
        return safe_repr(self)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Subscribe(PacketBase):
    packet_type: ClassVar[int] = PacketType.SUBSCRIBE

    packet_id: int
    subscriptions: list[Subscription] = dataclasses.field(default_factory=list)
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Suback(PacketBase):
    """SUBACK: one reason code (granted QoS or failure) per Topic Filter."""

    packet_type: ClassVar[int] = PacketType.SUBACK

    packet_id: int
    reason_codes: list[int] = dataclasses.field(default_factory=list)
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Unsubscribe(PacketBase):
    packet_type: ClassVar[int] = PacketType.UNSUBSCRIBE

    packet_id: int
    topic_filters: list[str] = dataclasses.field(default_factory=list)
    properties: Properties = dataclasses.field(default_factory=Properties)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Unsuback(PacketBase):
    """UNSUBACK: reason codes exist only in MQTT 5 (empty list in 3.x)."""

    packet_type: ClassVar[int] = PacketType.UNSUBACK

    packet_id: int
    reason_codes: list[int] = dataclasses.field(default_factory=list)
    properties: Properties = dataclasses.field(default_factory=Properties)


def check_topic_filter(topic_filter: str, level: int, packet_type=PacketType.SUBSCRIBE) -> bool:
    """Raise when ``topic_filter`` is not a valid Topic Filter; return
    whether it is an MQTT 5 Shared Subscription."""
    name = packet_type.name
    if not topic_filter:
        raise violation("MQTT-4.7.3-1", f"{name} Topic Filter is empty", packet_type=packet_type)
    shared = False
    tf = topic_filter
    if level >= 5 and tf.startswith(_SHARE):
        share, sep, tf = tf[len(_SHARE):].partition("/")
        if not share:
            raise violation("MQTT-4.8.2-1", f"{name} Shared Subscription has an empty ShareName",
                            packet_type=packet_type)
        if "+" in share or "#" in share:
            raise violation("MQTT-4.8.2-2",
                            f"{name} Shared Subscription ShareName contains a wildcard",
                            packet_type=packet_type)
        if not sep or not tf:
            raise violation("MQTT-4.8.2-2",
                            f"{name} Shared Subscription has no Topic Filter after its ShareName",
                            packet_type=packet_type)
        shared = True
    if "#" in tf:
        at = tf.index("#")
        if at != len(tf) - 1 or (at and tf[at - 1] != "/"):
            raise violation("MQTT-4.7.1-1",
                            f"{name} Topic Filter has '#' that is not alone in the last level",
                            packet_type=packet_type)
    if "+" in tf:
        for lvl in tf.split("/"):
            if "+" in lvl and lvl != "+":
                raise violation("MQTT-4.7.1-2",
                                f"{name} Topic Filter has '+' that is not a whole level",
                                packet_type=packet_type)
    return shared


def _check_packet_id(packet_id: int, rule: str, ptype: PacketType) -> None:
    if packet_id == 0:
        raise violation(rule, f"{ptype.name} has Packet Identifier 0", packet_type=ptype)


def _subscription(r: Reader, level: int, ptype: PacketType) -> Subscription:
    """One Topic Filter and its Subscription Options, checked."""
    tf = r.string("Topic Filter")
    opts = r.u8("Subscription Options")
    shared = check_topic_filter(tf, level, ptype)
    qos = opts & 0x03
    if level >= 5:
        if opts & 0xC0:
            raise violation("MQTT-3.8.3-5",
                            f"SUBSCRIBE Subscription Options 0x{opts:02X} "
                            "has reserved bits set",
                            packet_type=ptype)
        retain_handling = (opts >> 4) & 0x03
        no_local = bool(opts & 0x04)
        if retain_handling == 3:
            raise violation("LG-retain-handling", "SUBSCRIBE has Retain Handling 3",
                            packet_type=ptype)
        if no_local and shared:
            raise violation("MQTT-3.8.3-4", "SUBSCRIBE sets No Local on a Shared Subscription",
                            packet_type=ptype)
        sub = Subscription(tf, qos, no_local, bool(opts & 0x08), retain_handling)
    else:
        if opts & 0xFC and level == 4:
            raise violation("MQTT-3.8.3-5",
                            f"SUBSCRIBE Requested QoS byte 0x{opts:02X} has reserved bits set",
                            packet_type=ptype)
        sub = Subscription(tf, qos)
    if qos == 3:
        raise violation("LG-subscription-qos", "SUBSCRIBE requests QoS 3", packet_type=ptype)
    return sub


def _unsubscription(r: Reader, level: int, ptype: PacketType) -> str:
    tf = r.string("Topic Filter")
    check_topic_filter(tf, level, ptype)
    return tf


class FilterDecoder:
    """A SUBSCRIBE's or UNSUBSCRIBE's Topic Filters, decoded a slice at a
    time: the Packet Identifier and properties when made, then up to ``n``
    filters per :meth:`step` (an edge handles a packet of 100,000 filters
    without holding its event loop). Every rule is checked as by
    :func:`decode_subscribe` / :func:`decode_unsubscribe`, which are this
    decoder run to the end; an error raises from the step that meets it.
    ``buf[start:end]`` is the packet's body; ``buf`` must not change."""

    __slots__ = ("ptype", "level", "packet_id", "properties", "items", "_r", "_one")

    def __init__(self, ptype: PacketType, buf, start: int, end: int, level: int) -> None:
        self.ptype = ptype
        self.level = level
        r = self._r = Reader(buf, start, end, ptype)
        self.packet_id = r.u16("Packet Identifier")
        _check_packet_id(self.packet_id, "MQTT-2.2.1-3", ptype)
        sub = ptype == PacketType.SUBSCRIBE
        scope = Scope.SUBSCRIBE if sub else Scope.UNSUBSCRIBE
        self.properties = decode_properties(r, scope) if level >= 5 else new_properties()
        if not r.left():
            raise violation("MQTT-3.8.3-2" if sub else "MQTT-3.10.3-2",
                            f"{ptype.name} contains no Topic Filter", packet_type=ptype)
        #: what was decoded so far: Subscription (SUBSCRIBE) or str (UNSUBSCRIBE)
        self.items: list = []
        self._one = _subscription if sub else _unsubscription

    @property
    def done(self) -> bool:
        return not self._r.left()

    def step(self, n: int, max_bytes: int | None = None) -> list:
        """Decode up to ``n`` more filters, and (``max_bytes``) no more once
        that many bytes of the packet were read, one filter at least;
        returns them (also kept in ``items``)."""
        r = self._r
        one = self._one
        level = self.level
        ptype = self.ptype
        got = []
        stop = r.end if max_bytes is None else r.pos + max_bytes
        try:
            while n > 0 and r.left() and (r.pos < stop or not got):
                got.append(one(r, level, ptype))
                n -= 1
        except MqttError as err:
            if err.protocol_level is None:
                err.protocol_level = level
            raise
        self.items += got
        return got

    def packet(self) -> Subscribe | Unsubscribe:
        """The whole packet (once :attr:`done`)."""
        if self.ptype == PacketType.SUBSCRIBE:
            return Subscribe(self.packet_id, self.items, self.properties)
        return Unsubscribe(self.packet_id, self.items, self.properties)


def decode_subscribe(buf, start: int, end: int, flags: int, level: int,
                     from_client: bool) -> Subscribe:
    d = FilterDecoder(PacketType.SUBSCRIBE, buf, start, end, level)
    d.step(end)
    return d.packet()


def encode_subscribe(p: Subscribe, level: int) -> bytes:
    parts = [_packet_id(p), _props(p.properties, Scope.SUBSCRIBE, level, "SUBSCRIBE")]
    for s in p.subscriptions:
        if s.qos not in (0, 1, 2) or s.retain_handling not in (0, 1, 2):
            raise ValueError(f"Subscription QoS {s.qos} / Retain Handling {s.retain_handling} "
                             "out of range")
        opts = s.qos
        if s.no_local or s.retain_as_published or s.retain_handling:
            if level < 5:
                raise ValueError("No Local, Retain As Published and Retain Handling need MQTT 5")
            opts |= ((0x04 if s.no_local else 0) | (0x08 if s.retain_as_published else 0)
                     | (s.retain_handling << 4))
        parts += [encode_string(s.topic_filter), bytes((opts,))]
    return frame(0x82, parts)


def _check_codes(ptype: PacketType, codes: bytes, level: int, rule: str) -> None:
    if not codes:
        raise violation(rule, f"{ptype.name} contains no reason code", packet_type=ptype)
    bad = set(codes) - valid_reasons(ptype, level)
    if bad:
        raise violation(rule, f"{ptype.name} reason code 0x{min(bad):02X} is not defined",
                        packet_type=ptype)


def decode_suback(buf, start: int, end: int, flags: int, level: int,
                  from_client: bool) -> Suback:
    ptype = PacketType.SUBACK
    r = Reader(buf, start, end, ptype)
    packet_id = r.u16("Packet Identifier")
    _check_packet_id(packet_id, "MQTT-2.2.1-6", ptype)
    properties = decode_properties(r, Scope.SUBACK) if level >= 5 else new_properties()
    codes = r.rest()
    _check_codes(ptype, codes, level, "MQTT-3.9.3-2")
    return Suback(packet_id, list(codes), properties)


def encode_suback(p: Suback, level: int) -> bytes:
    return frame(0x90, [_packet_id(p), _props(p.properties, Scope.SUBACK, level, "SUBACK"),
                        bytes(p.reason_codes)])


def decode_unsubscribe(buf, start: int, end: int, flags: int, level: int,
                       from_client: bool) -> Unsubscribe:
    d = FilterDecoder(PacketType.UNSUBSCRIBE, buf, start, end, level)
    d.step(end)
    return d.packet()


def encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    parts = [_packet_id(p), _props(p.properties, Scope.UNSUBSCRIBE, level, "UNSUBSCRIBE")]
    parts += [encode_string(tf) for tf in p.topic_filters]
    return frame(0xA2, parts)


def decode_unsuback(buf, start: int, end: int, flags: int, level: int,
                    from_client: bool) -> Unsuback:
    ptype = PacketType.UNSUBACK
    r = Reader(buf, start, end, ptype)
    packet_id = r.u16("Packet Identifier")
    _check_packet_id(packet_id, "MQTT-2.2.1-6", ptype)
    if level < 5:
        r.expect_end("Packet Identifier")
        return Unsuback(packet_id, [], new_properties())
    properties = decode_properties(r, Scope.UNSUBACK)
    codes = r.rest()
    _check_codes(ptype, codes, level, "MQTT-3.11.3-2")
    return Unsuback(packet_id, list(codes), properties)


def encode_unsuback(p: Unsuback, level: int) -> bytes:
    if level < 5:
        if p.reason_codes or p.properties:
            raise ValueError("UNSUBACK reason codes and properties need MQTT 5")
        return frame(0xB0, [_packet_id(p)])
    return frame(0xB0, [_packet_id(p), encode_properties(p.properties, Scope.UNSUBACK),
                        bytes(p.reason_codes)])


def _packet_id(p) -> bytes:
    if not 1 <= p.packet_id <= 0xFFFF:
        raise ValueError(f"{type(p).__name__} Packet Identifier {p.packet_id} is not 1..65535")
    return _U16.pack(p.packet_id)


def _props(props: Properties, scope: Scope, level: int, name: str) -> bytes:
    if level >= 5:
        return encode_properties(props, scope)
    if props:
        raise ValueError(f"{name} properties need MQTT 5")
    return b""
