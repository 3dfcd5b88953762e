"""Sans-IO MQTT codec for MQTT 3.1 (``MQIsdp``/3), 3.1.1 (``MQTT``/4) and 5.

No sockets, no event loop, no clocks: bytes in, packets out, and back.

>>> from bridge.mqtt import Publish, decode_packet, encode
>>> frame = encode(Publish(qos=1, topic="a/b", packet_id=7, payload=b"hi"), 5)
>>> packet, used = decode_packet(frame, 5)
>>> packet.topic, packet.packet_id, used == len(frame)
('a/b', 7, True)

Public API (see :mod:`bridge.mqtt.codec` for the decoding contract):

* ``decode_packet(buf, protocol_level, *, max_packet_bytes=None, from_client=True)``
  -> ``(packet, consumed)``; raises :class:`IncompleteData` for a proper
  prefix, :class:`MalformedPacket` / :class:`ProtocolError` for a violation.
* ``encode(packet, protocol_level) -> bytes``.
* ``frame_length(buf, *, max_packet_bytes=None, from_client=True) -> int | None``.
* The packet dataclasses, :class:`Properties`, :class:`PacketType`, the error
  tree, the rule table (:mod:`bridge.mqtt.rules`) and reason-code enums
  (:mod:`bridge.mqtt.reason_codes`), and the session helpers
  ``check_client_id``, ``check_topic_alias``, ``check_payload_format``.
"""

from bridge.mqtt.acks import PubAck, PubComp, PubRec, PubRel
from bridge.mqtt.codec import Packet, decode_packet, encode
from bridge.mqtt.connect import Connack, Connect, Will, check_client_id
from bridge.mqtt.disconnect import Auth, Disconnect, PingReq, PingResp
from bridge.mqtt.errors import IncompleteData, MalformedPacket, MqttError, ProtocolError
from bridge.mqtt.fixed_header import PacketType, frame_length
from bridge.mqtt.properties import PROPERTIES, Properties
from bridge.mqtt.publish import Publish, check_payload_format, check_topic_alias
from bridge.mqtt.reason_codes import (
    AuthReason, ConnackReturnCode, ConnectReason, DisconnectReason, PubAckReason, PubRelReason,
    SubackReason, UnsubackReason, connack_v3_code,
)
from bridge.mqtt.rules import RULES, Rule, violation
from bridge.mqtt.subscribe import Suback, Subscribe, Subscription, Unsuback, Unsubscribe

__all__ = [
    "PROPERTIES",
    "RULES",
    "Auth",
    "AuthReason",
    "Connack",
    "ConnackReturnCode",
    "Connect",
    "ConnectReason",
    "Disconnect",
    "DisconnectReason",
    "IncompleteData",
    "MalformedPacket",
    "MqttError",
    "Packet",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "ProtocolError",
    "PubAck",
    "PubAckReason",
    "PubComp",
    "PubRec",
    "PubRel",
    "PubRelReason",
    "Publish",
    "Rule",
    "Suback",
    "SubackReason",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "UnsubackReason",
    "Unsubscribe",
    "Will",
    "check_client_id",
    "check_payload_format",
    "check_topic_alias",
    "connack_v3_code",
    "decode_packet",
    "encode",
    "frame_length",
    "violation",
]
