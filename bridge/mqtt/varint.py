"""Variable Byte Integer (MQTT 5.0 section 1.5.5): at most four bytes, 7 bits
each, least significant group first, minimum number of bytes [MQTT-1.5.5-1].

Contract: ``encode_varint`` raises ValueError for a value outside
0..268,435,455 (a caller bug, not a wire error). ``decode_varint`` works on
any buffer slice ``buf[pos:end]`` and reports short input as ``None`` so that
the caller decides whether that is "need more bytes" (fixed header) or a
malformed packet (inside a body). The only per-byte loop of the codec lives
here, bounded to four iterations.
"""

from __future__ import annotations

__all__ = ["MAX_VARINT", "decode_varint", "encode_varint", "varint_size"]

MAX_VARINT = 268_435_455

_ONE_BYTE = tuple(bytes((i,)) for i in range(128))


def encode_varint(value: int) -> bytes:
    """The minimal encoding of ``value``."""
    if value < 128:
        if value < 0:
            raise ValueError(f"variable byte integer {value} is negative")
        return _ONE_BYTE[value]
    if value > MAX_VARINT:
        raise ValueError(f"variable byte integer {value} exceeds {MAX_VARINT}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint_size(value: int) -> int:
    """Number of bytes ``encode_varint(value)`` produces."""
    if value < 128:
        return 1
    if value < 16_384:
        return 2
    if value < 2_097_152:
        return 3
    return 4


def decode_varint(buf, pos: int, end: int) -> tuple[int, int] | None | str:
    """Decode the integer starting at ``buf[pos]``, reading no further than ``end``.

    Returns ``(value, next_pos)``; ``None`` when ``end`` is reached before the
    last byte; the string ``"too-long"`` when the fourth byte still has its
    continuation bit set; ``"not-minimal"`` when the encoding is longer than
    necessary [MQTT-1.5.5-1]. Callers turn the two strings into their rule.
    """
    value = 0
    shift = 0
    i = pos
    while True:
        if i >= end:
            return None
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            if byte == 0 and i - pos > 1:
                return "not-minimal"
            return value, i
        if i - pos == 4:
            return "too-long"
        shift += 7
