"""Parsed captured frames: the output of the vectorised parser (bridge/parse)
and of its pandas UDF. One row per captured frame; columns that do not apply
to a packet type are null.

Inputs to the parser per frame: the raw frame (``value``), the protocol level
(capture header ``proto``) and, where the frame used a topic alias, the
resolved topic (capture header ``alias_topic``).
"""

__all__ = ["KV_DDL", "PARSED_FRAME_DDL", "PUBLISH_PROPERTY_COLUMNS", "WILL_PROPERTIES_DDL"]

#: MQTT 5 User Property: a UTF-8 string pair; order and duplicates are kept.
KV_DDL = "ARRAY<STRUCT<key: STRING, value: STRING>>"

WILL_PROPERTIES_DDL = (
    "STRUCT<will_delay_interval: BIGINT, payload_format_indicator: INT, "
    "message_expiry_interval: BIGINT, content_type: STRING, response_topic: STRING, "
    f"correlation_data: BINARY, user_properties: {KV_DDL}>"
)

PARSED_FRAME_DDL = (
    # every frame
    "packet_type INT, "            # MQTT control packet type 1..15 (0 when unreadable)
    "dup BOOLEAN, qos INT, retain BOOLEAN, "   # PUBLISH fixed-header flags (null otherwise)
    "remaining_length INT, "       # as encoded in the fixed header
    "valid BOOLEAN, "              # false when a rule is broken
    "rule STRING, "                # id of the first rule broken, e.g. MQTT-3.3.1-4
    "error STRING, "               # "[MQTT-3.3.1-4] PUBLISH has both QoS bits set"
    "error_code INT, "             # reason code the server must send for it (0x81, 0x82, 0x94, 0x99...)
    # PUBLISH
    "topic STRING, "               # the resolved topic where an alias was used
    "packet_id INT, "              # PUBLISH (QoS>0), PUBACK, PUBREC, PUBREL, PUBCOMP
    "payload BINARY, payload_size INT, "
    "payload_format_indicator INT, message_expiry_interval BIGINT, topic_alias INT, "
    "response_topic STRING, correlation_data BINARY, "
    f"user_properties {KV_DDL}, "
    "subscription_identifiers ARRAY<BIGINT>, content_type STRING, "
    # PUBACK, PUBREC, PUBREL, PUBCOMP (and DISCONNECT)
    "reason_code INT, "
    # CONNECT
    "client_id STRING, connect_protocol_level INT, clean_start BOOLEAN, keepalive INT, "
    "will_topic STRING, will_payload BINARY, will_qos INT, will_retain BOOLEAN, "
    f"will_properties {WILL_PROPERTIES_DDL}"
)

#: The MQTT 5 PUBLISH properties, each its own column.
PUBLISH_PROPERTY_COLUMNS = (
    "payload_format_indicator", "message_expiry_interval", "topic_alias", "response_topic",
    "correlation_data", "user_properties", "subscription_identifiers", "content_type",
)
