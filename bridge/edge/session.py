"""The edge's per-connection MQTT session state machine. Sans-IO.

No sockets, no event loop, no clock, no files: bytes and times go in,
*actions* come out, and the server (:mod:`bridge.edge.server`) performs them
in order. Tests drive it with bytes alone.

API
---
``Session(conn_id, remote, limits, now)`` for each new network connection,
then:

* ``receive_data(data, now) -> list[action]``: feed bytes as they arrive.
  Partial frames are kept until complete; nothing is an error for being short.
* ``accept(client, session_present, now) / refuse(rule, reason, detail)``:
  the server's answer to a :class:`ConnectRequest` (after authentication
  and take-over of an existing connection; the session never blocks).
  Bytes that arrive meanwhile are buffered and processed on ``accept``.
* ``tick(now) -> list[action]`` once ``now >= session.deadline``: connect
  timeout, keep-alive timeout (1.5 x Keep Alive).
* ``connection_lost(now)``, ``shutdown()``, ``take_over()``: the connection
  ended, the server is shutting down (DISCONNECT 0x8B in MQTT 5), a new
  connection took the Client Identifier (0x8E). These publish the Will.
* ``quota_released(n)``: the server wrote ``n`` PUBACK / PUBCOMP (or refusing
  PUBREC) packets, so the client may send that many more QoS>0 PUBLISH packets
  under Receive Maximum [MQTT-3.3.4-7]. Called right when the bytes are
  handed to the transport, which is before the client can have seen them.

Actions, performed strictly in list order (and across calls, in call order):

* :class:`Capture`: append ``frame`` with ``headers`` to the capture log
  (partition key: the connection id, key: the client id). When ``reply`` is
  set, send it once the record is durable (and, with ``ack_after =
  "forward"``, once ``forward`` -- this record, or the QoS 2 entry it
  re-acknowledges -- has been forwarded). ``qos2`` / ``release`` link the
  record to QoS 2 state (see :meth:`Capture.captured`).
* :class:`Send`: write bytes, after everything queued before them.
* :class:`ConnectRequest`: authenticate and attach the client's session.
* :class:`WillMessage`: capture the Will as a PUBLISH (origin ``will``), after
  ``delay_s`` unless the session resumes first.
* :class:`Close`: close the network connection once everything queued before
  it has been written (and every record captured before it is durable).
* :class:`Notice`: a line for the server's log (ids and sizes only).

What is captured: every frame the client sends that the edge accepts, raw,
except PINGREQ (no content; keep-alive traffic of idle devices would
dominate the log), and the CONNECT with its password removed (header
``redacted=password``). A frame the edge rejects is captured too, with
``reject`` (rule id), ``reject_code`` (the MQTT 5 reason code) and
``reject_error`` before the connection is closed; see :func:`reject_record`
for oversized and malformed-CONNECT frames. A PUBLISH refused with the
connection kept (PUBACK/PUBREC 0x97 or 0x99, or a QoS 0 one whose payload
breaks its Payload Format Indicator) carries the same headers, so the job
quarantines every frame the edge did not take.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
from typing import Union

from bridge.config import EdgeConfig
from bridge.edge import rules as edge_rules
from bridge.edge.state import NEVER_EXPIRES, ClientSession, Qos2Entry
from bridge.mqtt import (
    Connack, Connect, Disconnect, IncompleteData, MqttError, PingReq, Properties, PubAck,
    PubComp, PubRec, PubRel, Publish, Subscribe, Unsubscribe, check_client_id,
    check_payload_format, check_topic_alias, encode,
)
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.fixed_header import PacketType, encode_fixed_header, parse_fixed_header
from bridge.mqtt.reason_codes import connack_v3_code
from bridge.mqtt.rules import (
    CLIENT_ID_REJECTED, DISCONNECT_SESSION_EXPIRY, RECEIVE_MAXIMUM_EXCEEDED,
    RETAIN_NOT_SUPPORTED, SECOND_CONNECT, TOPIC_ALIAS_UNMAPPED,
    UNSUPPORTED_PROTOCOL_VERSION, violation,
)

__all__ = [
    "Action",
    "Capture",
    "Close",
    "ConnectRequest",
    "Limits",
    "Notice",
    "REJECT_RECORD_BYTES",
    "Send",
    "Session",
    "WillMessage",
    "will_publish",
    "redact_password",
    "reject_record",
    "version_name",
]

#: A rejected frame that is not complete (judged from its first bytes, or
#: larger than the Maximum Packet Size) is recorded truncated to this many bytes.
REJECT_RECORD_BYTES = 1024
#: MQTT's largest packet: a Maximum Packet Size at this value is not advertised.
MQTT_MAX_PACKET = 268_435_460
_KEEPALIVE_FACTOR = 1.5

_ACK = struct.Struct(">BBH")
_ACK_PACK = _ACK.pack
_ACK_RC = struct.Struct(">BBHB")
_PINGRESP = b"\xd0\x00"
_PASSWORD_FLAG = 0x40

_VERSIONS = {3: "3.1", 4: "3.1.1", 5: "5"}


def version_name(level: int | None) -> str:
    """``"3.1"``, ``"3.1.1"``, ``"5"`` or ``"-"``."""
    return _VERSIONS.get(level, "-")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the edge allows and advertises (from ``[edge]``)."""

    max_packet_bytes: int = 1048576
    receive_maximum: int = 1024
    topic_alias_maximum: int = 64
    max_inflight_qos2: int = 1024
    connect_timeout_s: float = 10.0
    retain_available: bool = True

    @classmethod
    def from_config(cls, edge: EdgeConfig) -> Limits:
        return cls(edge.max_packet_bytes, edge.receive_maximum, edge.topic_alias_maximum,
                   edge.max_inflight_qos2, edge.connect_timeout_s, edge.retain_available)


# ------------------------------------------------------------------ actions
class Capture:
    """Append ``frame`` to the capture log; optionally ``reply`` once durable.

    ``quota``: Receive Maximum units freed when ``reply`` is written.
    ``forward``: with ``ack_after = "forward"``, also wait until the AMQP sink
    forwarded this record (True) or the given :class:`Qos2Entry`'s record.
    ``qos2``: the entry whose capture coordinates this record sets.
    ``release``: on a PUBREL, the entry it releases (adds ``rel_topic`` and
    ``rel_seq`` to the headers at append time, see :meth:`final_headers`).
    """

    __slots__ = ("frame", "headers", "reply", "quota", "forward", "qos2", "release")

    def __init__(self, frame: bytes, headers: list[tuple[str, bytes]], reply: bytes | None = None,
                 quota: int = 0, forward: bool | Qos2Entry | None = None,
                 qos2: Qos2Entry | None = None, release: Qos2Entry | None = None) -> None:
        self.frame = frame
        self.headers = headers
        self.reply = reply
        self.quota = quota
        self.forward = forward
        self.qos2 = qos2
        self.release = release

    def final_headers(self) -> list[tuple[str, bytes]]:
        """The headers to append with (a PUBREL's rel_topic/rel_seq are read
        from its entry now: the PUBLISH it releases may have been appended
        after this action was created, by an earlier action of the same batch)."""
        rel = self.release
        if rel is None:
            return self.headers
        extra = [("rel_topic", rel.topic.encode())]
        if rel.seq is not None:
            extra.append(("rel_seq", str(rel.seq).encode()))
        return self.headers + extra

    def captured(self, partition: int, offset: int, seq: int) -> None:
        """The server appended the record here."""
        if self.qos2 is not None:
            self.qos2.captured(partition, offset, seq)

    def __repr__(self) -> str:
        keys = ",".join(k for k, _ in self.headers)
        return (f"Capture(frame=<{len(self.frame)} bytes>, headers=[{keys}], "
                f"reply={None if self.reply is None else self.reply.hex()})")


class Send:
    """Write ``data`` (after everything queued before it)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Send({self.data.hex()})"


class Close:
    """Close the connection once everything queued before is written.
    ``reason`` is for the connection's log line."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Close({self.reason!r})"


class Notice:
    """A line for the server's log (never payloads or passwords)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"Notice({self.message!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class ConnectRequest:
    """A valid CONNECT awaits the server's decision (authentication,
    connection limit, take-over, session lookup). ``client_id`` is the one
    the session will use (assigned when the client sent an empty one);
    ``expiry_s`` the effective Session Expiry Interval (3.x: 0 for Clean
    Session 1, :data:`NEVER_EXPIRES` for 0)."""

    client_id: str
    username: str | None
    password: bytes | None
    clean_start: bool
    expiry_s: int
    protocol_level: int

    def __repr__(self) -> str:  # never the password
        pw = "None" if self.password is None else f"<{len(self.password)} bytes>"
        return (f"ConnectRequest(client_id={self.client_id!r}, username={self.username!r}, "
                f"password={pw}, clean_start={self.clean_start}, expiry_s={self.expiry_s}, "
                f"protocol_level={self.protocol_level})")


class WillMessage:
    """Capture the Will: ``frame`` is a PUBLISH encoded at the connection's
    protocol level. ``delay_s`` 0: now; otherwise after that many seconds
    unless a connection resumes the session of ``client_id`` first."""

    __slots__ = ("client_id", "key", "conn_id", "frame", "headers", "delay_s")

    def __init__(self, client_id: str, key: bytes, conn_id: str, frame: bytes,
                 headers: list[tuple[str, bytes]], delay_s: int) -> None:
        self.client_id = client_id
        self.key = key
        self.conn_id = conn_id
        self.frame = frame
        self.headers = headers
        self.delay_s = delay_s

    def __repr__(self) -> str:
        return f"WillMessage(client_id={self.client_id!r}, frame=<{len(self.frame)} bytes>, " \
               f"delay_s={self.delay_s})"

    def to_json(self) -> dict:
        return {"client_id": self.client_id, "key": base64.b64encode(self.key).decode(),
                "conn_id": self.conn_id, "frame": base64.b64encode(self.frame).decode(),
                "headers": [[k, base64.b64encode(v).decode()] for k, v in self.headers],
                "delay_s": self.delay_s}

    @classmethod
    def from_json(cls, d: dict) -> "WillMessage":
        return cls(d["client_id"], base64.b64decode(d["key"]), d["conn_id"],
                   base64.b64decode(d["frame"]),
                   [(k, base64.b64decode(v)) for k, v in d["headers"]], int(d["delay_s"]))


def will_publish(connect: Connect, expiry_s: int) -> tuple[bytes, int]:
    """The Will of an accepted ``connect`` as the PUBLISH frame the edge
    captures (at the connection's protocol level; Will Properties become
    PUBLISH properties; a QoS 1/2 Will gets Packet Identifier 1) and its
    delay in seconds (MQTT 5: the Will Delay Interval, at most the Session
    Expiry Interval ``expiry_s``; 3.x: 0). Used by the session and by the
    recovery of Wills a crash left owed (``bridge.edge.persist``)."""
    w = connect.will
    level = connect.protocol_level
    delay = 0
    props = Properties()
    if level == 5:
        wp = w.properties
        props = Properties(
            payload_format_indicator=wp.payload_format_indicator,
            message_expiry_interval=wp.message_expiry_interval,
            content_type=wp.content_type, response_topic=wp.response_topic,
            correlation_data=wp.correlation_data, user_properties=wp.user_properties)
        delay = min(wp.will_delay_interval or 0, expiry_s)
    frame = encode(Publish(qos=w.qos, retain=w.retain, topic=w.topic,
                           packet_id=1 if w.qos else None, properties=props,
                           payload=w.payload), level)
    return frame, delay


Action = Union[Capture, Send, Close, Notice, ConnectRequest, WillMessage]

# ------------------------------------------------------------------ helpers


def redact_password(frame: bytes, password_len: int) -> bytes:
    """The CONNECT ``frame`` without its Password field and Password Flag,
    with the Remaining Length fixed. The frame must have decoded with a
    password of ``password_len`` bytes: the Password is then the last field
    of the packet (the codec checks nothing follows it)."""
    fh = parse_fixed_header(frame, minimal=False)  # 3.x may send a non-minimal one
    start = fh.header_length
    body = frame[start:fh.total_length]
    name_len = (body[0] << 8) | body[1]
    flags_at = 2 + name_len + 1
    new_body = b"".join((body[:flags_at], bytes((body[flags_at] & ~_PASSWORD_FLAG,)),
                         body[flags_at + 1:len(body) - 2 - password_len]))
    return encode_fixed_header(frame[0], len(new_body)) + new_body


def _connect_head_length(view) -> int | None:
    """Bytes of a CONNECT up to the end of Keep Alive (fixed header,
    Protocol Name, Version, Connect Flags, Keep Alive), or None."""
    try:
        fh = parse_fixed_header(view, minimal=False)
    except MqttError:
        return None
    if fh is None:
        return None
    pos = fh.header_length
    if len(view) < pos + 2:
        return None
    return pos + 2 + ((view[pos] << 8) | view[pos + 1]) + 4


def reject_record(view, err: MqttError) -> tuple[bytes, str]:
    """(bytes to record, note) for a rejected frame at the start of ``view``.

    * a complete frame is recorded whole;
    * a frame whose fixed header is malformed (a Remaining Length of five
      bytes, or not minimal) is recorded as its first five bytes;
    * a frame rejected from its first bytes before it was complete, or one
      larger than the Maximum Packet Size (never buffered), is recorded
      truncated to the bytes at hand, at most :data:`REJECT_RECORD_BYTES`;
    * a CONNECT that failed to decode keeps only its fixed and variable
      header up to Keep Alive: its payload may hold a password the edge
      cannot locate in a malformed packet, and passwords are never stored.
    """
    have = len(view)
    total = None
    try:
        # strict for the minimal-length rule only when that rule was the fault
        fh = parse_fixed_header(view, minimal=err.rule == "MQTT-1.5.5-1")
        if fh is not None:
            total = fh.total_length
    except MqttError:  # the fixed header itself is bad: its bytes are all there is
        return bytes(view[:min(have, 5)]), ""
    if have and view[0] >> 4 == PacketType.CONNECT:
        head = _connect_head_length(view)
        keep = min(have, head if head is not None else 2, REJECT_RECORD_BYTES)
        return bytes(view[:keep]), f"; CONNECT payload not recorded ({keep} of {total or have} bytes)"
    if total is not None and total <= have:
        return bytes(view[:total]), ""
    keep = min(have, REJECT_RECORD_BYTES, total if total is not None else have)
    shown = total if total is not None else f"{have}+"
    return bytes(view[:keep]), f"; truncated: {keep} of {shown} bytes recorded"


def _ack(first: int, pid: int) -> bytes:
    return _ACK.pack(first, 2, pid)


# ------------------------------------------------------------------ session
AWAIT_CONNECT = "await-connect"
CONNECTING = "connecting"
CONNECTED = "connected"
CLOSED = "closed"


class Session:
    """One network connection's MQTT session (see the module docstring)."""

    def __init__(self, conn_id: str, remote: str, limits: Limits, now: float, *,
                 busy: bool = False) -> None:
        self.conn_id = conn_id
        self.remote = remote
        self.limits = limits
        self._receive_maximum = limits.receive_maximum
        self._retain_ok = limits.retain_available
        #: refuse the CONNECT with Server busy (the server is at max_connections)
        self.busy = busy
        self.state = AWAIT_CONNECT
        self.level: int | None = None
        self.client_id = ""
        self.key = b""
        self.username: str | None = None
        self.keepalive = 0
        self.clean_start = True
        self.expiry_s = 0
        self.client: ClientSession | None = None
        self.session_present = False
        self.will = None
        self._owed: tuple[int, WillMessage] | None = None
        self.close_reason: str | None = None
        #: MQTT 5 Maximum Packet Size the client accepts (None: no limit)
        self.client_max_packet: int | None = None
        self.frames_in = 0
        self.bytes_in = 0
        self._buf = bytearray()
        self._need = 0
        self._connect: Connect | None = None
        self._connect_frame = b""
        self._assigned = False
        self._aliases: dict[int, str] = {}
        self._inflight = 0
        self._qos2_here: set[int] = set()
        self._started = now
        self._last_rx = now
        self._headers: list[tuple[str, bytes]] = []
        self._conn_b = conn_id.encode()
        self._remote_b = remote.encode()

    @property
    def buffered(self) -> int:
        """Bytes received and held: an incomplete frame (or, while the CONNECT
        is being checked, whatever arrived after it)."""
        return len(self._buf)

    # -------------------------------------------------------------- timers
    @property
    def deadline(self) -> float | None:
        """When :meth:`tick` must be called next (None: no timer)."""
        if self.state in (AWAIT_CONNECT, CONNECTING):
            return self._started + self.limits.connect_timeout_s
        if self.state == CONNECTED and self.keepalive:
            return self._last_rx + _KEEPALIVE_FACTOR * self.keepalive
        return None

    def tick(self, now: float) -> list[Action]:
        """Fire the timers that are due at ``now``."""
        if self.state in (AWAIT_CONNECT, CONNECTING):
            if now >= self._started + self.limits.connect_timeout_s:
                self.state = CLOSED
                return [Close(f"connect timeout ({self.limits.connect_timeout_s:g} s, "
                              f"{len(self._buf)} bytes buffered)")]
        elif self.state == CONNECTED and self.keepalive:
            if now >= self._last_rx + _KEEPALIVE_FACTOR * self.keepalive:
                return self._server_disconnect(
                    0x8D, f"keep alive timeout [{edge_rules.KEEP_ALIVE_TIMEOUT}] "
                    f"(no packet for {_KEEPALIVE_FACTOR * self.keepalive:g} s)")
        return []

    # -------------------------------------------------------------- input
    def receive_data(self, data: bytes, now: float) -> list[Action]:
        """Feed bytes from the network; returns the actions they cause."""
        if self.state == CLOSED:
            return []
        self._last_rx = now
        self.bytes_in += len(data)
        buf = self._buf
        if buf or self.state == CONNECTING:
            buf += data
            if len(buf) < self._need or self.state == CONNECTING:
                return []
            return self._process_buffer()
        actions: list[Action] = []
        used = self._process(memoryview(data), actions)
        if used < len(data) and self.state != CLOSED:
            buf += data[used:]
        return actions

    def _process_buffer(self) -> list[Action]:
        actions: list[Action] = []
        buf = self._buf
        view = memoryview(buf)
        try:
            used = self._process(view, actions)
        finally:
            view.release()
        if self.state == CLOSED:
            buf.clear()
        else:
            del buf[:used]
        return actions

    def _process(self, view: memoryview, actions: list[Action]) -> int:
        """Handle the complete frames at the start of ``view``; returns the
        number of bytes consumed. (The hot path: one iteration per frame.)"""
        pos = 0
        end = len(view)
        self._need = 0
        limit = self.limits.max_packet_bytes
        decode = decode_packet
        on_publish = self._publish
        frames = 0
        try:
            while pos < end:
                state = self.state
                if state is not CONNECTED and state is not AWAIT_CONNECT:
                    break
                level = self.level
                if level == 5 and view[pos] >> 4 == 15:
                    # The edge accepts no Authentication Method, so any AUTH
                    # is a session fault, whatever its content [MQTT-4.12.0-7].
                    self._reject(view[pos:], violation(
                        "MQTT-4.12.0-7", "AUTH from a Client whose CONNECT had no "
                        "Authentication Method", packet_type=PacketType.AUTH, protocol_level=5),
                        actions)
                    return end
                try:
                    packet, used = decode(view[pos:], level, max_packet_bytes=limit)
                except IncompleteData as inc:
                    self._need = inc.needed or 0  # counted from the frame's start
                    return pos
                except MqttError as err:
                    self._reject(view[pos:], err, actions)
                    return end
                nxt = pos + used
                frame = view[pos:nxt].tobytes()
                pos = nxt
                frames += 1
                try:
                    if type(packet) is Publish:
                        on_publish(packet, frame, actions)
                    else:
                        self._other(packet, frame, actions)
                except MqttError as err:
                    self._reject(memoryview(frame), err, actions)
                    return end
            return pos
        finally:
            self.frames_in += frames

    # -------------------------------------------------------------- CONNECT
    def _on_connect(self, p: Connect, frame: bytes, actions: list[Action]) -> None:
        level = p.protocol_level
        self.level = level
        self._connect = p
        self._connect_frame = frame
        self.client_id = p.client_id
        self.username = p.username
        self.keepalive = p.keepalive
        self.clean_start = p.clean_start
        self.will = p.will
        self.key = p.client_id.encode()
        props = p.properties
        if level == 5:
            self.client_max_packet = props.maximum_packet_size
            self.expiry_s = props.session_expiry_interval or 0
        else:
            self.expiry_s = 0 if p.clean_start else NEVER_EXPIRES
        self._headers = self._base_headers(b"client")
        check_client_id(p)  # raises [MQTT-3.1.3-8] (0x85)
        if level == 5 and props.authentication_method is not None:
            raise edge_rules.edge_violation(
                edge_rules.AUTH_METHOD_UNSUPPORTED,
                f"CONNECT Authentication Method of {len(props.authentication_method)} characters "
                "is not supported", protocol_level=5, packet_type=PacketType.CONNECT)
        if level == 5 and p.will is not None:
            # MQTT 5.0 section 3.1.3.2.3: the Server MAY validate the Will's
            # payload format and refuse with CONNACK 0x99; the job would
            # quarantine the captured Will otherwise.
            check_payload_format(p.will, what="Will Payload", packet_type=PacketType.CONNECT)
        if not p.client_id:
            self.client_id = f"lakegate-{self.conn_id}"
            self.key = self.client_id.encode()
            self._assigned = True
        if self._connack(0, False) is None:
            # MQTT-3.1.2-24: the Server must not send it. Closed without any
            # CONNACK: from 5 bytes a refusing one would fit, but no reason
            # code says why (0x95 Packet too large means the CONNECT was).
            size = len(self._connack(0, False, limit=False))
            raise violation("MQTT-3.1.2-24", f"the CONNACK of {size} bytes exceeds the client's "
                            f"Maximum Packet Size of {self.client_max_packet} bytes: closed "
                            "without a CONNACK", packet_type=PacketType.CONNECT, protocol_level=5)
        if self.busy:
            raise edge_rules.edge_violation(
                edge_rules.EDGE_BUSY, "the edge serves edge.max_connections connections",
                protocol_level=level, packet_type=PacketType.CONNECT)
        self.state = CONNECTING
        actions.append(ConnectRequest(self.client_id, p.username, p.password, p.clean_start,
                                      self.expiry_s, level))

    def accept(self, client: ClientSession, session_present: bool, now: float) -> list[Action]:
        """The server accepted the CONNECT: capture it, send CONNACK, then
        handle whatever arrived after the CONNECT."""
        if self.state != CONNECTING:
            return []
        self.client = client
        self.session_present = session_present
        self._last_rx = now
        actions: list[Action] = []
        connack = self._connack(0, session_present)
        self.state = CONNECTED
        actions.append(Capture(*self._connect_record(), reply=None))
        actions.append(Send(connack))
        if self._buf:
            actions.extend(self._process_buffer())
        return actions

    def refuse(self, rule: str, reason_code: int, detail: str) -> list[Action]:
        """The server refused the CONNECT (authentication, take-over failure)."""
        if self.state != CONNECTING:
            return []
        actions: list[Action] = []
        err = edge_rules.edge_violation(rule, detail, reason_code=reason_code,
                                        protocol_level=self.level, packet_type=PacketType.CONNECT)
        self._reject_connect(err, actions)
        return actions

    def _connect_record(self) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The CONNECT frame as captured (password removed) and its headers."""
        p = self._connect
        frame = self._connect_frame
        headers = self._headers
        if p.password is not None:
            frame = redact_password(frame, len(p.password))
            headers = headers + [("redacted", b"password")]
        return frame, headers

    def _connack(self, reason: int, session_present: bool, *, limit: bool = True
                 ) -> bytes | None:
        """The CONNACK bytes, or None when they exceed the client's Maximum
        Packet Size (the edge then closes without a CONNACK); ``limit=False``:
        the bytes whatever their size."""
        level = self.level
        if level == 5:
            lim = self.limits
            props = {}
            if reason == 0:
                if lim.receive_maximum != 65535:
                    props["receive_maximum"] = lim.receive_maximum
                if lim.topic_alias_maximum:
                    props["topic_alias_maximum"] = lim.topic_alias_maximum
                if lim.max_packet_bytes < MQTT_MAX_PACKET:
                    props["maximum_packet_size"] = lim.max_packet_bytes
                if not lim.retain_available:
                    props["retain_available"] = 0
                if self._assigned:
                    props["assigned_client_identifier"] = self.client_id
            data = encode(Connack(session_present, reason, Properties(**props)), 5)
            cmp = self.client_max_packet
            if limit and cmp is not None and len(data) > cmp:
                return None
            return data
        code = reason if reason < 0x80 else connack_v3_code(reason)
        if code is None:
            return b""
        # MQTT 3.1 has no Session Present flag: its CONNACK byte 1 is reserved.
        return bytes((0x20, 2, 1 if session_present and level == 4 else 0, code))

    # -------------------------------------------------------------- PUBLISH
    def _publish(self, p: Publish, frame: bytes, actions: list[Action]) -> None:
        headers = self._headers
        topic = p.topic
        if self.level == 5:
            alias = p.properties.topic_alias
            if alias is not None:
                check_topic_alias(p, self.limits.topic_alias_maximum)  # [MQTT-3.3.2-9]
                if topic:
                    self._aliases[alias] = topic
                else:
                    topic = self._aliases.get(alias)
                    if topic is None:
                        raise violation(TOPIC_ALIAS_UNMAPPED,
                                        f"PUBLISH Topic Alias {alias} has no Topic Name mapped",
                                        packet_type=PacketType.PUBLISH, protocol_level=5)
                headers = headers + [("alias_topic", topic.encode())]
        if p.retain and not self._retain_ok:
            raise violation(RETAIN_NOT_SUPPORTED, "PUBLISH has RETAIN 1 but the edge announced "
                            "Retain Available 0", packet_type=PacketType.PUBLISH,
                            protocol_level=self.level)
        qos = p.qos
        if self.level == 5 and p.properties.payload_format_indicator == 1:
            try:
                check_payload_format(p)  # [LG-payload-format-invalid], MQTT 5.0 3.3.2.3.2
            except MqttError as err:
                self._refuse_publish(p, frame, headers, err, actions)
                return
        if qos == 0:
            actions.append(Capture(frame, headers))
            return
        pid = p.packet_id
        if qos == 1:
            if self._inflight >= self._receive_maximum:
                self._count_inflight()  # raises in MQTT 5 [MQTT-3.3.4-7]
            else:
                self._inflight += 1
            actions.append(Capture(frame, headers, _ACK_PACK(0x40, 2, pid), 1, True))
            return
        entries = self.client.qos2
        entry = entries.get(pid)
        if entry is not None:
            # A re-send of a Packet Identifier awaiting PUBREL: acknowledge
            # again, mark the copy so that the job delivers the message once.
            actions.append(Capture(frame, headers + [("dup", b"1")], _ACK.pack(0x50, 2, pid), 0,
                                   entry))
            return
        self._count_inflight()
        if len(entries) >= self.limits.max_inflight_qos2:
            err = edge_rules.edge_violation(
                edge_rules.QOS2_QUOTA, f"{len(entries)} QoS 2 Packet Identifiers await PUBREL "
                f"(edge.max_inflight_qos2 {self.limits.max_inflight_qos2})",
                protocol_level=self.level, packet_type=PacketType.PUBLISH)
            if self.level != 5:
                raise err
            actions.append(Capture(frame, self._reject_headers(err), _ACK_RC.pack(0x50, 3, pid, 0x97),
                                   1))
            return
        entry = Qos2Entry(topic)
        entries[pid] = entry
        self._qos2_here.add(pid)
        actions.append(Capture(frame, headers, _ACK.pack(0x50, 2, pid), 0, True, entry))

    def _refuse_publish(self, p: Publish, frame: bytes, headers: list[tuple[str, bytes]],
                        err: MqttError, actions: list[Action]) -> None:
        """Refuse a PUBLISH whose content the edge will not take (MQTT 5 only;
        the connection stays open): QoS 1 gets PUBACK, QoS 2 PUBREC, with the
        error's reason code (a PUBREC >= 0x80 ends the QoS 2 exchange, so no
        Packet Identifier is kept awaiting PUBREL). QoS 0 has no acknowledgement
        to carry a refusal: the frame is captured marked all the same (the job
        quarantines it with the edge's rule and forwards nothing), and the
        connection stays open rather than dropping the messages behind it for
        one message's content. Every refused frame is captured with the reject
        headers; refused frames wait for no forwarding (``ack_after``)."""
        marked = headers + [("reject", err.rule.encode()),
                            ("reject_code", str(err.reason_code).encode()),
                            ("reject_error", str(err).encode())]
        qos = p.qos
        if qos == 0:
            actions.append(Capture(frame, marked))
            return
        pid = p.packet_id
        quota = 1
        if qos == 2 and pid in self.client.qos2:
            quota = 0  # counted when the PUBLISH it re-sends arrived
        else:
            self._count_inflight()  # a refused PUBLISH counts until its ack is written
        first = 0x40 if qos == 1 else 0x50
        actions.append(Capture(frame, marked, _ACK_RC.pack(first, 3, pid, err.reason_code), quota))

    def _count_inflight(self) -> None:
        if self._inflight >= self._receive_maximum and self.level == 5:
            raise violation(RECEIVE_MAXIMUM_EXCEEDED,
                            f"more than Receive Maximum {self.limits.receive_maximum} QoS>0 "
                            "PUBLISH packets are unacknowledged",
                            packet_type=PacketType.PUBLISH, protocol_level=5)
        self._inflight += 1

    def quota_released(self, n: int) -> None:
        """``n`` PUBACK/PUBCOMP (or refusing PUBREC) packets were written."""
        self._inflight -= n

    # -------------------------------------------------------------- others
    def _other(self, p, frame: bytes, actions: list[Action]) -> None:
        t = type(p)
        if self.state == AWAIT_CONNECT:  # the codec lets only a CONNECT through
            self._on_connect(p, frame, actions)
            return
        headers = self._headers
        level = self.level
        if t is PubRel:
            pid = p.packet_id
            entry = self.client.qos2.pop(pid, None)
            if entry is None:
                reply = _ACK_RC.pack(0x70, 3, pid, 0x92) if level == 5 else _ack(0x70, pid)
                actions.append(Capture(frame, headers, reply))
                return
            quota = 0
            if pid in self._qos2_here:
                self._qos2_here.discard(pid)
                quota = 1
            actions.append(Capture(frame, headers, _ack(0x70, pid), quota, True, None, entry))
        elif t is PingReq:
            actions.append(Send(_PINGRESP))
        elif t is Disconnect:
            self._on_disconnect(p, frame, actions)
        elif t is PubRec:
            # The edge sends no PUBLISH, so this PUBREC answers nothing; a
            # sender must still answer PUBREC < 0x80 with PUBREL [MQTT-4.3.3-4].
            reply = None
            if p.reason_code < 0x80:
                reply = (_ACK_RC.pack(0x62, 3, p.packet_id, 0x92) if level == 5
                         else _ack(0x62, p.packet_id))
            actions.append(Capture(frame, headers, reply))
        elif t is PubAck or t is PubComp:
            actions.append(Capture(frame, headers))
        elif t is Subscribe:
            n = len(p.subscriptions)
            actions.append(Capture(frame, headers, encode_suback(p.packet_id, n, level)))
            actions.append(Notice(f"SUBSCRIBE refused: {n} topic filter(s), packet id "
                                  f"{p.packet_id} (no subscriber delivery)"))
        elif t is Unsubscribe:
            n = len(p.topic_filters)
            reply = encode_unsuback(p.packet_id, n) if level == 5 else _ack(0xB0, p.packet_id)
            actions.append(Capture(frame, headers, reply))
            actions.append(Notice(f"UNSUBSCRIBE answered: {n} topic filter(s), packet id "
                                  f"{p.packet_id} (no subscription existed)"))
        elif t is Connect:
            raise violation(SECOND_CONNECT, "a second CONNECT on the connection",
                            packet_type=PacketType.CONNECT, protocol_level=level)
        else:  # pragma: no cover - the codec admits no other type from a client
            raise violation("LG-packet-direction", f"{type(p).__name__} sent by a Client",
                            protocol_level=level)

    def _on_disconnect(self, p: Disconnect, frame: bytes, actions: list[Action]) -> None:
        reason = p.reason_code
        if self.level == 5:
            new_expiry = p.properties.session_expiry_interval
            if new_expiry is not None:
                if new_expiry and not self.expiry_s:
                    raise violation(DISCONNECT_SESSION_EXPIRY,
                                    "DISCONNECT sets Session Expiry Interval "
                                    f"{new_expiry} after CONNECT set 0",
                                    packet_type=PacketType.DISCONNECT, protocol_level=5)
                self.expiry_s = new_expiry
                if self.client is not None:  # the store drops it on close when 0
                    self.client.expiry_s = new_expiry
                    self.client.persistent = new_expiry > 0
        actions.append(Capture(frame, self._headers))
        if reason == 0:
            self.will = None  # [MQTT-3.1.2-10]
            why = "client DISCONNECT"
        else:
            why = f"client DISCONNECT 0x{reason:02X}"
        self._will_into(actions)
        self.close_reason = why
        self.state = CLOSED
        actions.append(Close(why))

    # -------------------------------------------------------------- endings
    def connection_lost(self, now: float) -> list[Action]:
        """The network connection ended (peer closed, I/O error)."""
        if self.state == CLOSED:
            return []
        actions: list[Action] = []
        if self.state == CONNECTED:
            self._will_into(actions)
        self.state = CLOSED
        self.close_reason = self.close_reason or "connection lost"
        return actions

    def shutdown(self) -> list[Action]:
        """The server is shutting down: DISCONNECT 0x8B (MQTT 5), Will, close."""
        if self.state == CLOSED:
            return []
        if self.state != CONNECTED:
            self.state = CLOSED
            return [Close("server shutting down")]
        return self._server_disconnect(0x8B, "server shutting down")

    def take_over(self) -> list[Action]:
        """Another connection took this Client Identifier [MQTT-3.1.4-3]."""
        if self.state != CONNECTED:
            self.state = CLOSED
            return [Close("session taken over")]
        return self._server_disconnect(0x8E, f"session taken over [{edge_rules.SESSION_TAKEN_OVER}]")

    def _server_disconnect(self, reason: int, why: str) -> list[Action]:
        actions: list[Action] = []
        if self.level == 5:
            actions.append(Send(bytes((0xE0, 1, reason))))
        self._will_into(actions)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))
        return actions

    # -------------------------------------------------------------- will
    def owed_will(self) -> WillMessage | None:
        """The Will this connection would leave if it ended now without a
        normal DISCONNECT (None: it has none, or is not connected)."""
        if self.will is None or self.state not in (CONNECTED, CLOSED) or self.client is None:
            return None
        cached = self._owed
        if cached is None or cached[0] != self.expiry_s:  # snapshots ask every few seconds
            frame, delay = will_publish(self._connect, self.expiry_s)  # self.will is the CONNECT's
            cached = self._owed = (self.expiry_s, WillMessage(
                self.client_id, self.key, self.conn_id, frame, self._base_headers(b"will"), delay))
        return cached[1]

    def _will_into(self, actions: list[Action]) -> None:
        w = self.owed_will()
        if w is not None:
            self.will = None
            actions.append(w)

    # -------------------------------------------------------------- rejects
    def _base_headers(self, origin: bytes) -> list[tuple[str, bytes]]:
        h = [("conn_id", self._conn_b)]
        if self.level is not None:
            h.append(("proto", str(self.level).encode()))
        h.append(("remote", self._remote_b))
        if self.username is not None:
            h.append(("username", self.username.encode()))
        h.append(("origin", origin))
        return h

    def _reject_headers(self, err: MqttError, note: str = "") -> list[tuple[str, bytes]]:
        headers = self._headers or self._base_headers(b"client")
        return headers + [("reject", err.rule.encode()),
                          ("reject_code", str(err.reason_code).encode()),
                          ("reject_error", (str(err) + note).encode())]

    def _reject(self, view, err: MqttError, actions: list[Action]) -> None:
        """Record the rejected frame, answer as the version demands, close."""
        if self.state == AWAIT_CONNECT:
            if self._connect is not None:  # the CONNECT decoded; a session rule refused it
                self._reject_connect(err, actions)
            else:
                self._reject_first(view, err, actions)
            return
        if err.rule != SECOND_CONNECT and len(view) and view[0] >> 4 == PacketType.CONNECT:
            # Whatever else is wrong with it, a CONNECT on a connected session
            # is a Protocol Error [MQTT-3.1.0-2]: the codec's verdict (e.g. 0x84
            # for a bad Protocol Name or Version, a CONNACK code that no
            # DISCONNECT may carry [MQTT-3.14.2-1]) stays in the message.
            err = violation(SECOND_CONNECT, f"a second CONNECT on the connection ({err})",
                            packet_type=PacketType.CONNECT, protocol_level=self.level)
        if err.rule == SECOND_CONNECT:
            frame, note = self._redacted_second_connect(view)
        else:
            frame, note = reject_record(view, err)
        actions.append(Capture(frame, self._reject_headers(err, note)))
        if self.level == 5:
            actions.append(Send(bytes((0xE0, 1, err.reason_code))))
        self._will_into(actions)
        why = str(err)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))

    def _redacted_second_connect(self, view) -> tuple[bytes, str]:
        """A second CONNECT decoded fine (it is refused for being second):
        record it with the password removed."""
        frame = bytes(view)
        try:
            p, used = decode_packet(frame, None)
        except (MqttError, IncompleteData):
            return reject_record(view, violation(SECOND_CONNECT, "second CONNECT"))
        if p.password is not None:
            return redact_password(frame[:used], len(p.password)), "; password removed"
        return frame[:used], ""

    def _reject_first(self, view, err: MqttError, actions: list[Action]) -> None:
        """A fault in the first packet (the CONNECT, or whatever came instead)."""
        if self._connect is not None:  # the CONNECT decoded; a session rule refused it
            self._reject_connect(err, actions)
            return
        if err.protocol_level is not None:
            self.level = err.protocol_level
        frame, note = reject_record(view, err)
        actions.append(Capture(frame, self._reject_headers(err, note)))
        self._connack_refusal(err, actions)
        why = str(err)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))

    def _reject_connect(self, err: MqttError, actions: list[Action]) -> None:
        frame, headers = self._connect_record()
        extra = [("reject", err.rule.encode()), ("reject_code", str(err.reason_code).encode()),
                 ("reject_error", str(err).encode())]
        actions.append(Capture(frame, headers + extra))
        self._connack_refusal(err, actions)
        why = str(err)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))

    def _connack_refusal(self, err: MqttError, actions: list[Action]) -> None:
        """The CONNACK a refused CONNECT gets, if any: MQTT 5 sends the reason
        code; 3.x only the return codes it has (unsupported version 0x01,
        identifier rejected 0x02, credentials 0x04/0x05, unavailable 0x03);
        an unsupported version gets the 3.x form whatever it asked for, and
        a wrong Protocol Name gets nothing [MQTT-3.1.2-1], nor does a client
        whose Maximum Packet Size the CONNACK exceeds [MQTT-3.1.2-24]."""
        rule = err.rule
        if rule in ("MQTT-3.1.2-1", "MQTT-3.1.0-1", "MQTT-3.1.2-24"):
            return
        if rule == UNSUPPORTED_PROTOCOL_VERSION and self._connect is None:
            actions.append(Send(b"\x20\x02\x00\x01"))
            return
        level = self.level
        if level == 5:
            data = self._connack(err.reason_code, False)
            if data:
                actions.append(Send(data))
            return
        if level in (3, 4) and (rule == CLIENT_ID_REJECTED or self._connect is not None):
            code = connack_v3_code(err.reason_code)
            if code is not None:
                actions.append(Send(bytes((0x20, 2, 0, code))))


def encode_suback(packet_id: int, count: int, level: int) -> bytes:
    """A SUBACK refusing ``count`` topic filters (0x80 Unspecified error /
    3.1.1 Failure; MQTT 3.1 has no failure code and gets 0x80 as well)."""
    body = packet_id.to_bytes(2, "big") + (b"\x00" if level == 5 else b"") + b"\x80" * count
    return encode_fixed_header(0x90, len(body)) + body


def encode_unsuback(packet_id: int, count: int) -> bytes:
    """An MQTT 5 UNSUBACK with 0x11 No subscription existed for each filter."""
    body = packet_id.to_bytes(2, "big") + b"\x00" + b"\x11" * count
    return encode_fixed_header(0xB0, len(body)) + body

