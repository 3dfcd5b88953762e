"""Splitting a batch of frame rows into table rows: which rule a quarantine
row carries (the edge's, the parser's beside it), and the rows forwarding
could not make a message of."""

from __future__ import annotations

from bridge.amqp.unforwardable import Unforwardable
from bridge.mqtt import Connect, Properties, Publish, encode
from bridge.tables.rows import split_batch, unforwardable_rows
from tests.tables.rows import frame_rows


def oversize_publish_record() -> dict:
    """What the edge captures for a PUBLISH over its Maximum Packet Size: the
    first 1024 bytes only (never buffered whole), with the reject headers."""
    full = encode(Publish(qos=1, topic="big", packet_id=1, payload=b"x" * 5000, properties=Properties()), 5)
    return {"frame": full[:1024], "edge_rule": "MQTT-3.2.2-15", "edge_code": 0x95,
            "edge_error": "[MQTT-3.2.2-15] PUBLISH of 5008 bytes exceeds the Maximum Packet Size 1024"}


def test_mqtt_3_2_2_15_oversize_frame_is_quarantined_under_the_edge_rule_parser_lg_truncated_beside_it():
    q = split_batch(frame_rows([oversize_publish_record()])).quarantine.to_pylist()
    assert len(q) == 1
    assert (q[0]["rule"], q[0]["error_code"]) == ("MQTT-3.2.2-15", 0x95)
    assert q[0]["error"].startswith("[MQTT-3.2.2-15] ")
    assert q[0]["parser_rule"] == "LG-truncated"
    assert q[0]["parser_error"].startswith("[LG-truncated] ")
    assert q[0]["frame_size"] == 1024


def test_mqtt_3_1_4_2_refused_connect_recorded_without_payload_carries_the_edge_rule():
    full = encode(Connect(protocol_level=5, client_id="dev-1", username="u", password=b"secret",
                          properties=Properties()), 5)
    head = full[:12]  # the edge keeps the CONNECT only up to Keep Alive: no password stored
    rec = {"frame": head, "edge_rule": "MQTT-3.1.4-2", "edge_code": 0x86,
           "edge_error": "[MQTT-3.1.4-2] bad user name or password"}
    q = split_batch(frame_rows([rec])).quarantine.to_pylist()
    assert [(r["rule"], r["error_code"], r["parser_rule"]) for r in q] == [("MQTT-3.1.4-2", 0x86, "LG-truncated")]


def test_mqtt_3_3_1_4_parser_finding_is_the_rule_when_the_edge_accepted_the_frame():
    rec = {"frame": bytes([0x36, 0x06, 0, 1]) + b"x" + bytes([0, 1, 0])}  # both QoS bits set (the tap, say)
    q = split_batch(frame_rows([rec])).quarantine.to_pylist()
    assert [(r["rule"], r["parser_rule"]) for r in q] == [("MQTT-3.3.1-4", "MQTT-3.3.1-4")]
    assert q[0]["error"] == q[0]["parser_error"]


def test_lg_edge_qos2_quota_edge_only_rule_leaves_the_parser_columns_null():
    ok = encode(Publish(qos=2, topic="a", packet_id=7, payload=b"v", properties=Properties()), 5)
    rec = {"frame": ok, "edge_rule": "LG-edge-qos2-quota", "edge_code": 0x97, "edge_error": "[LG-edge-qos2-quota] x"}
    rows = split_batch(frame_rows([rec]))
    assert rows.messages.num_rows == 0
    q = rows.quarantine.to_pylist()
    assert [(r["rule"], r["parser_rule"], r["parser_error"]) for r in q] == [("LG-edge-qos2-quota", None, None)]


def test_lg_amqp_unforwardable_rows_are_the_named_frames_with_their_error():
    frames = [encode(Publish(qos=1, topic=f"t/{i}", packet_id=i + 1, payload=b"p", properties=Properties()), 5)
              for i in range(4)]
    table = frame_rows([{"frame": f} for f in frames])
    error = "[LG-amqp-unforwardable] error: 'I' format requires ..."
    fails = [Unforwardable("mqtt-frames", 0, 2, "LG-amqp-unforwardable", error),
             Unforwardable("mqtt-frames", 1, 2, "LG-amqp-unforwardable", "other partition: not in this batch")]
    q = unforwardable_rows(table, fails).to_pylist()
    assert [(r["partition"], r["offset"], r["rule"], r["error"], r["error_code"], r["parser_rule"]) for r in q] == [
        (0, 2, "LG-amqp-unforwardable", error, None, None)]
    assert q[0]["frame"] == frames[2] and q[0]["frame_size"] == len(frames[2]) and q[0]["packet_type"] == 3
    assert unforwardable_rows(table, []).num_rows == 0
