"""Fixed header: packet type, flags and Remaining Length (MQTT 5.0 section 2.1).

Contract
--------
* :func:`frame_length` tells from the fixed header alone how long the first
  frame of a buffer is, or None when the fixed header is still incomplete. It
  raises as soon as the fixed header proves the frame unacceptable: a
  Remaining Length of five bytes (detected at the fourth byte), a
  non-minimal Remaining Length [MQTT-1.5.5-1] (MQTT 5 only, ``minimal=True``),
  or a packet larger than ``max_packet_bytes`` (reason 0x95) -- before any of
  the body is buffered.
* Minimal encoding is an MQTT 5 rule: MQTT-1.5.5-1 ("The encoded value MUST
  use the minimum number of bytes necessary to represent the value") is in
  section 1.5.5 of MQTT 5.0 only. MQTT 3.1.1 section 2.2.3 (Remaining Length)
  describes the same encoding -- seven bits per byte, a continuation bit,
  "The maximum number of bytes in the Remaining Length field is four" -- with
  no normative statement on the minimum, and MQTT 3.1 neither: levels 3 and
  4 decode with ``minimal=False`` and accept e.g. ``0x82 0x00`` for 2.
* :func:`check_first_byte` validates byte 1 against the protocol level and
  the direction of flow: reserved packet types, server-only packets from a
  client (and client-only packets from a server), and the reserved flag bits
  of every type [MQTT-2.1.3-1] with the per-packet ids (3.6.1-1, 3.8.1-1,
  3.10.1-1, 3.14.1-1, 3.15.1-1). MQTT 3.1 (level 3) defines no reserved flag
  values, so only PUBLISH QoS 3 is checked there.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from bridge.mqtt.rules import violation
from bridge.mqtt.varint import MAX_VARINT

__all__ = [
    "FixedHeader",
    "PacketType",
    "check_first_byte",
    "check_flags",
    "encode_fixed_header",
    "frame",
    "frame_length",
    "is_minimal",
    "parse_fixed_header",
]


class PacketType(IntEnum):
    """MQTT control packet types (byte 1, bits 7-4)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# The fixed-header flags every type but PUBLISH must carry, with the rule a
# violation reports (the per-packet statement where the standard has one).
REQUIRED_FLAGS: dict[PacketType, tuple[int, str]] = {
    PacketType.CONNECT: (0, "MQTT-2.1.3-1"),
    PacketType.CONNACK: (0, "MQTT-2.1.3-1"),
    PacketType.PUBACK: (0, "MQTT-2.1.3-1"),
    PacketType.PUBREC: (0, "MQTT-2.1.3-1"),
    PacketType.PUBREL: (2, "MQTT-3.6.1-1"),
    PacketType.PUBCOMP: (0, "MQTT-2.1.3-1"),
    PacketType.SUBSCRIBE: (2, "MQTT-3.8.1-1"),
    PacketType.SUBACK: (0, "MQTT-2.1.3-1"),
    PacketType.UNSUBSCRIBE: (2, "MQTT-3.10.1-1"),
    PacketType.UNSUBACK: (0, "MQTT-2.1.3-1"),
    PacketType.PINGREQ: (0, "MQTT-2.1.3-1"),
    PacketType.PINGRESP: (0, "MQTT-2.1.3-1"),
    PacketType.DISCONNECT: (0, "MQTT-3.14.1-1"),
    PacketType.AUTH: (0, "MQTT-3.15.1-1"),
}

SERVER_ONLY = frozenset({PacketType.CONNACK, PacketType.SUBACK, PacketType.UNSUBACK,
                         PacketType.PINGRESP})
CLIENT_ONLY = frozenset({PacketType.CONNECT, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE,
                         PacketType.PINGREQ})

_TYPES = (None,) + tuple(PacketType)  # index by the 4-bit type


class FixedHeader(NamedTuple):
    """A parsed fixed header. ``header_length`` counts byte 1 and the
    Remaining Length bytes; ``total_length`` is the whole frame."""

    packet_type: int
    flags: int
    remaining_length: int
    header_length: int

    @property
    def total_length(self) -> int:
        return self.header_length + self.remaining_length


def parse_fixed_header(
    buf, *, max_packet_bytes: int | None = None, from_client: bool = True,
    minimal: bool = True,
) -> FixedHeader | None:
    """Parse the fixed header at the start of ``buf`` (bytes-like).

    Returns None while the header is incomplete. Raises MalformedPacket for a
    Remaining Length that is longer than four bytes [LG-remaining-length] or,
    with ``minimal`` (MQTT 5), not minimal [MQTT-1.5.5-1]; ProtocolError 0x95
    when the frame would exceed ``max_packet_bytes`` [MQTT-3.2.2-15 from a
    client, MQTT-3.1.2-24 from a server]. Does not look at the packet type.
    """
    n = len(buf)
    if n < 2:
        return None
    b0 = buf[0]
    byte = buf[1]
    if byte < 0x80:  # fast path: one-byte Remaining Length
        remaining, header = byte, 2
    else:
        remaining = byte & 0x7F
        shift = 7
        i = 2
        while True:
            if i >= n:
                return None
            byte = buf[i]
            remaining |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                break
            if i == 5:
                raise violation(
                    "LG-remaining-length",
                    "Remaining Length continues past its fourth byte",
                    packet_type=_TYPES[b0 >> 4],
                )
            shift += 7
        if byte == 0 and minimal:
            raise violation(
                "MQTT-1.5.5-1",
                f"Remaining Length is encoded in {i - 1} bytes, more than the minimum",
                packet_type=_TYPES[b0 >> 4],
            )
        header = i
    if max_packet_bytes is not None and header + remaining > max_packet_bytes:
        ptype = _TYPES[b0 >> 4]
        name = ptype.name if ptype is not None else f"packet type {b0 >> 4}"
        raise violation(
            "MQTT-3.2.2-15" if from_client else "MQTT-3.1.2-24",
            f"{name} of {header + remaining} bytes exceeds the Maximum Packet Size of "
            f"{max_packet_bytes} bytes",
            packet_type=ptype,
        )
    return FixedHeader(b0 >> 4, b0 & 0x0F, remaining, header)


def frame_length(
    buf, *, max_packet_bytes: int | None = None, from_client: bool = True,
    minimal: bool = True,
) -> int | None:
    """Total length of the first frame in ``buf`` from its fixed header, or
    None when more bytes are needed to know it. Raises as
    :func:`parse_fixed_header` does (size limit, five-byte Remaining Length,
    non-minimal one with ``minimal``) as soon as the fixed header is
    complete, whatever follows."""
    fh = parse_fixed_header(buf, max_packet_bytes=max_packet_bytes, from_client=from_client,
                            minimal=minimal)
    return None if fh is None else fh.header_length + fh.remaining_length


def check_first_byte(b0: int, level: int | None, from_client: bool) -> PacketType:
    """Validate byte 1 of a frame; return its packet type.

    ``level`` None means "no CONNECT seen yet": only CONNECT is acceptable
    [MQTT-3.1.0-1] and its flags are checked once its level is known.
    """
    code = b0 >> 4
    flags = b0 & 0x0F
    ptype = _TYPES[code]
    if ptype is None or (ptype is PacketType.AUTH and level is not None and level < 5):
        raise violation(
            "LG-packet-type-reserved",
            f"packet type {code} is reserved" + ("" if code == 0 else " before MQTT 5"),
            packet_type=ptype, protocol_level=level,
        )
    if level is None:
        if ptype is not PacketType.CONNECT:
            raise violation(
                "MQTT-3.1.0-1", f"first packet is {ptype.name}, not CONNECT", packet_type=ptype,
            )
        return ptype
    if from_client:
        if ptype in SERVER_ONLY:
            raise violation(
                "LG-packet-direction", f"{ptype.name} sent by a Client",
                packet_type=ptype, protocol_level=level,
            )
    elif ptype in CLIENT_ONLY:
        raise violation(
            "LG-packet-direction", f"{ptype.name} sent by a Server",
            packet_type=ptype, protocol_level=level,
        )
    if ptype is PacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            raise violation(
                "MQTT-3.3.1-4", "PUBLISH has both QoS bits set",
                packet_type=ptype, protocol_level=level,
            )
        if flags & 0x08 and not flags & 0x06 and level >= 4:
            raise violation(
                "MQTT-3.3.1-2", "PUBLISH has DUP set with QoS 0",
                packet_type=ptype, protocol_level=level,
            )
    elif level >= 4 and ptype is not PacketType.CONNECT:
        check_flags(ptype, flags, level)
    return ptype


def check_flags(ptype: PacketType, flags: int, level: int | None) -> None:
    """Raise when the fixed-header flags of a non-PUBLISH packet are not the
    required value (MQTT 3.1.1 and 5 only)."""
    required, rule = REQUIRED_FLAGS[ptype]
    if flags != required:
        raise violation(
            rule,
            f"{ptype.name} fixed-header flags are 0x{flags:X}, not 0x{required:X}",
            packet_type=ptype, protocol_level=level,
        )


def is_minimal(fh: FixedHeader) -> bool:
    """Whether ``fh``'s Remaining Length took the minimum number of bytes."""
    rl = fh.remaining_length
    return fh.header_length - 1 == (1 if rl < 128 else 2 if rl < 16384 else
                                    3 if rl < 2097152 else 4)


def encode_fixed_header(first_byte: int, remaining_length: int) -> bytes:
    """Byte 1 followed by the minimal Remaining Length."""
    if remaining_length < 128:
        return bytes((first_byte, remaining_length))
    if remaining_length > MAX_VARINT:
        raise ValueError(f"packet body of {remaining_length} bytes exceeds {MAX_VARINT}")
    out = bytearray((first_byte,))
    value = remaining_length
    while value:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | 0x80 if value else byte)
    return bytes(out)


def frame(first_byte: int, parts: list[bytes]) -> bytes:
    """A whole frame from byte 1 and the body parts, joined in one copy."""
    length = sum(map(len, parts))
    return b"".join([encode_fixed_header(first_byte, length), *parts])
