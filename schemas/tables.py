"""Delta table schemas: messages, retained, quarantine; and the per-frame row
the job builds before splitting a micro-batch into them.

``CONTEXT_DDL`` is what the job extracts from a capture record (coordinates and
headers); ``FRAME_ROW_DDL`` is that plus the parser's output
(``schemas.frames.PARSED_FRAME_DDL``). The three tables are projections of it.
"""

from schemas.ddl import field_names
from schemas.frames import KV_DDL, PARSED_FRAME_DDL

__all__ = [
    "CONTEXT_DDL", "FRAME_ROW_DDL", "PARSED_RENAMES", "MESSAGES_DDL", "MESSAGES_PARTITION_BY",
    "QUARANTINE_DDL", "RETAINED_DDL", "TABLES",
]

#: Capture coordinates and headers of one record.
CONTEXT_DDL = (
    "stream STRING, partition INT, offset BIGINT, seq BIGINT, "
    "receive_time TIMESTAMP, receive_date DATE, "
    "conn_id STRING, client_id STRING, username STRING, remote STRING, "
    "protocol_level INT, origin STRING, "
    "alias_topic STRING, "      # resolved topic when the frame used a topic alias
    "duplicate BOOLEAN, "       # the edge marked a QoS 2 re-send awaiting PUBREL
    "rel_topic STRING, rel_seq BIGINT, "   # PUBREL: the QoS 2 PUBLISH it releases
    "edge_rule STRING, edge_error STRING, edge_code INT, "   # the edge rejected the frame
    "frame BINARY"              # the raw frame
)

#: The parser's CONNECT ``client_id`` would collide with the capture key's
#: ``client_id``; in a frame row it is called ``connect_client_id``.
PARSED_RENAMES = {"client_id": "connect_client_id"}
FRAME_ROW_DDL = CONTEXT_DDL + ", " + PARSED_FRAME_DDL.replace(
    "client_id STRING, connect_protocol_level", "connect_client_id STRING, connect_protocol_level")

_PUBLISH_FIELDS = (
    "dup BOOLEAN, qos INT, retain BOOLEAN, topic STRING, topic_alias INT, packet_id INT, "
    "payload BINARY, payload_size INT, payload_format_indicator INT, "
    "message_expiry_interval BIGINT, response_topic STRING, correlation_data BINARY, "
    f"user_properties {KV_DDL}, subscription_identifiers ARRAY<BIGINT>, content_type STRING"
)

#: Every valid PUBLISH (client, will and tap), partitioned by receive_date.
MESSAGES_DDL = (
    "stream STRING, partition INT, offset BIGINT, seq BIGINT, "
    "receive_time TIMESTAMP, receive_date DATE, "
    "conn_id STRING, client_id STRING, username STRING, protocol_level INT, origin STRING, "
    "duplicate BOOLEAN, "
    + _PUBLISH_FIELDS
)
MESSAGES_PARTITION_BY = ["receive_date"]

#: One row per topic ever retained: the latest state by capture order.
#: ``deleted`` rows are tombstones (a zero-byte retained publish, or an expired
#: message removed by compaction) so that a late, older publish never brings a
#: removed message back. The ``retained`` view hides tombstones and expired rows.
RETAINED_DDL = (
    "topic STRING, deleted BOOLEAN, "
    "payload BINARY, payload_size INT, qos INT, "
    "payload_format_indicator INT, message_expiry_interval BIGINT, content_type STRING, "
    f"response_topic STRING, correlation_data BINARY, user_properties {KV_DDL}, "
    "client_id STRING, origin STRING, set_at TIMESTAMP, expires_at TIMESTAMP, "
    "stream STRING, partition INT, offset BIGINT, seq BIGINT"
)

#: Frames that broke a rule: the raw frame, where it was captured, and why.
#: ``rule``/``error``/``error_code``: the edge's rule when the edge rejected
#: the frame (what the client was disconnected or refused for), else the
#: parser's. ``parser_rule``/``parser_error``: what the parser found in the
#: recorded bytes (null when it found nothing); for an edge rejection this is
#: often ``LG-truncated``, since a rejected frame may be recorded cut short.
#: The last two columns were added later: ``TableEngine.ensure`` adds them
#: to an existing table (old rows read null).
QUARANTINE_DDL = (
    "stream STRING, partition INT, offset BIGINT, seq BIGINT, "
    "receive_time TIMESTAMP, receive_date DATE, "
    "conn_id STRING, client_id STRING, protocol_level INT, origin STRING, "
    "packet_type INT, rule STRING, error STRING, error_code INT, "
    "frame BINARY, frame_size INT, "
    "parser_rule STRING, parser_error STRING"
)

TABLES = {"messages": MESSAGES_DDL, "retained": RETAINED_DDL, "quarantine": QUARANTINE_DDL}


def columns(table: str) -> list[str]:
    return field_names(TABLES[table])
