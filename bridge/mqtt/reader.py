"""A bounds-checked cursor over one packet body (internal to the codec).

Every read that would run past ``end`` raises MalformedPacket
[LG-truncated] (or the more specific rule the caller passes), because inside a
complete frame "short" can only mean the Remaining Length disagrees with the
content. Integers are read with struct on the memoryview: no per-byte loops
except the bounded Variable Byte Integer.
"""

from __future__ import annotations

import struct

from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.rules import violation
from bridge.mqtt.strings import decode_utf8
from bridge.mqtt.varint import decode_varint

__all__ = ["Reader"]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_NAMES = {t: t.name for t in PacketType}


class Reader:
    """Cursor over ``buf[pos:end]`` of a packet of type ``packet_type``."""

    __slots__ = ("buf", "pos", "end", "packet_type", "name")

    def __init__(self, buf: memoryview, pos: int, end: int, packet_type) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.packet_type = packet_type
        self.name = _NAMES[packet_type]

    def left(self) -> int:
        return self.end - self.pos

    def truncated(self, what: str, rule: str = "LG-truncated"):
        return violation(rule, f"{self.name} ends before the {what}",
                         packet_type=self.packet_type)

    def u8(self, what: str, rule: str = "LG-truncated") -> int:
        pos = self.pos
        if pos >= self.end:
            raise self.truncated(what, rule)
        self.pos = pos + 1
        return self.buf[pos]

    def u16(self, what: str, rule: str = "LG-truncated") -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise self.truncated(what, rule)
        self.pos = pos + 2
        return _U16.unpack_from(self.buf, pos)[0]

    def u32(self, what: str, rule: str = "LG-truncated") -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise self.truncated(what, rule)
        self.pos = pos + 4
        return _U32.unpack_from(self.buf, pos)[0]

    def varint(self, what: str, rule: str = "LG-truncated") -> int:
        result = decode_varint(self.buf, self.pos, self.end)
        if type(result) is tuple:
            value, self.pos = result
            return value
        if result is None:
            raise self.truncated(what, rule)
        if result == "too-long":
            raise violation("LG-varint-length", f"{self.name} {what} is longer than four bytes",
                            packet_type=self.packet_type)
        raise violation("MQTT-1.5.5-1", f"{self.name} {what} is not minimally encoded",
                        packet_type=self.packet_type)

    def raw(self, what: str, rule: str = "LG-truncated") -> memoryview:
        """A length-prefixed field's bytes (a view, not a copy)."""
        n = self.u16(what, rule)
        pos = self.pos
        if pos + n > self.end:
            raise violation(rule, f"{self.name} {what} of {n} bytes runs past the end",
                            packet_type=self.packet_type)
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def string(self, what: str, rule: str = "LG-truncated", *, pair: bool = False) -> str:
        return decode_utf8(self.raw(what, rule), what, self.packet_type, pair=pair)

    def binary(self, what: str, rule: str = "LG-truncated") -> bytes:
        return bytes(self.raw(what, rule))

    def rest(self) -> bytes:
        data = bytes(self.buf[self.pos:self.end])
        self.pos = self.end
        return data

    def expect_end(self, what: str = "last field") -> None:
        if self.pos != self.end:
            raise violation(
                "LG-trailing-bytes",
                f"{self.name} has {self.end - self.pos} bytes left over after the {what}",
                packet_type=self.packet_type,
            )
