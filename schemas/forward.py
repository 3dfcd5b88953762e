"""Rows the AMQP forwarding sink sends: one per valid PUBLISH and per PUBREL
of a QoS 2 PUBLISH, in capture order per connection.

``kind`` is "publish" or "pubrel". For a PUBREL, ``topic`` is the topic of the
QoS 2 PUBLISH it releases (the edge records it in the capture header
``rel_topic``) and the publish-only columns are null.
"""

from schemas.frames import KV_DDL

__all__ = ["FORWARD_DDL"]

FORWARD_DDL = (
    "kind STRING, "
    "topic STRING, packet_id INT, qos INT, retain BOOLEAN, dup BOOLEAN, "
    "payload BINARY, payload_format_indicator INT, message_expiry_interval BIGINT, "
    "response_topic STRING, correlation_data BINARY, "
    f"user_properties {KV_DDL}, content_type STRING, "
    # capture coordinates: the stable identity of the message
    "stream STRING, partition INT, offset BIGINT, seq BIGINT, "
    "conn_id STRING, client_id STRING, receive_time TIMESTAMP"
)
