"""An accepted PUBLISH as the edge hands it to subscribers. Sans-IO.

A :class:`Message` is built once per accepted PUBLISH that matches at least
one subscription, from the frame exactly as it was captured, and shared by
every delivery of it. :meth:`Message.frame` encodes the PUBLISH the edge
sends to one subscriber, following the rules for server-to-client packets:

* the topic as published (an inbound Topic Alias resolved) [MQTT-3.3.2-3];
  the publisher's Topic Alias is not forwarded (aliases are per connection
  and direction; the edge sends none);
* QoS, Packet Identifier, DUP [MQTT-3.3.1-3] and RETAIN [MQTT-3.3.1-9] as the
  delivery decides;
* MQTT 5 properties byte for byte as received, in the received order
  (Payload Format Indicator, Content Type, Response Topic, Correlation Data,
  User Properties [MQTT-3.3.2-17, MQTT-3.3.2-18] ...), except the Message
  Expiry Interval, which is decremented by the whole seconds the message
  waited in the edge [MQTT-3.3.2-6], and the Subscription Identifiers of the
  matching subscriptions, appended [MQTT-3.3.4-3];
* to an MQTT 3.x subscriber: no properties (3.x has none).

Times are passed in, in the server's clock (the event loop's): a message
recovered after a restart gets its capture record's wall-clock arrival time
converted to that clock (``bridge.edge.journal``), so its expiry counts
from when it really arrived.
"""

from __future__ import annotations

import struct

from bridge.mqtt.varint import encode_varint

__all__ = ["Message", "publish_parts"]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# Property value sizes by identifier: fixed widths, or a code for the rest.
_FIXED = {0x01: 1, 0x02: 4, 0x23: 2, 0x24: 1, 0x25: 1, 0x13: 2, 0x21: 2, 0x22: 2, 0x11: 4,
          0x18: 4, 0x27: 4, 0x17: 1, 0x19: 1, 0x28: 1, 0x29: 1, 0x2A: 1}
_STRINGS = {0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F}  # one length-prefixed value
_PAIR = 0x26
_VARINT = 0x0B


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def publish_parts(frame: bytes, level: int) -> tuple[int, int, int, int, int]:
    """Offsets in a valid PUBLISH ``frame`` (as the codec accepted it):
    (first byte, topic start, topic end, property block start, payload start).
    The topic starts after its 2-byte length; the property block is the
    bytes after the Property Length (empty below MQTT 5)."""
    _rl, pos = _varint_at(frame, 1)
    tlen = (frame[pos] << 8) | frame[pos + 1]
    t0 = pos + 2
    pos = t0 + tlen
    if (frame[0] >> 1) & 3:
        pos += 2
    if level == 5:
        plen, p0 = _varint_at(frame, pos)
        return frame[0], t0, t0 + tlen, p0, p0 + plen
    return frame[0], t0, t0 + tlen, pos, pos


def _forwarded_props(raw: bytes) -> tuple[bytes, int | None, int]:
    """The properties of a PUBLISH as forwarded: every one byte for byte, in
    order, but the Topic Alias (per connection); with the Message Expiry
    Interval's value and the offset of its 4 bytes in them (-1: none)."""
    keep = []
    pos = 0
    out = 0
    end = len(raw)
    expiry = None
    exp_at = -1
    while pos < end:
        start = pos
        pid = raw[pos]
        pos += 1
        size = _FIXED.get(pid)
        if size is not None:
            pos += size
        elif pid in _STRINGS:
            pos += 2 + ((raw[pos] << 8) | raw[pos + 1])
        elif pid == _PAIR:
            pos += 2 + ((raw[pos] << 8) | raw[pos + 1])
            pos += 2 + ((raw[pos] << 8) | raw[pos + 1])
        elif pid == _VARINT:
            _v, pos = _varint_at(raw, pos)
        else:  # the codec admits no other identifier in a PUBLISH
            raise ValueError(f"property 0x{pid:02X} in a PUBLISH")
        if pid == 0x23:
            continue  # Topic Alias: not forwarded
        if pid == 0x02:
            expiry = _U32.unpack_from(raw, start + 1)[0]
            exp_at = out + 1
        keep.append(raw[start:pos])
        out += pos - start
    return b"".join(keep), expiry, exp_at


class Message:
    """One accepted PUBLISH, shared by all its deliveries.

    ``origin``: the publishing Client Identifier (No Local); ``received``:
    arrival; ``expiry``: the Message Expiry Interval received
    (None: none); ``ref``: (partition, offset) of its capture record, once
    appended; ``ready``: its record is durable (no subscriber sees a message
    before that). ``size``: payload bytes (queue bounds). ``received`` is in
    the server's clock (see the module docstring)."""

    __slots__ = ("topic", "qos", "retain", "origin", "received", "expiry", "ref", "ready",
                 "_topic_b", "_props", "_exp_at", "payload", "size", "_cache", "ref_header",
                 "sink")

    def __init__(self, topic: str, qos: int, retain: bool, payload: bytes, props: bytes = b"",
                 *, origin: str = "", received: float = 0.0, expiry: int | None = None,
                 exp_at: int = -1, ref: tuple[int, int] | None = None, ready: bool = True) -> None:
        self.topic = topic
        self.qos = qos
        self.retain = retain
        self.payload = payload
        self.size = len(payload)
        self.origin = origin
        self.received = received
        self.expiry = expiry
        self.ref = ref
        self.ready = ready
        tb = topic.encode()
        self._topic_b = _U16.pack(len(tb)) + tb
        self._props = props      # raw MQTT 5 properties, without any Topic Alias
        self._exp_at = exp_at    # offset of the expiry's 4-byte value in _props (-1: none)
        self._cache: dict = {}
        #: ``partition:offset`` of the capture record (the ``ack_ref``
        #: header of the subscribers' acknowledgements); ``-`` without one
        self.ref_header = b"-" if ref is None else b"%d:%d" % ref
        #: a message from the AMQP network (``bridge.edge.downlink``): told
        #: when each QoS 1/2 delivery of it ends (None: a captured message)
        self.sink = None

    @classmethod
    def from_frame(cls, frame: bytes, level: int, *, topic: str | None = None, origin: str = "",
                   received: float = 0.0, ref: tuple[int, int] | None = None,
                   ready: bool = False) -> Message:
        """The message of a valid PUBLISH ``frame`` sent at protocol ``level``
        (``topic``: the resolved topic when the frame used a Topic Alias)."""
        first, t0, t1, p0, pay = publish_parts(frame, level)
        if topic is None:
            topic = frame[t0:t1].decode()
        props, expiry, exp_at = (b"", None, -1) if p0 >= pay else _forwarded_props(frame[p0:pay])
        return cls(topic, (first >> 1) & 3, bool(first & 1), frame[pay:], props, origin=origin,
                   received=received, expiry=expiry, exp_at=exp_at, ref=ref, ready=ready)

    @classmethod
    def from_properties(cls, topic: str, qos: int, retain: bool, payload: bytes, props: bytes,
                        **kw) -> Message:
        """A message from its parts; ``props``: an MQTT 5 property block
        without its length (the Message Expiry Interval found in it)."""
        props, expiry, exp_at = (b"", None, -1) if not props else _forwarded_props(props)
        return cls(topic, qos, retain, payload, props, expiry=expiry, exp_at=exp_at, **kw)

    # ------------------------------------------------------------ expiry
    def remaining(self, now: float) -> int | None:
        """Seconds of Message Expiry Interval left at ``now`` (None: no
        expiry; <= 0: expired, not to be sent [MQTT-3.3.2-5])."""
        if self.expiry is None:
            return None
        return self.expiry - int(max(0.0, now - self.received))

    # ------------------------------------------------------------ encoding
    def frame(self, level: int, qos: int, pid: int | None, *, dup: bool = False,
              retain: bool = False, sub_ids: tuple[int, ...] = (), now: float = 0.0) -> bytes:
        """The PUBLISH for one subscriber at protocol ``level`` (see the
        module docstring). ``pid`` is required when ``qos`` > 0."""
        first = 0x30 | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
        if self.expiry is None and not sub_ids:
            parts = self.parts(level == 5, first)
            if qos:
                return parts[0] + _U16.pack(pid) + parts[1]
            return parts[0] + parts[1]
        props = self._props
        if level == 5:
            left = None if self.expiry is None else self.remaining(now)
            if left is not None:
                at = self._exp_at
                props = props[:at] + _U32.pack(max(left, 0)) + props[at + 4:]
            if sub_ids:
                props = props + b"".join(b"\x0b" + encode_varint(s) for s in sub_ids)
        tail = self._tail(level, props)
        head = self._topic_b
        if qos:
            head = head + _U16.pack(pid)
        return bytes((first,)) + encode_varint(len(head) + len(tail)) + head + tail

    def parts(self, v5: bool, first: int) -> tuple[bytes, bytes]:
        """The PUBLISH with first byte ``first`` (MQTT 5 when ``v5``) for a
        message with no expiry and no Subscription Identifier, the common
        case: the bytes before the Packet Identifier and those after it,
        the same for every subscriber (cached per level and first byte).
        Below QoS 1 the frame is the two joined (it has no identifier)."""
        key = first | 0x100 if v5 else first
        parts = self._cache.get(key)
        if parts is None:
            tail = self._tail(5 if v5 else 4, self._props)
            body = len(self._topic_b) + (2 if first & 0x06 else 0) + len(tail)
            head = bytes((first,)) + encode_varint(body) + self._topic_b
            parts = self._cache[key] = (head, tail)
        return parts

    def _tail(self, level: int, props: bytes) -> bytes:
        if level == 5:
            return encode_varint(len(props)) + props + self.payload
        return self.payload

    def frame_size(self, level: int, qos: int, sub_ids: tuple[int, ...] = ()) -> int:
        """The size :meth:`frame` would have (Maximum Packet Size checks)."""
        body = len(self._topic_b) + (2 if qos else 0) + self.size
        if level == 5:
            plen = len(self._props) + sum(1 + len(encode_varint(s)) for s in sub_ids)
            body += len(encode_varint(plen)) + plen
        return 1 + len(encode_varint(body)) + body

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, qos={self.qos}, retain={self.retain}, "
                f"payload=<{self.size} bytes>, ref={self.ref})")
