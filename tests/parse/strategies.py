"""Hypothesis strategies for captured frames: valid and broken, all levels.

Frames are built at the byte level (so that they can break any rule): a
PUBLISH from its fields and a property list of raw ``(identifier, value)``
entries drawn from the codec's property table, the four acknowledgements,
PINGREQ, and the rare types encoded by the codec (CONNECT, SUBSCRIBE,
DISCONNECT ...). Then, sometimes, a mutation: a wrong Remaining Length, a
non-minimal or five-byte one, a truncated or padded record, a flipped byte.
"""

from __future__ import annotations

import random
import struct

from hypothesis import strategies as st

from bridge.mqtt import (
    Connect, Disconnect, Properties, Subscribe, Subscription, Unsubscribe, Will, encode,
)
from bridge.mqtt.properties import PROPERTIES, Scope, WireType
from bridge.mqtt.varint import encode_varint

__all__ = ["batch", "frame_with_level"]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

_GOOD_TEXT = st.text(
    alphabet=st.sampled_from(list("abcxyz019/_-. $") + ["é", "€", "𝄞", "ü"]), max_size=12)
_BAD_SNIPPETS = [
    b"+", b"#", b"\x00", b"\x01", b"\x7f", b"\xc2\x85", b"\xed\xa0\x80", b"\xc0\xaf",
    b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xff", b"\x80", b"\xe2\x82", b"\xef\xbf\xbf",
    b"\xef\xb7\x90", b"\xf0\x9f\xbf\xbe", b"\xf5\x80\x80\x80", b"\xc1\xbf",
]


def chance(rng: random.Random, p: float) -> bool:
    """True with probability ``p``. The branch probabilities come from a
    seeded ``random.Random`` (drawn once per batch): hypothesis favours
    boundary values, which would make every rare branch common."""
    return rng.random() < p


@st.composite
def utf8_field(draw, rng, bad: float = 0.1, *, nonempty: bool = False) -> bytes:
    """The bytes of a string field: mostly valid text, sometimes a bad snippet."""
    text = draw(_GOOD_TEXT).encode() or (b"t" if nonempty else b"")
    if chance(rng, bad):
        snippet = draw(st.sampled_from(_BAD_SNIPPETS))
        at = draw(st.integers(0, len(text)))
        text = text[:at] + snippet + text[at:]
    return text


def _lp(data: bytes) -> bytes:
    return _U16.pack(len(data)) + data


_PUBLISH_IDS = sorted(p for p, s in PROPERTIES.items() if Scope.PUBLISH in s.packets)
_ACK_IDS = [0x1F, 0x26]
_ALL_IDS = sorted(PROPERTIES)


@st.composite
def property_entry(draw, rng, preferred: list[int]) -> bytes:
    """One property: identifier + value bytes (sometimes broken)."""
    choice = rng.random()
    if choice < 0.93:
        pid = draw(st.sampled_from(preferred))
    elif choice < 0.98:
        pid = draw(st.sampled_from(_ALL_IDS))
    else:
        pid = draw(st.integers(0, 300))
    ident = encode_varint(pid)
    if chance(rng, 0.01):
        ident = bytes([ident[0] | 0x80, 0x00])  # non-minimal identifier
    spec = PROPERTIES.get(pid)
    wire = spec.wire if spec else draw(st.sampled_from(list(WireType)))
    if wire is WireType.BYTE:
        value = bytes([draw(st.sampled_from([0, 1]))]) if not chance(rng, 0.05) else \
            bytes([draw(st.sampled_from([2, 255]))])
    elif wire is WireType.TWO_BYTE_INTEGER:
        value = _U16.pack(draw(st.sampled_from([1, 7, 65535])) if not chance(rng, 0.05) else 0)
    elif wire is WireType.FOUR_BYTE_INTEGER:
        value = _U32.pack(draw(st.sampled_from([0, 1, 3600, 2**32 - 1])))
    elif wire is WireType.VARIABLE_BYTE_INTEGER:
        v = draw(st.sampled_from([1, 127, 128, 16384, 268435455])) if not chance(rng, 0.05) else 0
        value = encode_varint(v)
        r = rng.random()
        if r < 0.03:
            value = b"\x81\x00"  # not minimal
        elif r < 0.05:
            value = b"\xff\xff\xff\xff\x01"  # five bytes
    elif wire is WireType.UTF8_STRING:
        value = _lp(draw(utf8_field(rng, 0.04)))
    elif wire is WireType.BINARY_DATA:
        value = _lp(draw(st.binary(max_size=8)))
    else:
        value = _lp(draw(utf8_field(rng, 0.02))) + _lp(draw(utf8_field(rng, 0.02)))
    if value and chance(rng, 0.02):
        value = value[:-1]  # wrong size
    return ident + value


@st.composite
def property_block(draw, rng, preferred: list[int], max_props: int = 4,
                   first: bytes = b"") -> bytes:
    entries = draw(st.lists(property_entry(rng, preferred), max_size=max_props))
    body = first + b"".join(entries)
    length = encode_varint(len(body))
    r = rng.random()
    if r < 0.02:
        length = encode_varint(len(body) + draw(st.integers(1, 3)))
    elif r < 0.04 and len(body) > 0:
        length = encode_varint(len(body) - 1)
    return length + body


@st.composite
def publish_body(draw, rng, level: int, qos: int) -> bytes:
    topic = draw(utf8_field(rng, 0.05, nonempty=True))
    if chance(rng, 0.03):
        topic = b""
    parts = [_lp(topic)]
    if qos in (1, 2, 3):
        parts.append(_U16.pack(0 if chance(rng, 0.03) else draw(st.integers(1, 65535))))
    if level == 5:
        # Payload Format Indicator 1 more often than the property draw gives
        # it, so that payloads that are not UTF-8 meet it
        first = b"\x01\x01" if chance(rng, 0.15) else b""
        parts.append(draw(property_block(rng, _PUBLISH_IDS, first=first)))
    if chance(rng, 0.3):
        payload = draw(utf8_field(rng, 0.1))
    else:
        payload = draw(st.binary(max_size=24))
    parts.append(payload)
    return b"".join(parts)


def _header(first: int, length: int) -> bytes:
    return bytes([first]) + encode_varint(length)


@st.composite
def publish_frame(draw, rng, level: int) -> bytes:
    qos = 3 if chance(rng, 0.02) else draw(st.sampled_from([0, 1, 2]))
    dup = chance(rng, 0.1)
    retain = draw(st.booleans())
    first = 0x30 | (0x08 if dup else 0) | ((qos & 3) << 1) | (1 if retain else 0)
    body = draw(publish_body(rng, level, qos))
    return _header(first, len(body)) + body


@st.composite
def ack_frame(draw, rng, level: int) -> bytes:
    ptype = draw(st.sampled_from([4, 5, 6, 7]))
    first = (ptype << 4) | (2 if ptype == 6 else 0)
    if chance(rng, 0.04):
        first = (ptype << 4) | draw(st.integers(0, 15))
    pid = 0 if chance(rng, 0.03) else draw(st.sampled_from([1, 42, 65535]))
    body = _U16.pack(pid)
    form = draw(st.integers(0, 3)) if level == 5 else 0
    if form >= 1:
        body += bytes([draw(st.sampled_from([0x00, 0x10, 0x80, 0x92, 0x99, 0x87]))
                       if not chance(rng, 0.05) else draw(st.integers(0, 255))])
    if form >= 2:
        body += draw(property_block(rng, _ACK_IDS, max_props=3))
    if chance(rng, 0.03):
        body += b"\x00"
    return _header(first, len(body)) + body


@st.composite
def rare_frame(draw, rng, level: int) -> bytes:
    """Types the parser hands to the scalar codec, encoded by the codec."""
    kind = draw(st.integers(0, 5))
    props5 = Properties(user_properties=[("a", "b")]) if level == 5 else Properties()
    if kind == 0:
        will = None
        if draw(st.booleans()):
            will = Will(topic=draw(_GOOD_TEXT.filter(lambda t: t and "+" not in t and "#" not in t)),
                        payload=draw(st.binary(max_size=6)), qos=draw(st.integers(0, 2)),
                        retain=draw(st.booleans()),
                        properties=Properties(
                            will_delay_interval=5, content_type="t",
                            payload_format_indicator=draw(st.sampled_from([None, 1])))
                        if level == 5 else Properties())
        pkt = Connect.for_level(level, client_id=draw(_GOOD_TEXT), will=will,
                                keepalive=draw(st.integers(0, 65535)),
                                clean_start=draw(st.booleans()),
                                username="u" if draw(st.booleans()) else None,
                                properties=props5)
        if level == 3 and will is None and pkt.username is None:
            pkt = Connect.for_level(level, client_id="c", keepalive=pkt.keepalive)
    elif kind == 1:
        pkt = Subscribe(packet_id=draw(st.integers(1, 65535)),
                        subscriptions=[Subscription("a/+/c", qos=draw(st.integers(0, 2)))],
                        properties=props5)
    elif kind == 2:
        pkt = Unsubscribe(packet_id=draw(st.integers(1, 65535)), topic_filters=["a/#"],
                          properties=props5)
    elif kind == 3:
        pkt = Disconnect(reason_code=draw(st.sampled_from([0, 4]))) if level == 5 else Disconnect()
    else:
        pkt = None
    if pkt is None:
        return bytes([draw(st.sampled_from([0x10, 0x20, 0x80, 0x82, 0x90, 0xA2, 0xB0, 0xE0,
                                            0xF0]))]) + draw(st.binary(max_size=10))
    return encode(pkt, level)


@st.composite
def mutate(draw, rng, frame: bytes) -> bytes:
    r = rng.random() * 100
    if r < 80 or not frame:
        return frame
    if r < 84:  # truncated record
        return frame[:draw(st.integers(0, len(frame) - 1))]
    if r < 86:  # padded record
        return frame + draw(st.binary(min_size=1, max_size=3))
    if r < 92:  # a flipped byte
        at = draw(st.integers(0, len(frame) - 1))
        return frame[:at] + bytes([draw(st.integers(0, 255))]) + frame[at + 1:]
    if r < 94:  # non-minimal Remaining Length
        first, rest = frame[0], frame[1:]
        i = 0
        while i < len(rest) and rest[i] & 0x80:
            i += 1
        if i >= len(rest):
            return frame
        rl = rest[:i + 1]
        return bytes([first]) + rl[:-1] + bytes([rl[-1] | 0x80, 0x00]) + rest[i + 1:]
    if r < 96:  # a five-byte Remaining Length
        return bytes([frame[0]]) + b"\xff\xff\xff\xff\x7f" + frame[2:]
    if r < 98:  # a random first byte
        return bytes([draw(st.integers(0, 255))]) + frame[1:]
    return draw(st.binary(max_size=12))  # garbage


@st.composite
def frame_with_level(draw, rng) -> tuple[bytes, int | None, str | None]:
    level = draw(st.sampled_from([3, 4, 5, 5, 5]))
    kind = rng.random() * 100
    if kind < 70:
        frame = draw(publish_frame(rng, level))
    elif kind < 85:
        frame = draw(ack_frame(rng, level))
    elif kind < 89:
        frame = b"\xc0\x00" if draw(st.booleans()) else b"\xd0\x00"
    else:
        frame = draw(rare_frame(rng, level))
    frame = draw(mutate(rng, frame))
    if chance(rng, 0.02):
        level = draw(st.sampled_from([None, 6]))
    alias = draw(st.sampled_from([None, None, "resolved/topic"]))
    return frame, level, alias


@st.composite
def batch(draw, min_size: int = 1, max_size: int = 200):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.lists(frame_with_level(rng), min_size=min_size, max_size=max_size))
    from_client = not chance(rng, 0.25)
    max_packet = draw(st.sampled_from([40, 1000])) if chance(rng, 0.3) else None
    return rows, from_client, max_packet
