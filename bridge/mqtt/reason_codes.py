"""Reason codes: one IntEnum per packet family and which codes each may carry.

* :class:`ConnackReturnCode` -- MQTT 3.1/3.1.1 CONNACK return codes.
* :class:`ConnectReason` -- MQTT 5 CONNACK reason codes (table 3-1).
* :class:`PubAckReason` -- PUBACK and PUBREC (tables 3-4, 3-5).
* :class:`PubRelReason` -- PUBREL and PUBCOMP (tables 3-6, 3-7).
* :class:`SubackReason` -- SUBACK (table 3-8; 3.1.1 has 0, 1, 2, 0x80; 3.1 has 0, 1, 2).
* :class:`UnsubackReason` -- UNSUBACK, MQTT 5 only (table 3-9).
* :class:`DisconnectReason` -- DISCONNECT (table 3-10), with who may send each.
* :class:`AuthReason` -- AUTH (table 3-11), with who may send each.

:func:`check_reason` raises ProtocolError with the packet's rule
(MQTT-3.2.2-8, 3.4.2-1, 3.5.2-1, 3.6.2-1, 3.7.2-1, 3.9.3-2, 3.11.3-2, 3.14.2-1,
3.15.2-1) when a code is not valid for the packet family, level and sender.
:func:`connack_v3_code` maps an MQTT 5 CONNACK reason to the 3.x return code
the edge can answer a failed 3.x CONNECT with.
"""

from __future__ import annotations

from enum import IntEnum

from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.rules import violation

__all__ = [
    "AuthReason",
    "ConnackReturnCode",
    "ConnectReason",
    "DisconnectReason",
    "PubAckReason",
    "PubRelReason",
    "SubackReason",
    "UnsubackReason",
    "check_reason",
    "connack_v3_code",
    "valid_reasons",
]


class ConnackReturnCode(IntEnum):
    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


class ConnectReason(IntEnum):
    SUCCESS = 0x00
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    BAD_AUTHENTICATION_METHOD = 0x8C
    TOPIC_NAME_INVALID = 0x90
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    CONNECTION_RATE_EXCEEDED = 0x9F


class PubAckReason(IntEnum):
    """PUBACK and PUBREC reason codes."""

    SUCCESS = 0x00
    NO_MATCHING_SUBSCRIBERS = 0x10
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99


class PubRelReason(IntEnum):
    """PUBREL and PUBCOMP reason codes."""

    SUCCESS = 0x00
    PACKET_IDENTIFIER_NOT_FOUND = 0x92


class SubackReason(IntEnum):
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_FILTER_INVALID = 0x8F
    PACKET_IDENTIFIER_IN_USE = 0x91
    QUOTA_EXCEEDED = 0x97
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class UnsubackReason(IntEnum):
    SUCCESS = 0x00
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED_ERROR = 0x80
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    TOPIC_FILTER_INVALID = 0x8F
    PACKET_IDENTIFIER_IN_USE = 0x91


class DisconnectReason(IntEnum):
    NORMAL_DISCONNECTION = 0x00
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    NOT_AUTHORIZED = 0x87
    SERVER_BUSY = 0x89
    SERVER_SHUTTING_DOWN = 0x8B
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class AuthReason(IntEnum):
    SUCCESS = 0x00
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19


_D = DisconnectReason
# Table 3-10 "Sent by": codes only a Client / only a Server may send.
DISCONNECT_CLIENT_ONLY = frozenset({_D.DISCONNECT_WITH_WILL_MESSAGE})
DISCONNECT_SERVER_ONLY = frozenset({
    _D.NOT_AUTHORIZED, _D.SERVER_BUSY, _D.SERVER_SHUTTING_DOWN, _D.KEEP_ALIVE_TIMEOUT,
    _D.SESSION_TAKEN_OVER, _D.TOPIC_FILTER_INVALID, _D.RETAIN_NOT_SUPPORTED,
    _D.QOS_NOT_SUPPORTED, _D.USE_ANOTHER_SERVER, _D.SERVER_MOVED,
    _D.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, _D.CONNECTION_RATE_EXCEEDED,
    _D.MAXIMUM_CONNECT_TIME, _D.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
    _D.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
})
# Table 3-11 "Sent by".
AUTH_CLIENT_ONLY = frozenset({AuthReason.RE_AUTHENTICATE})
AUTH_SERVER_ONLY = frozenset({AuthReason.SUCCESS})

_ALL_DISCONNECT = frozenset(int(c) for c in DisconnectReason)
_ALL_AUTH = frozenset(int(c) for c in AuthReason)

# (packet type, level >= 5) -> (valid codes, rule)
_VALID: dict[tuple[PacketType, bool], tuple[frozenset[int], str]] = {
    (PacketType.CONNACK, False): (frozenset(int(c) for c in ConnackReturnCode), "MQTT-3.2.2-8"),
    (PacketType.CONNACK, True): (frozenset(int(c) for c in ConnectReason), "MQTT-3.2.2-8"),
    (PacketType.PUBACK, True): (frozenset(int(c) for c in PubAckReason), "MQTT-3.4.2-1"),
    (PacketType.PUBREC, True): (frozenset(int(c) for c in PubAckReason), "MQTT-3.5.2-1"),
    (PacketType.PUBREL, True): (frozenset(int(c) for c in PubRelReason), "MQTT-3.6.2-1"),
    (PacketType.PUBCOMP, True): (frozenset(int(c) for c in PubRelReason), "MQTT-3.7.2-1"),
    (PacketType.SUBACK, False): (frozenset({0x00, 0x01, 0x02, 0x80}), "MQTT-3.9.3-2"),
    (PacketType.SUBACK, True): (frozenset(int(c) for c in SubackReason), "MQTT-3.9.3-2"),
    (PacketType.UNSUBACK, True): (frozenset(int(c) for c in UnsubackReason), "MQTT-3.11.3-2"),
    (PacketType.DISCONNECT, True): (_ALL_DISCONNECT, "MQTT-3.14.2-1"),
    (PacketType.AUTH, True): (_ALL_AUTH, "MQTT-3.15.2-1"),
}
_SUBACK_V31 = frozenset({0x00, 0x01, 0x02})


def valid_reasons(packet_type: PacketType, level: int, from_client: bool | None = None
                  ) -> frozenset[int]:
    """The codes a packet of this type may carry at this level; with
    ``from_client`` given, only those that sender may use."""
    if packet_type is PacketType.SUBACK and level == 3:
        return _SUBACK_V31
    codes, _rule = _VALID[(packet_type, level >= 5)]
    if from_client is None:
        return codes
    if packet_type is PacketType.DISCONNECT:
        return codes - (DISCONNECT_SERVER_ONLY if from_client else DISCONNECT_CLIENT_ONLY)
    if packet_type is PacketType.AUTH:
        return codes - (AUTH_SERVER_ONLY if from_client else AUTH_CLIENT_ONLY)
    return codes


def check_reason(packet_type: PacketType, code: int, level: int, from_client: bool) -> None:
    """Raise ProtocolError when ``code`` is not valid for this packet, level and sender."""
    if code in valid_reasons(packet_type, level, from_client):
        return
    _codes, rule = _VALID[(packet_type, level >= 5)]
    sender = "Client" if from_client else "Server"
    if code in _codes:
        detail = f"{packet_type.name} reason code 0x{code:02X} may not be sent by a {sender}"
    else:
        detail = f"{packet_type.name} reason code 0x{code:02X} is not defined"
    raise violation(rule, detail, packet_type=packet_type, protocol_level=level)


_V3_FOR_V5 = {
    ConnectReason.SUCCESS: ConnackReturnCode.ACCEPTED,
    ConnectReason.UNSUPPORTED_PROTOCOL_VERSION: ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    ConnectReason.CLIENT_IDENTIFIER_NOT_VALID: ConnackReturnCode.IDENTIFIER_REJECTED,
    ConnectReason.SERVER_UNAVAILABLE: ConnackReturnCode.SERVER_UNAVAILABLE,
    ConnectReason.SERVER_BUSY: ConnackReturnCode.SERVER_UNAVAILABLE,
    ConnectReason.BAD_USER_NAME_OR_PASSWORD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    ConnectReason.NOT_AUTHORIZED: ConnackReturnCode.NOT_AUTHORIZED,
    ConnectReason.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
}


def connack_v3_code(reason: int) -> ConnackReturnCode | None:
    """The 3.x CONNACK return code for an MQTT 5 CONNACK reason, or None when
    3.x has no equivalent (then the server just closes the connection)."""
    return _V3_FOR_V5.get(reason)
