"""The mapping's messages, encoded straight to AMQP 1.0 bytes (the fast path).

:func:`bridge.amqp.mapping.map_row` builds a proton ``Message`` from a
profile's rule table; proton then encodes it field by field through its
Python data API, which costs more than the sending itself. :func:`encode_row`
runs the *same* rule table and writes the sections with the few AMQP types
the mapping uses, in pure Python. The header (whose ttl is the remaining
lifetime at send time) is encoded apart, at each send, by
:func:`encode_header`. A test decodes what this writes with proton and
compares it, field by field, with ``map_row``'s message, for both profiles
and every rule.

AMQP 1.0 types written (OASIS AMQP 1.0, part 1): null, boolean, ubyte, uint,
int, ulong, timestamp, binary, string, symbol, list, map; sections (part 3.2): header
0x70, message-annotations 0x72, properties 0x73, application-properties
0x74, data 0x75.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Mapping

from proton import int32, symbol, timestamp, ubyte, ulong

from bridge.amqp.mapping import (ANNOTATIONS, APP_PROPERTIES, BODY, HEADER, PROFILES, PROPERTIES, Ctx, MappingError,
                                 Outgoing, Profile, Rule, _start, header_ttl, remaining_ms, set_ttl)

__all__ = ["encode_header", "encode_row", "encode_tail", "encode_value", "wire_bytes", "with_to"]

_HEADER = b"\x00\x53\x70"
_ANNOTATIONS = b"\x00\x53\x72"
_PROPERTIES = b"\x00\x53\x73"
_APP_PROPERTIES = b"\x00\x53\x74"
_DATA = b"\x00\x53\x75"

_pack_I = struct.Struct(">I").pack
_pack_i = struct.Struct(">i").pack
_pack_Q = struct.Struct(">Q").pack
_pack_q = struct.Struct(">q").pack


def _variable(small: int, large: int, raw: bytes) -> bytes:
    n = len(raw)
    if n <= 255:
        return bytes((small, n)) + raw
    return bytes((large,)) + _pack_I(n) + raw


def _compound(small: int, large: int, count: int, body: bytes) -> bytes:
    if count == 0 and small == 0xC0:
        return b"\x45"  # list0
    size = len(body) + 1
    if size <= 255 and count <= 255:
        return bytes((small, size, count)) + body
    return bytes((large,)) + _pack_I(len(body) + 4) + _pack_I(count) + body


def encode_value(v: Any) -> bytes:
    """One AMQP value; the Python/proton types the mapping produces."""
    if v is None:
        return b"\x40"
    t = type(v)
    if t is str:
        raw = v.encode("utf-8")
        n = len(raw)
        return (b"\xa1" + bytes((n,)) if n <= 255 else b"\xb1" + _pack_I(n)) + raw
    if t is symbol:
        return _symbol(v)
    if t is bool:
        return b"\x41" if v else b"\x42"
    if t is bytes or t is bytearray or t is memoryview:
        return _variable(0xA0, 0xB0, bytes(v))
    if t is ulong:
        if v == 0:
            return b"\x44"
        return b"\x53" + bytes((v,)) if v <= 255 else b"\x80" + _pack_Q(v)
    if t is timestamp:  # ms since the Unix epoch, 64-bit signed
        return b"\x83" + _pack_q(v)
    if t is ubyte:
        return bytes((0x50, v))
    if t is int32:
        return b"\x54" + struct.pack(">b", v) if -128 <= v <= 127 else b"\x71" + _pack_i(v)
    if t is int:  # plain ints the mapping uses are unsigned (ttl, delivery-count)
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"{v} does not fit an AMQP uint")
        if v == 0:
            return b"\x43"
        return b"\x52" + bytes((v,)) if v <= 255 else b"\x70" + _pack_I(v)
    if t is list or t is tuple:
        return _compound(0xC0, 0xD0, len(v), b"".join([encode_value(x) for x in v]))
    if t is dict or isinstance(v, Mapping):
        body = b"".join([encode_value(k) + encode_value(x) for k, x in v.items()])
        return _compound(0xC1, 0xD1, 2 * len(v), body)
    raise TypeError(f"no AMQP encoding for {t.__name__}")


_SYMBOLS: dict[str, bytes] = {}


def _symbol(v: str) -> bytes:
    """A symbol's encoding; the few the mapping uses (annotation keys) are kept."""
    out = _SYMBOLS.get(v)
    if out is None:
        out = _variable(0xA3, 0xB3, v.encode("ascii"))
        if len(_SYMBOLS) < 1024:
            _SYMBOLS[v] = out
    return out


def _fields(values: list[Any]) -> bytes:
    """A section's field list, trailing nulls left out."""
    while values and values[-1] is None:
        values.pop()
    return _compound(0xC0, 0xD0, len(values), b"".join([encode_value(x) for x in values]))


def encode_header(durable: bool, ttl_ms: int | None, delivery_count: int) -> bytes:
    """The header section: [durable, priority, ttl, first-acquirer, delivery-count]
    (without a ttl, one of four: kept)."""
    if ttl_ms is None and delivery_count in (0, 1, None):
        key = (bool(durable), int(delivery_count or 0))
        got = _HEADERS.get(key)
        if got is None:
            got = _HEADERS[key] = _header(durable, None, delivery_count)
        return got
    return _header(durable, ttl_ms, delivery_count)


_HEADERS: dict[tuple[bool, int], bytes] = {}


def _header(durable: bool, ttl_ms: int | None, delivery_count: int) -> bytes:
    return _HEADER + _fields([
        True if durable else None,
        None,
        None if ttl_ms is None else int(ttl_ms),
        None,
        int(delivery_count) if delivery_count else None,
    ])


#: the properties section's fields by name (OASIS AMQP 1.0, part 3.2.4)
PROPERTY_INDEX = {"message-id": 0, "user-id": 1, "to": 2, "subject": 3, "reply-to": 4, "correlation-id": 5,
                  "content-type": 6, "content-encoding": 7, "absolute-expiry-time": 8, "creation-time": 9,
                  "group-id": 10, "group-sequence": 11, "reply-to-group-id": 12}


def encode_tail(annotations: dict, properties: "dict[str, Any] | list", app_properties: dict, body: bytes | None) -> bytes:
    """Every section after the header, in the order AMQP requires;
    ``properties`` by name, or as the section's field list
    (``PROPERTY_INDEX``; trailing None left out)."""
    out = []
    if annotations:
        out.append(_ANNOTATIONS + encode_value(annotations))
    if isinstance(properties, dict):
        fields: list[Any] = [None] * 13
        for name, value in properties.items():
            fields[PROPERTY_INDEX[name]] = value
    else:
        fields = list(properties)
    if any(v is not None for v in fields):
        out.append(_PROPERTIES + _fields(fields))
    if app_properties:
        out.append(_APP_PROPERTIES + encode_value(app_properties))
    if body is not None:
        out.append(_DATA + encode_value(bytes(body)))
    return b"".join(out)


# --------------------------------------------------------------- a row, encoded
def encode_row(row: Mapping[str, Any], profile: Profile | str, address_template: str, now: float,
               refuse: str = "", reserved: str = "") -> Outgoing:
    """:func:`~bridge.amqp.mapping.map_row`, encoded: the same rules, written here.

    The Outgoing carries ``durable`` and ``delivery_count`` for the header
    (encoded at send time, with the ttl then left) and ``tail``, every
    other section, as bytes. ``message`` stays None.
    """
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    out, rules = _start(row, prof, address_template, now, refuse, reserved)
    exp = out.expires_at
    if exp is not None and remaining_ms(exp, now) <= 0:
        return out
    ctx = Ctx(now, address_template, exp, refuse)
    ann: dict = {}
    props: list = [None] * 13
    app: dict = {}
    body = None
    for code, key, fn in _plan(rules):
        value = fn(row, ctx)
        if value is None:
            continue
        if code == _P_PROPERTY:
            props[key] = value
        elif code == _P_ANNOTATION:
            ann[key] = value
        elif code == _P_APP:
            app[key] = value
        elif code == _P_APP_ALL:
            app.update(value)
        elif code == _P_BODY:
            body = value
        elif code == _P_DURABLE:
            out.durable = bool(value)
        elif code == _P_DELIVERY_COUNT:
            out.delivery_count = int(value)
    out.tail = encode_tail(ann, props, app, body)
    return out


_P_PROPERTY, _P_ANNOTATION, _P_APP, _P_APP_ALL, _P_BODY, _P_DURABLE, _P_DELIVERY_COUNT, _P_NONE = range(8)
_PLANS: dict[int, tuple[tuple[Rule, ...], tuple[tuple[int, Any, Callable[[Mapping[str, Any], Ctx], Any]], ...]]] = {}


def _plan(rules: tuple[Rule, ...]) -> tuple[tuple[int, Any, Callable[[Mapping[str, Any], Ctx], Any]], ...]:
    """A rule table as :func:`encode_row` walks it: (what to do, where, the rule's
    function) per rule, in the table's order; made once per table."""
    got = _PLANS.get(id(rules))
    if got is not None and got[0] is rules:
        return got[1]
    plan = []
    for r in rules:
        if r.section == HEADER:
            code = {"durable": _P_DURABLE, "delivery-count": _P_DELIVERY_COUNT}.get(r.name, _P_NONE)
            key: Any = None
        elif r.section == ANNOTATIONS:
            code, key = _P_ANNOTATION, symbol(r.name)
        elif r.section == PROPERTIES:
            code, key = _P_PROPERTY, PROPERTY_INDEX[r.name]
        elif r.section == APP_PROPERTIES:
            code, key = (_P_APP_ALL, None) if r.name == "<key>" else (_P_APP, r.name)
        elif r.section == BODY:
            code, key = _P_BODY, None
        else:  # pragma: no cover - a table error
            raise MappingError(f"no way to set {r.section} field {r.name!r}")
        # header ttl is encoded at send time (wire_bytes); its rule is evaluated for map_row only
        plan.append((code, key, r.value))
    out = tuple(p for p in plan if p[0] != _P_NONE)
    _PLANS[id(rules)] = (rules, out)
    return out


def wire_bytes(out: Outgoing, now: float, to: str | None = None) -> bytes | None:
    """The whole encoded message for sending at ``now`` (epoch seconds), with
    the ttl then remaining; None when it has expired since it was mapped.
    ``to``: the properties' ``to`` instead of the mapping's (the anonymous
    relay with ``amqp.anonymous_relay = "on"``: :mod:`bridge.amqp.links`)."""
    ttl = None
    if out.expires_at is not None:
        if remaining_ms(out.expires_at, now) <= 0:
            return None
        ttl = header_ttl(out.expires_at, now)
    if out.tail is not None:
        tail = out.tail if to is None else with_to(out.tail, to)
        return encode_header(out.durable, ttl, out.delivery_count) + tail
    if ttl is not None:
        set_ttl(out.message, ttl)
    if to is None:
        return out.message.encode()
    msg = out.message
    was = msg.address
    msg.address = to
    try:
        return msg.encode()
    finally:
        msg.address = was


_U32 = struct.Struct(">I").unpack_from


def _skip(buf: bytes, pos: int) -> int:
    """The position after the AMQP value encoded at ``pos`` (any type: the
    format code's subcategory gives its width, part 1 section 1.2)."""
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described: the descriptor, then the value
        return _skip(buf, _skip(buf, pos))
    width = code >> 4
    if width == 0x4:
        return pos
    if 0x5 <= width <= 0x9:
        return pos + (1, 2, 4, 8, 16)[width - 0x5]
    if width in (0xA, 0xC, 0xE):
        return pos + 1 + buf[pos]
    if width in (0xB, 0xD, 0xF):
        return pos + 4 + _U32(buf, pos)[0]
    raise ValueError(f"not an AMQP format code: 0x{code:02x} at {pos - 1}")


def _list_items(buf: bytes, pos: int) -> tuple[list[bytes], int]:
    """The encoded items of the list at ``pos`` and the position after it."""
    code = buf[pos]
    if code == 0x45:  # list0
        return [], pos + 1
    if code == 0xC0:
        count, start, end = buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    elif code == 0xD0:
        size, count = _U32(buf, pos + 1)[0], _U32(buf, pos + 5)[0]
        start, end = pos + 9, pos + 5 + size
    else:
        raise ValueError(f"not an AMQP list: 0x{code:02x} at {pos}")
    items, p = [], start
    for _ in range(count):
        q = _skip(buf, p)
        items.append(buf[p:q])
        p = q
    if p != end:
        raise ValueError("AMQP list size does not match its items")
    return items, end


def with_to(tail: bytes, to: str) -> bytes:
    """``tail`` (:func:`encode_tail`'s sections) with the properties' ``to``
    set to ``to``; every other byte as it was (a properties section is added
    after the message annotations when there was none)."""
    pos = 0
    if tail.startswith(_ANNOTATIONS):
        pos = _skip(tail, len(_ANNOTATIONS))
    to_field = encode_value(to)
    if tail.startswith(_PROPERTIES, pos):
        items, end = _list_items(tail, pos + len(_PROPERTIES))
    else:
        items, end = [], pos
    items += [b"\x40"] * (3 - len(items))
    items[PROPERTY_INDEX["to"]] = to_field
    while items and items[-1] == b"\x40":
        items.pop()
    section = _PROPERTIES + _compound(0xC0, 0xD0, len(items), b"".join(items))
    return tail[:pos] + section + tail[end:]
