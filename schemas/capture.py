"""Capture log records: the exact shape of Spark's Kafka source rows.

A deployment that puts the frames into Kafka (with the same header keys) can
switch the job's source from ``format("lakegate")`` to ``format("kafka")``
with ``.option("includeHeaders", "true")`` -- without it Spark's Kafka source
leaves ``headers`` out, and the job's context comes from them -- and no
other change.
"""

__all__ = ["CAPTURE_RECORD_DDL", "HEADER_KEYS", "TIMESTAMP_TYPE_LOG_APPEND"]

CAPTURE_RECORD_DDL = (
    "key BINARY, "             # MQTT client id (UTF-8)
    "value BINARY, "           # the raw MQTT frame, byte for byte (header ack_refs: a run of PUBACKs)
    "topic STRING, "           # the capture stream's name
    "partition INT, "
    "offset BIGINT, "          # dense within a partition
    "timestamp TIMESTAMP, "    # receive time
    "timestampType INT, "      # 1 = LogAppendTime, as in Kafka
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)

#: Kafka's TimestampType.LOG_APPEND_TIME: the edge stamps the receive time.
TIMESTAMP_TYPE_LOG_APPEND = 1

#: Capture header keys (values are UTF-8 bytes unless stated).
HEADER_KEYS = {
    "conn_id": "connection id (unique per edge process and connection)",
    "proto": "MQTT protocol level: 3, 4 or 5",
    "remote": "remote address host:port",
    "username": "CONNECT user name, when given",
    "origin": "client, will or tap",
    "seq": "capture sequence: orders records across partitions (decimal)",
    "alias_topic": "the resolved topic, where the frame used a topic alias",
    "dup": "1 when the edge (or the tap) recognised a QoS 2 re-send of a packet id awaiting PUBREL",
    "rel_topic": "on a PUBREL: the topic of the QoS 2 PUBLISH it releases",
    "rel_seq": "on a PUBREL: the capture sequence of the QoS 2 PUBLISH it releases",
    "redacted": "on a CONNECT: 'password' when the edge removed the password before capture",
    "reject": "rule id, when the edge rejected the frame (the frame is recorded, not acted on)",
    "reject_code": "with reject: the reason code the edge sent (decimal)",
    "reject_error": "with reject: the error message",
    "granted": "on a SUBSCRIBE: the SUBACK's reason codes, one byte per filter, as hex",
    "retained_k": "on a SUBSCRIBE: the Packet Identifiers the retained messages it brought took "
                  "(decimal), so that a replay of the log numbers later deliveries alike",
    "ack_ref": "on a subscriber's PUBACK/PUBREC/PUBCOMP: partition:offset of the message acknowledged",
    "ack_refs": "on a run of a subscriber's 4-byte PUBACKs captured as one record (the frames "
                "back to back): partition:offset of each one's message, space-separated, '-' for "
                "none; the job skips these records (valid acknowledgements, nothing for a table)",
    "edge": "a cluster edge's own record, not a frame (value empty): 'beat' (the edge is alive), "
            "'claim' / 'release' (a session moving between edges), 'sent' (Packet Identifiers of "
            "deliveries to a persistent session, as edge_refs), 'share' (a shared message's edge); "
            "the job skips these records",
    "edge_id": "with edge: the cluster edge that wrote it (decimal)",
    "edge_refs": "with edge 'sent': partition:offset:packet-id of each delivery, space-separated",
    "edge_info": "with edge 'beat': what the edge tells the others (JSON: connections, lag, host, port)",
    "claim_of": "with edge 'claim': the edge asked to release the session of the record's client id",
    "release_to": "with edge 'release': the edge the session was released to",
    "share_to": "with edge 'share': the edge chosen to give a shared message to one of its members",
    "share_ref": "with edge 'share': partition:offset of the message",
    "share_group": "with edge 'share': the Shared Subscription group, name/filter",
}
