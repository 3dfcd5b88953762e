"""Session-layer rules the edge enforces beyond the codec's table.

The codec's :data:`bridge.mqtt.rules.RULES` covers everything that can be
judged from a packet (plus the few session rules it exposes helpers for).
The edge adds the rules that need server state or policy. Each entry is a
:class:`bridge.mqtt.rules.Rule`; ids follow the same convention (OASIS MQTT
5.0 statement ids, project ids ``LG-edge-...`` where the standard has none).

These ids appear in the capture headers of rejected frames (``reject``), in
close reasons of the connection log line, and in test names.
"""

from __future__ import annotations

from bridge.mqtt.errors import MqttError, ProtocolError
from bridge.mqtt.rules import Rule

__all__ = [
    "AUTH_BUSY",
    "AUTH_FAILED",
    "AUTH_METHOD_UNSUPPORTED",
    "EDGE_BUSY",
    "EDGE_RULES",
    "FRAME_TIMEOUT",
    "BUFFER_BUDGET",
    "KEEP_ALIVE_TIMEOUT",
    "ACK_MISMATCH",
    "ACL_PUBLISH",
    "ANONYMOUS_BEYOND_LOOPBACK",
    "CAPTURE_FAILED",
    "CONNECT_TIMEOUT",
    "ACL_SUBSCRIBE",
    "QOS2_QUOTA",
    "SERVER_SHUTDOWN",
    "SUBSCRIPTION_QUOTA",
    "TOPIC_LENGTH",
    "TOPIC_LEVELS",
    "SESSION_TAKEN_OVER",
    "CLUSTER_LEASE",
    "CLUSTER_MOVE",
    "WS_BINARY",
    "WS_HANDSHAKE",
    "TLS_HANDSHAKE",
    "CERT_IDENTITY",
    "edge_violation",
]

_P = "protocol"

#: Rule ids the session and the server use by name.
AUTH_FAILED = "MQTT-3.1.4-2"
SESSION_TAKEN_OVER = "MQTT-3.1.4-3"
AUTH_METHOD_UNSUPPORTED = "MQTT-4.12.0-1"
KEEP_ALIVE_TIMEOUT = "LG-edge-keep-alive"
EDGE_BUSY = "LG-edge-busy"
QOS2_QUOTA = "LG-edge-qos2-quota"
AUTH_BUSY = "LG-edge-auth-busy"
FRAME_TIMEOUT = "LG-edge-frame-timeout"
BUFFER_BUDGET = "LG-edge-buffer-budget"
ACK_MISMATCH = "LG-edge-ack-mismatch"
ACL_PUBLISH = "LG-acl-publish"
ACL_SUBSCRIBE = "LG-acl-subscribe"
TOPIC_LEVELS = "LG-edge-topic-levels"
TOPIC_LENGTH = "LG-edge-topic-length"
SUBSCRIPTION_QUOTA = "LG-edge-subscription-quota"
CONNECT_TIMEOUT = "LG-edge-connect-timeout"
SERVER_SHUTDOWN = "LG-edge-shutdown"
CAPTURE_FAILED = "LG-edge-capture-failed"
ANONYMOUS_BEYOND_LOOPBACK = "LG-edge-anonymous-beyond-loopback"
CLUSTER_LEASE = "LG-cluster-lease"
CLUSTER_MOVE = "LG-cluster-move"
WS_BINARY = "MQTT-6.0.0-1"
WS_HANDSHAKE = "LG-edge-ws-handshake"
TLS_HANDSHAKE = "LG-edge-tls-handshake"
CERT_IDENTITY = "LG-edge-cert-identity"

EDGE_RULES: dict[str, Rule] = {
    AUTH_FAILED: Rule(
        "The Server's authentication or authorization check of a CONNECT failed", 0x86, _P,
        enforced="session",
        note="MQTT 5.0 MQTT-3.1.4-2; CONNACK 0x86 Bad User Name or Password (3.x return code "
        "0x04) for wrong credentials, 0x87 Not authorized (3.x 0x05) for a missing user name "
        "when anonymous access is off",
    ),
    SESSION_TAKEN_OVER: Rule(
        "A new connection with the same Client Identifier takes the session over", 0x8E, _P,
        enforced="session", note="the existing connection gets DISCONNECT 0x8E (MQTT 5) or is "
        "closed (3.x); not a frame rejection",
    ),
    AUTH_METHOD_UNSUPPORTED: Rule(
        "CONNECT names an Authentication Method the Server does not support", 0x8C, _P,
        enforced="session", note="the edge supports no extended authentication: CONNACK 0x8C",
    ),
    KEEP_ALIVE_TIMEOUT: Rule(
        "No packet from the Client within one and a half times the Keep Alive", 0x8D, _P,
        enforced="session",
        note="MQTT 5.0 MQTT-3.1.2-22 (3.1.1 MQTT-3.1.2-24); that id is taken in the codec's "
        "table by the 3.1.1 password statement, hence the project id. DISCONNECT 0x8D in MQTT 5",
    ),
    EDGE_BUSY: Rule(
        "The edge already serves edge.max_connections connections", 0x89, _P, enforced="session",
        note="CONNACK 0x89 Server busy (3.x return code 0x03 Server unavailable)",
    ),
    AUTH_BUSY: Rule(
        "Too many password checks are waiting (edge.auth_max_pending) or in progress for the "
        "client's address (edge.auth_max_pending_per_address), or the address is backing off "
        "after failed checks (edge.auth_failure_backoff_s)", 0x89, _P, enforced="session",
        note="CONNACK 0x89 Server busy (3.x return code 0x03 Server unavailable), sent at once "
        "without checking the password",
    ),
    FRAME_TIMEOUT: Rule(
        "A frame that has started is not complete within edge.frame_timeout_s", 0x8D, _P,
        enforced="session", note="the connection is closed (MQTT 5: DISCONNECT 0x8D Keep Alive "
        "timeout is not sent: the client is mid-frame); the reason is logged",
    ),
    BUFFER_BUDGET: Rule(
        "The incomplete frames of all connections exceed edge.max_buffered_bytes", 0x97, _P,
        enforced="session", note="the connection whose incomplete frame is the oldest is "
        "closed, until the total is within the budget; the reason is logged",
    ),
    QOS2_QUOTA: Rule(
        "A QoS 2 PUBLISH would exceed edge.max_inflight_qos2 Packet Identifiers awaiting PUBREL",
        0x97, _P, enforced="session",
        note="MQTT 5: PUBREC 0x97 Quota exceeded, the connection stays open; 3.x has no "
        "refusal code, so the connection is closed",
    ),
    ACK_MISMATCH: Rule(
        "A subscriber acknowledges a delivery with the wrong packet: PUBACK for a QoS 2 PUBLISH, "
        "PUBREC for a QoS 1 PUBLISH, PUBCOMP before PUBREC", 0x82, _P, enforced="session",
        note="MQTT 5.0 sections 4.3.2 and 4.3.3 define the flows; a packet outside them is a "
        "Protocol Error (DISCONNECT 0x82; 3.x: closed), as the Mosquitto vectors of FLOW.json "
        "expect",
    ),
    ACL_PUBLISH: Rule(
        "The ACL file (edge.acl_file) does not let the client publish to the topic", 0x87, _P,
        enforced="session",
        note="MQTT 5: PUBACK/PUBREC 0x87 Not authorized; 3.x has no reason codes: acknowledged "
        "as usual and dropped, as Mosquitto does. The frame is captured marked, so the job "
        "quarantines it and forwards nothing; the connection stays open",
    ),
    ACL_SUBSCRIBE: Rule(
        "The ACL file (edge.acl_file) gives the client no read access that overlaps the Topic "
        "Filter, or a deny entry covers it", 0x87, _P, enforced="session",
        note="SUBACK 0x87 Not authorized (3.x 0x80 Failure) for that filter; the others are "
        "handled. Delivery is checked again per message with the read access",
    ),
    TOPIC_LEVELS: Rule(
        "A Topic Name (PUBLISH, Will) or Topic Filter (SUBSCRIBE) has more levels than "
        "edge.max_topic_levels", 0x90, _P, enforced="session",
        note="the bound (200 by default; Mosquitto's TOPIC_HIERARCHY_LIMIT is 200 '/') keeps "
        "every topic tree shallow. MQTT 5 PUBLISH: PUBACK/PUBREC 0x90 Topic Name invalid, "
        "QoS 0 dropped, the connection stays open; 3.x has no refusal code: closed, as Mosquitto does. The frame "
        "is captured marked and never routed, retained or delivered. SUBSCRIBE: SUBACK 0x8F "
        "Topic Filter invalid (3.x 0x80) for that filter, the others handled. Will topic: "
        "CONNACK 0x90 (3.x: closed without CONNACK)",
    ),
    TOPIC_LENGTH: Rule(
        "A Topic Name (PUBLISH, Will) or Topic Filter (SUBSCRIBE) has more characters than "
        "edge.max_topic_length", 0x90, _P, enforced="session",
        note="default 65535, MQTT's own maximum (Mosquitto has no tighter one); lower it to "
        "bound what each subscription costs. Answered as LG-edge-topic-levels: MQTT 5 "
        "PUBACK/PUBREC 0x90, 3.x closed, SUBACK 0x8F (3.x 0x80), Will topic CONNACK 0x90",
    ),
    SUBSCRIPTION_QUOTA: Rule(
        "A SUBSCRIBE would give the client more than edge.max_subscriptions_per_client "
        "subscriptions", 0x97, _P, enforced="session",
        note="that filter is refused in the SUBACK (0x97 Quota exceeded; 3.x 0x80 Failure), the "
        "others are handled and the connection stays open; one log line",
    ),
    CONNECT_TIMEOUT: Rule(
        "No CONNECT accepted within edge.connect_timeout_s of the connection's start (none "
        "arrived, it is incomplete, or its password check is still waiting)", 0x8D, _P,
        enforced="session",
        note="MQTT 5.0 section 3.1: the Server SHOULD close a Network Connection that sends no "
        "CONNECT within a reasonable time (no statement id). Closed without a CONNACK (no "
        "CONNECT was accepted to answer); the code is only logged",
    ),
    SERVER_SHUTDOWN: Rule(
        "The edge is shutting down (SIGINT, SIGTERM, the end of lakegate run)", 0x8B, _P,
        enforced="session",
        note="a connected MQTT 5 client gets DISCONNECT 0x8B Server shutting down behind its "
        "pending acknowledgements; 3.x clients, and connections whose CONNECT was not accepted "
        "yet, are closed",
    ),
    CAPTURE_FAILED: Rule(
        "The capture log cannot write: nothing more may be acknowledged", 0x80, _P,
        enforced="session",
        note="the edge stops and its connections are aborted without a DISCONNECT (the error "
        "is logged once); a supervisor restart reopens the log",
    ),
    ANONYMOUS_BEYOND_LOOPBACK: Rule(
        "A listener binds beyond loopback (edge.host is not 127.0.0.0/8, ::1 or localhost) "
        "and edge.allow_anonymous was not set", 0x87, _P, enforced="session",
        note="checked at start-up, as Mosquitto 2.0 does: without edge.password_file the edge "
        "does not start (one line naming edge.allow_anonymous, exit code 2); with one, "
        "anonymous clients are refused (CONNACK 0x87 Not authorized, 3.x 0x05, under "
        "MQTT-3.1.4-2). Only edge.allow_anonymous = true set by the user (file, environment "
        "or --set) lets anonymous clients in beyond loopback",
    ),
    CLUSTER_LEASE: Rule(
        "A cluster edge had no beat confirmed by Kafka for half of cluster.lease_s", 0x88, _P,
        enforced="session",
        note="the edge closes every connection (MQTT 5: DISCONNECT 0x9C Use another server) and "
        "refuses CONNECTs (CONNACK 0x88 Server unavailable, 3.x 0x03) until a beat is confirmed "
        "again, so that it never serves a session another edge may take over once this one is "
        "declared dead (no beat for cluster.lease_s); no Will is published by it",
    ),
    CLUSTER_MOVE: Rule(
        "A session could not be moved from the cluster edge it is connected on", 0x88, _P,
        enforced="session",
        note="CONNACK 0x88 Server unavailable (3.x 0x03): that edge neither released the "
        "session nor was declared dead within cluster.lease_s plus the wait for it; the client "
        "tries again",
    ),
    WS_BINARY: Rule(
        "MQTT over WebSockets: a data frame that is not binary (MQTT Control Packets MUST be sent "
        "in WebSocket binary data frames; any other data frame closes the Network Connection)", 0x82, _P,
        enforced="session",
        note="closed with WebSocket close code 1003 Unsupported Data, no DISCONNECT; one log line",
    ),
    WS_HANDSHAKE: Rule(
        "A WebSocket upgrade the edge refuses: another path than edge.ws_path, no mqtt or mqttv3.1 "
        "subprotocol offered [MQTT-6.0.0-4], an Origin not in edge.ws_origins, more handshakes "
        "than edge.max_connections, or none completed within edge.connect_timeout_s", 0x80, _P,
        enforced="session",
        note="answered in HTTP (404, 400, 403, 503; no MQTT session starts) or, for a handshake that "
        "never completes, the connection aborted; one log line each",
    ),
    TLS_HANDSHAKE: Rule(
        "A TLS handshake on edge.tls_port or edge.wss_port failed: no client certificate where "
        "edge.require_certificate asks for one, a certificate that is expired, revoked "
        "(edge.tls_crl_file), from another CA than edge.tls_client_ca_file or not for client use, "
        "or no handshake within edge.connect_timeout_s", 0x80, _P, enforced="session",
        note="the client gets OpenSSL's TLS alert and no MQTT session starts; one log line with "
        "OpenSSL's reason",
    ),
    CERT_IDENTITY: Rule(
        "edge.cert_identity names the user by the client certificate, and the TLS client has none, or "
        "none with that kind of name", 0x87, _P, enforced="session",
        note="CONNACK 0x87 Not authorized (3.x 0x05); one log line",
    ),
}


def edge_violation(rule: str, detail: str, *, reason_code: int | None = None,
                   protocol_level: int | None = None, packet_type: int | None = None) -> MqttError:
    """Build (not raise) the ProtocolError for an edge rule; the reason code
    comes from :data:`EDGE_RULES` unless given."""
    entry = EDGE_RULES[rule]
    return ProtocolError(rule, detail,
                         reason_code=entry.reason_code if reason_code is None else reason_code,
                         protocol_level=protocol_level, packet_type=packet_type)
