"""UTF-8 Encoded Strings, Binary Data and UTF-8 String Pairs (MQTT 5.0 1.5.4-1.5.7).

Decoding contract (all raise MalformedPacket):

* ill-formed UTF-8, including encoded surrogates U+D800..U+DFFF and overlong
  forms [MQTT-1.5.4-1] -- Python's strict ``utf-8`` codec is RFC 3629 exact;
* U+0000 [MQTT-1.5.4-2];
* the Disallowed Unicode code points (U+0001..U+001F, U+007F..U+009F and the
  non-characters) [LG-utf8-disallowed]: the standard lets a receiver treat
  them as malformed and the Mosquitto vectors require it;
* inside a String Pair the first two are reported as [MQTT-1.5.7-1].

U+FEFF is kept as is [MQTT-1.5.4-3]. Encoding raises ValueError for a string
or binary longer than 65,535 bytes or a str that cannot be encoded (lone
surrogates); it does not re-validate content.
"""

from __future__ import annotations

import re
import struct

from bridge.mqtt.rules import violation

__all__ = [
    "decode_utf8",
    "encode_binary",
    "encode_string",
    "encode_string_pair",
    "string_problem",
]

_U16 = struct.Struct(">H")

# Control characters and Unicode non-characters (U+FDD0..U+FDEF and the last
# two code points of every plane).
_NONCHARS = "".join(
    f"{chr(plane * 0x10000 + 0xFFFE)}{chr(plane * 0x10000 + 0xFFFF)}" for plane in range(17)
)
_DISALLOWED = re.compile(f"[\x01-\x1f\x7f-\x9f\ufdd0-\ufdef{_NONCHARS}]")


def string_problem(text: str) -> tuple[str, str] | None:
    """(rule, detail) when a decoded str breaks a string rule, else None."""
    if "\x00" in text:
        return "MQTT-1.5.4-2", "contains U+0000"
    m = _DISALLOWED.search(text)
    if m is not None:
        return "LG-utf8-disallowed", f"contains the disallowed code point U+{ord(m.group()):04X}"
    return None


def decode_utf8(raw, what: str, packet_type=None, *, pair: bool = False) -> str:
    """Decode and validate one UTF-8 Encoded String field named ``what``."""
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError as err:
        data = bytes(raw)
        at = err.start
        if data[at] == 0xED and at + 1 < len(data) and 0xA0 <= data[at + 1] <= 0xBF:
            detail = f"{what} encodes a surrogate code point at byte {at}"
        else:
            detail = f"{what} is not well-formed UTF-8 at byte {at}"
        raise violation("MQTT-1.5.7-1" if pair else "MQTT-1.5.4-1", detail,
                        packet_type=packet_type) from None
    if text.isascii() and text.isprintable():
        return text  # fast path: no NUL, no control characters
    problem = string_problem(text)
    if problem is not None:
        rule, detail = problem
        if pair and rule == "MQTT-1.5.4-2":
            rule = "MQTT-1.5.7-1"
        raise violation(rule, f"{what} {detail}", packet_type=packet_type)
    return text


def encode_string(text: str) -> bytes:
    """Two-byte length followed by the UTF-8 bytes of ``text``."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"string cannot be encoded as UTF-8: {err.reason}") from None
    if len(data) > 0xFFFF:
        raise ValueError(f"UTF-8 string of {len(data)} bytes exceeds 65535")
    return _U16.pack(len(data)) + data


def encode_binary(data: bytes) -> bytes:
    """Two-byte length followed by ``data``."""
    if len(data) > 0xFFFF:
        raise ValueError(f"binary data of {len(data)} bytes exceeds 65535")
    return _U16.pack(len(data)) + bytes(data)


def encode_string_pair(pair: tuple[str, str]) -> bytes:
    """A UTF-8 String Pair (name, value)."""
    name, value = pair
    return encode_string(name) + encode_string(value)
