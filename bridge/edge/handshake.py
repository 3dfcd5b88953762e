"""The CONNECT handshake of the edge's session state machine. Sans-IO.

A CONNECT is checked (Client Identifier, Authentication Method, the Will's
payload format and topic depth, whether a CONNACK fits the client's Maximum Packet Size,
the connection limit) and becomes a :class:`ConnectRequest`; the server
answers with :meth:`ConnectHandshake.accept` (capture the CONNECT without its
password, send CONNACK) or :meth:`ConnectHandshake.refuse` (capture it
marked, send the refusing CONNACK the protocol version has, close).

Also here: what the edge allows and advertises (:class:`Limits`), and the
connection states the handshake moves a session through (``AWAIT_CONNECT``
-> ``CONNECTING`` -> ``CONNECTED``; ``CLOSED`` at the end).
:class:`ConnectHandshake` is a part of :class:`bridge.edge.session.Session`
and works on its attributes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bridge.config import EdgeConfig
from bridge.capture.record import Headers
from bridge.edge import rules as edge_rules
from bridge.edge.actions import Action, Capture, Close, ConnectRequest, Send
from bridge.edge.records import redact_password
from bridge.edge.state import NEVER_EXPIRES
from bridge.mqtt import (
    Connack, Connect, MqttError, Properties, check_client_id, check_payload_format, encode,
)
from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.reason_codes import connack_v3_code
from bridge.mqtt.rules import CLIENT_ID_REJECTED, UNSUPPORTED_PROTOCOL_VERSION, violation

if TYPE_CHECKING:
    from bridge.edge.state import ClientSession

__all__ = [
    "AWAIT_CONNECT",
    "CLOSED",
    "CONNECTED",
    "CONNECTING",
    "ConnectHandshake",
    "Limits",
    "MQTT_MAX_PACKET",
    "version_name",
]

#: MQTT's largest packet: a Maximum Packet Size at this value is not advertised.
MQTT_MAX_PACKET = 268_435_460

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
    max_inflight_messages: int = 20
    max_subscriptions_per_client: int = 1000
    #: Levels a Topic Name (PUBLISH, Will) or Topic Filter may have [LG-edge-topic-levels].
    max_topic_levels: int = 200
    #: Characters a Topic Name or Topic Filter may have [LG-edge-topic-length].
    max_topic_length: int = 65535

    @classmethod
    def from_config(cls, edge: EdgeConfig) -> Limits:
        return cls(edge.max_packet_bytes, edge.receive_maximum, edge.topic_alias_maximum,
                   edge.max_inflight_qos2, edge.connect_timeout_s, edge.retain_available,
                   edge.max_inflight_messages, edge.max_subscriptions_per_client,
                   edge.max_topic_levels, edge.max_topic_length)

    def topic_fault(self, topic: str, what: str) -> tuple[str, str] | None:
        """``(rule id, detail)`` when ``topic`` has more levels than
        ``edge.max_topic_levels`` [LG-edge-topic-levels] or more characters
        than ``edge.max_topic_length`` [LG-edge-topic-length]; None when it
        is within both. ``what`` names it in the detail (sizes only)."""
        levels = topic.count("/") + 1
        if levels > self.max_topic_levels:
            return edge_rules.TOPIC_LEVELS, (
                f"{what} of {levels} levels ({len(topic)} characters) exceeds "
                f"edge.max_topic_levels {self.max_topic_levels}")
        if len(topic) > self.max_topic_length:
            return edge_rules.TOPIC_LENGTH, (
                f"{what} of {len(topic)} characters exceeds edge.max_topic_length "
                f"{self.max_topic_length}")
        return None


# ------------------------------------------------------------------ states
AWAIT_CONNECT = "await-connect"
CONNECTING = "connecting"
CONNECTED = "connected"
CLOSED = "closed"


class ConnectHandshake:
    """The CONNECT handshake of a :class:`~bridge.edge.session.Session`."""

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
        self._headers = Headers(self._base_headers(b"client"))  # encoded once per connection
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
        if p.will is not None:
            # The Will is published like a PUBLISH: the same depth and length
            # bounds (CONNACK 0x90 Topic Name invalid; 3.x has no such code: closed).
            fault = self.limits.topic_fault(p.will.topic, "Will Topic")
            if fault is not None:
                raise edge_rules.edge_violation(fault[0], fault[1], protocol_level=level,
                                                packet_type=PacketType.CONNECT)
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

    def authenticated_as(self, username: str) -> None:
        """The server authenticated the client as ``username`` by other means
        than the CONNECT's (a client certificate, ``bridge.edge.tls``): the
        ACL's user and every record's ``username`` from now on."""
        self.username = username
        self._headers = Headers(self._base_headers(b"client"))

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
        # the CONNACK waits for the CONNECT's record like any acknowledgement: a
        # client told its session started (Clean Start) or resumed finds it so
        # after a crash, and on every edge of a cluster (whose fence reads what
        # is in Kafka: a CONNACK sent before would let another edge serve the
        # session the Clean Start ended)
        actions.append(Capture(*self._connect_record(), reply=connack))
        client.username = self.username
        self.router.attach(client)
        actions.extend(self._resume_deliveries(now))  # [MQTT-4.4.0-1]
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


    # -------------------------------------------------------------- refusals
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

