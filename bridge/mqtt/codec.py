"""Dispatch: bytes -> (packet, consumed) and packet -> bytes. No I/O.

``decode_packet(buf, protocol_level, *, max_packet_bytes=None, from_client=True)``

* ``buf``: bytes, bytearray or memoryview holding the start of a stream. Only
  the first frame is decoded; ``consumed`` says how many bytes it took.
* ``protocol_level``: 3, 4 or 5 once the CONNECT is known; ``None`` before
  it, when only a CONNECT is acceptable [MQTT-3.1.0-1] (the CONNECT carries
  its own level). ``None`` requires ``from_client=True``.
* ``from_client``: direction of flow. True: the packet was sent by a Client
  (the edge's view); server-to-client types are a ProtocolError. False: sent
  by a Server (tests, tap mode); client-to-server types are rejected.
* ``max_packet_bytes``: the receiver's Maximum Packet Size. A larger frame
  raises ProtocolError 0x95 as soon as its fixed header is complete, before
  the body is buffered.

Outcomes: a packet; :class:`IncompleteData` for every proper prefix of an
acceptable frame (``needed`` = the frame length once the fixed header is
complete); :class:`MalformedPacket` / :class:`ProtocolError` otherwise.
Whatever can be judged from byte 1 (type, direction, flags) is judged as soon
as byte 1 arrives. Errors carry ``rule``, ``reason_code``, ``packet_type``
and ``protocol_level``. The input buffer is never retained: payloads and
binary fields are copied into ``bytes``.

``encode(packet, protocol_level) -> bytes`` encodes one packet. It raises
ValueError for a packet that cannot be represented at that level (properties
before MQTT 5, QoS 3, missing Packet Identifier ...); it does not re-validate
string contents.
"""

from __future__ import annotations

from typing import Union

from bridge.mqtt.acks import PubAck, PubComp, PubRec, PubRel, decode_ack, encode_ack
from bridge.mqtt.connect import (
    Connack, Connect, decode_connack, decode_connect, encode_connack, encode_connect,
)
from bridge.mqtt.disconnect import (
    Auth, Disconnect, PingReq, PingResp, decode_auth, decode_disconnect, decode_pingreq,
    decode_pingresp, encode_auth, encode_disconnect, encode_pingreq, encode_pingresp,
)
from bridge.mqtt.errors import IncompleteData, MqttError
from bridge.mqtt.fixed_header import PacketType, check_first_byte, is_minimal, parse_fixed_header
from bridge.mqtt.publish import Publish, decode_publish, encode_publish
from bridge.mqtt.rules import violation
from bridge.mqtt.subscribe import (
    FilterDecoder, Suback, Subscribe, Unsuback, Unsubscribe, decode_suback, decode_subscribe, decode_unsuback,
    decode_unsubscribe, encode_suback, encode_subscribe, encode_unsuback, encode_unsubscribe,
)

__all__ = ["Packet", "begin_filters", "decode_packet", "encode"]

Packet = Union[
    Connect, Connack, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, Suback,
    Unsubscribe, Unsuback, PingReq, PingResp, Disconnect, Auth,
]

LEVELS = (3, 4, 5)


def _ack_decoder(ptype):
    def decode(buf, start, end, flags, level, from_client):
        return decode_ack(ptype, buf, start, end, flags, level, from_client)
    return decode


_DECODERS = {
    PacketType.CONNECT: decode_connect,
    PacketType.CONNACK: decode_connack,
    PacketType.PUBLISH: decode_publish,
    PacketType.PUBACK: _ack_decoder(PacketType.PUBACK),
    PacketType.PUBREC: _ack_decoder(PacketType.PUBREC),
    PacketType.PUBREL: _ack_decoder(PacketType.PUBREL),
    PacketType.PUBCOMP: _ack_decoder(PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: decode_subscribe,
    PacketType.SUBACK: decode_suback,
    PacketType.UNSUBSCRIBE: decode_unsubscribe,
    PacketType.UNSUBACK: decode_unsuback,
    PacketType.PINGREQ: decode_pingreq,
    PacketType.PINGRESP: decode_pingresp,
    PacketType.DISCONNECT: decode_disconnect,
    PacketType.AUTH: decode_auth,
}

_ENCODERS = {
    Connect: encode_connect,
    Connack: encode_connack,
    Publish: encode_publish,
    PubAck: encode_ack,
    PubRec: encode_ack,
    PubRel: encode_ack,
    PubComp: encode_ack,
    Subscribe: encode_subscribe,
    Suback: encode_suback,
    Unsubscribe: encode_unsubscribe,
    Unsuback: encode_unsuback,
    PingReq: encode_pingreq,
    PingResp: encode_pingresp,
    Disconnect: encode_disconnect,
    Auth: encode_auth,
}


def decode_packet(
    buf,
    protocol_level: int | None,
    *,
    max_packet_bytes: int | None = None,
    from_client: bool = True,
) -> tuple[Packet, int]:
    """Decode the first frame of ``buf``; see the module docstring."""
    if protocol_level is None:
        if not from_client:
            raise ValueError("protocol_level None (before CONNECT) needs from_client=True")
    elif protocol_level not in LEVELS:
        raise ValueError(f"protocol level {protocol_level!r} is not 3, 4 or 5")
    mv = buf if type(buf) is memoryview else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    have = len(mv)
    if not have:
        raise IncompleteData(None, 0)
    b0 = mv[0]
    if b0 >> 4 == 3 and have >= 2 and mv[1] < 0x80 and protocol_level is not None \
            and b0 & 0x06 != 0x06 and (not b0 & 0x08 or b0 & 0x06 or protocol_level == 3):
        # the commonest frame, complete, with a one-byte Remaining Length and
        # valid flags: what check_first_byte and parse_fixed_header would
        # find, without them (a PUBLISH may travel either way)
        end = 2 + mv[1]
        if end <= have and (max_packet_bytes is None or end <= max_packet_bytes):
            try:
                return decode_publish(mv, 2, end, b0 & 0x0F, protocol_level, from_client), end
            except MqttError as err:
                if err.protocol_level is None:
                    err.protocol_level = protocol_level
                if err.packet_type is None:
                    err.packet_type = PacketType.PUBLISH
                raise
    try:
        ptype = check_first_byte(b0, protocol_level, from_client)
        # MQTT-1.5.5-1 (minimal Remaining Length) is MQTT 5's; 3.1.1 section
        # 2.2.3 and 3.1 have no such rule (see bridge.mqtt.fixed_header)
        fh = parse_fixed_header(mv, max_packet_bytes=max_packet_bytes, from_client=from_client,
                                minimal=protocol_level == 5)
        if fh is None:
            raise IncompleteData(None, have)
        start = fh.header_length
        end = start + fh.remaining_length
        if protocol_level is None and not is_minimal(fh):
            # a first CONNECT: its own Protocol Name and Version decide
            known, level = _connect_name_level(mv, have, fh)
            if not known:
                raise IncompleteData(end, have)
            if level not in (3, 4):
                raise violation("MQTT-1.5.5-1", f"Remaining Length is encoded in "
                                f"{start - 1} bytes, more than the minimum",
                                packet_type=PacketType.CONNECT, protocol_level=level)
        if end > have:
            raise IncompleteData(end, have)
        packet = _DECODERS[ptype](mv, start, end, b0 & 0x0F, protocol_level, from_client)
    except MqttError as err:
        if err.protocol_level is None:
            if b0 >> 4 == PacketType.CONNECT:
                err.protocol_level = _connect_level(mv, have)
            else:
                err.protocol_level = protocol_level
        if err.packet_type is None and 1 <= b0 >> 4 <= 15:
            err.packet_type = PacketType(b0 >> 4)
        raise
    return packet, end


def begin_filters(buf, protocol_level: int, *,
                  max_packet_bytes: int | None = None) -> tuple[FilterDecoder, int]:
    """A client's SUBSCRIBE or UNSUBSCRIBE at the start of ``buf`` (bytes
    that stay unchanged), as a :class:`~bridge.mqtt.subscribe.FilterDecoder`
    whose Topic Filters are left to its ``step``; and the frame's length.
    Every other outcome as :func:`decode_packet`'s for the same bytes."""
    mv = buf if type(buf) is memoryview else memoryview(buf)
    have = len(mv)
    if not have:
        raise IncompleteData(None, 0)
    b0 = mv[0]
    try:
        ptype = check_first_byte(b0, protocol_level, True)
        if ptype not in (PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE):
            raise ValueError(f"begin_filters: a {ptype.name}, not a SUBSCRIBE or UNSUBSCRIBE")
        fh = parse_fixed_header(mv, max_packet_bytes=max_packet_bytes, from_client=True,
                                minimal=protocol_level == 5)
        if fh is None:
            raise IncompleteData(None, have)
        start = fh.header_length
        end = start + fh.remaining_length
        if end > have:
            raise IncompleteData(end, have)
        return FilterDecoder(ptype, mv, start, end, protocol_level), end
    except MqttError as err:
        if err.protocol_level is None:
            err.protocol_level = protocol_level
        if err.packet_type is None:
            err.packet_type = PacketType(b0 >> 4)
        raise


def _connect_level(mv: memoryview, have: int) -> int | None:
    """The protocol level of a CONNECT whose decoding failed, when its
    Protocol Name and Version were readable and supported (so the edge can
    answer in the right CONNACK format); None otherwise."""
    try:
        fh = parse_fixed_header(mv, minimal=False)
    except MqttError:
        return None
    if fh is None:
        return None
    return _connect_name_level(mv, have, fh)[1]


def _connect_name_level(mv: memoryview, have: int, fh) -> tuple[bool, int | None]:
    """(known, level): whether the bytes at hand tell the CONNECT's Protocol
    Name and Version (or show they are missing from the frame), and the
    level when they are a supported pair (MQIsdp/3, MQTT/4, MQTT/5)."""
    pos = fh.header_length
    total = fh.total_length
    end = min(have, total)
    complete = have >= total
    if pos + 2 > end:
        return complete, None
    n = (mv[pos] << 8) | mv[pos + 1]
    if pos + 2 + n >= end:
        return complete, None
    name = bytes(mv[pos + 2:pos + 2 + n])
    level = mv[pos + 2 + n]
    if (name == b"MQTT" and level in (4, 5)) or (name == b"MQIsdp" and level == 3):
        return True, level
    return True, None


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode ``packet`` for ``protocol_level`` (3, 4 or 5); see the module docstring."""
    if protocol_level not in LEVELS:
        raise ValueError(f"protocol level {protocol_level!r} is not 3, 4 or 5")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {type(packet).__name__}")
    return encoder(packet, protocol_level)
