"""What a connected client sends, after the CONNECT: the edge's session
state machine for inbound PUBLISH and its QoS 1 / QoS 2 flows, the other
packets a client may send, and DISCONNECT. Sans-IO.

* PUBLISH: Topic Alias resolution (the resolved topic becomes the
  ``alias_topic`` header), Retain Available, Payload Format Indicator
  (refused with the connection kept: PUBACK/PUBREC 0x99 in MQTT 5, captured
  marked), the topic's depth and length (``edge.max_topic_levels``,
  ``edge.max_topic_length``: 0x90 in MQTT 5, the connection kept; 3.x
  closed) [LG-edge-topic-levels, LG-edge-topic-length], Receive Maximum
  [MQTT-3.3.4-7]; QoS 1 is acknowledged once
  durable, QoS 2 keeps its Packet Identifier awaiting PUBREL in the client's
  :class:`~bridge.edge.state.ClientSession` (bounded by
  ``edge.max_inflight_qos2``), a re-sent one is captured marked ``dup``.
* PUBREL releases the QoS 2 entry (PUBCOMP once durable), PINGREQ gets
  PINGRESP (not captured), SUBSCRIBE / UNSUBSCRIBE and the PUBACK / PUBREC /
  PUBCOMP a subscriber sends go to :mod:`bridge.edge.subscribing`, a second
  CONNECT is a Protocol Error.
* DISCONNECT: its Session Expiry Interval, the Will dropped on 0x00, close.

:class:`InboundFlows` is a part of :class:`bridge.edge.session.Session` and
works on its attributes.
"""

from __future__ import annotations

import struct

from bridge.edge import rules as edge_rules
from bridge.edge.actions import Action, Capture, Close, Notice, Send
from bridge.edge.handshake import AWAIT_CONNECT, CLOSED
from bridge.edge.state import Qos2Entry
from bridge.mqtt import (
    Connect, Disconnect, MqttError, PingReq, PubAck, PubComp, PubRec, PubRel, Publish, Subscribe,
    Unsubscribe, check_payload_format, check_topic_alias,
)
from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.rules import (
    DISCONNECT_SESSION_EXPIRY, RECEIVE_MAXIMUM_EXCEEDED, RETAIN_NOT_SUPPORTED, SECOND_CONNECT,
    TOPIC_ALIAS_UNMAPPED, violation,
)

__all__ = ["InboundFlows"]

_ACK = struct.Struct(">BBH")
_ACK_PACK = _ACK.pack
_ACK_RC = struct.Struct(">BBHB")
_PINGRESP = b"\xd0\x00"


def _ack(first: int, pid: int) -> bytes:
    return _ACK.pack(first, 2, pid)


class InboundFlows:
    """Inbound packets of a connected :class:`~bridge.edge.session.Session`."""

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
        if topic.count("/") >= self.limits.max_topic_levels or \
                len(topic) > self.limits.max_topic_length:
            self._topic_refused(p, frame, headers, topic, actions)  # [LG-edge-topic-levels]
            return
        qos = p.qos
        acl = self.router.acl
        if acl is not None and not acl().can_publish(self.username, self.client_id, topic):
            self._acl_refused(p, frame, headers, topic, actions)
            return
        if self.level == 5 and p.properties.payload_format_indicator == 1:
            try:
                check_payload_format(p)  # [LG-payload-format-invalid], MQTT 5.0 3.3.2.3.2
            except MqttError as err:
                self._refuse_publish(p, frame, headers, err, actions)
                return
        if qos == 0:
            actions.append(Capture(frame, headers, deliver=topic))
            return
        pid = p.packet_id
        if qos == 1:
            if self._inflight >= self._receive_maximum:
                self._count_inflight()  # raises in MQTT 5 [MQTT-3.3.4-7]
            else:
                self._inflight += 1
            actions.append(Capture(frame, headers, _ACK_PACK(0x40, 2, pid), 1, True,
                                   deliver=topic))
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
        actions.append(Capture(frame, headers, _ACK.pack(0x50, 2, pid), 0, True, entry,
                               deliver=topic))

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

    def _topic_refused(self, p: Publish, frame: bytes, headers: list[tuple[str, bytes]],
                       topic: str, actions: list[Action]) -> None:
        """The Topic Name (as resolved from a Topic Alias) has more levels
        than ``edge.max_topic_levels`` [LG-edge-topic-levels] or more
        characters than ``edge.max_topic_length`` [LG-edge-topic-length]:
        MQTT 5 refuses it with 0x90 Topic Name invalid and keeps the
        connection (see :meth:`_refuse_publish`; QoS 0 is dropped); 3.x has
        no refusal code, so the connection is closed, as Mosquitto does for a
        topic beyond its TOPIC_HIERARCHY_LIMIT. Never routed, retained or
        delivered: every topic tree stays within the bounds."""
        rule, detail = self.limits.topic_fault(topic, "PUBLISH Topic Name")  # type: ignore[misc]
        err = edge_rules.edge_violation(rule, detail, protocol_level=self.level,
                                        packet_type=PacketType.PUBLISH)
        if self.level != 5:
            raise err
        self._refuse_publish(p, frame, headers, err, actions)

    def _acl_refused(self, p: Publish, frame: bytes, headers: list[tuple[str, bytes]],
                     topic: str, actions: list[Action]) -> None:
        """The ACL does not let this client publish to ``topic``
        [LG-acl-publish]: MQTT 5 refuses with 0x87 (see
        :meth:`_refuse_publish`); 3.x has no reason code, so the PUBLISH is
        acknowledged as usual and dropped, as Mosquitto does (a QoS 2 one
        keeps no Packet Identifier: its PUBREL gets PUBCOMP all the same).
        Either way the frame is captured marked and delivered to no one."""
        err = edge_rules.edge_violation(
            edge_rules.ACL_PUBLISH, f"not authorized to publish to a {len(topic)}-character "
            "topic", protocol_level=self.level, packet_type=PacketType.PUBLISH)
        if self.level == 5:
            self._refuse_publish(p, frame, headers, err, actions)
            return
        marked = headers + [("reject", err.rule.encode()),
                            ("reject_code", str(err.reason_code).encode()),
                            ("reject_error", str(err).encode())]
        reply = None
        if p.qos:
            self._count_inflight()
            reply = _ACK_PACK(0x40 if p.qos == 1 else 0x50, 2, p.packet_id)
        actions.append(Capture(frame, marked, reply, 1 if p.qos else 0))
        actions.append(Notice(f"PUBLISH packet id {p.packet_id} to a {len(topic)}-character "
                              f"topic not authorized [{err.rule}]: acknowledged and dropped"))

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
        elif t is PubAck or t is PubRec or t is PubComp:
            self._on_subscriber_ack(p, frame, actions)
        elif t is Subscribe:
            self._on_subscribe(p, frame, actions)
        elif t is Unsubscribe:
            self._on_unsubscribe(p, frame, actions)
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
