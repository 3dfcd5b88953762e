"""The scalar reference for the vectorised parser: the edge's codec per frame.

:func:`reference_row` is what the edge decides for one captured frame:
``decode_packet`` (a ``None`` level when the capture has none), the record
length against the frame length, then the session's PUBLISH checks the parser
also applies (an alias with no resolved topic, the Payload Format Indicator).
It returns the expected row of ``PARSED_FRAME_DDL`` for the columns the codec
determines.
"""

from __future__ import annotations

from bridge.mqtt import (
    Connect, IncompleteData, MqttError, Publish, check_payload_format, decode_packet,
)
from bridge.mqtt.fixed_header import parse_fixed_header
from bridge.mqtt.rules import RULES

__all__ = ["compare", "reference_row"]

_PUBLISH_PROPS = ("payload_format_indicator", "message_expiry_interval", "topic_alias",
                  "response_topic", "correlation_data", "content_type")


def _invalid(rule: str, reason: int | None = None) -> dict:
    return {"valid": False, "rule": rule,
            "error_code": RULES[rule].reason_code if reason is None else reason}


def reference_row(frame: bytes, level, alias_topic=None, from_client: bool = True,
                  max_packet_bytes=None) -> dict:
    lvl = level if level in (3, 4, 5) else None
    client = from_client if lvl is not None else True
    out: dict = {"packet_type": frame[0] >> 4 if frame else 0}
    try:
        packet, used = decode_packet(frame, lvl, max_packet_bytes=max_packet_bytes,
                                     from_client=client)
    except IncompleteData:
        out.update(_invalid("LG-truncated"))
        return out
    except MqttError as err:
        out.update(_invalid(err.rule, err.reason_code))
        return out
    if used != len(frame):
        out.update(_invalid("LG-trailing-bytes"))
        return out
    if isinstance(packet, Publish):
        alias = packet.properties.topic_alias
        if packet.topic == "" and alias is not None and alias_topic is None:
            out.update(_invalid("LG-topic-alias-unmapped"))
            return out
        try:
            check_payload_format(packet)
        except MqttError as err:
            out.update(_invalid(err.rule, err.reason_code))
            return out
    out.update(valid=True, rule=None, error_code=None, error=None)
    out["remaining_length"] = parse_fixed_header(frame, minimal=False).remaining_length
    out["packet_id"] = getattr(packet, "packet_id", None)
    out["reason_code"] = getattr(packet, "reason_code", None)
    if isinstance(packet, Publish):
        p = packet.properties
        out.update(dup=packet.dup, qos=packet.qos, retain=packet.retain,
                   topic=packet.topic or alias_topic, payload=packet.payload,
                   payload_size=len(packet.payload),
                   user_properties=[{"key": k, "value": v} for k, v in p.user_properties],
                   subscription_identifiers=list(p.subscription_identifiers))
        for name in _PUBLISH_PROPS:
            out[name] = getattr(p, name)
    else:
        out.update(dup=None, qos=None, retain=None, topic=None, payload=None,
                   payload_size=None, user_properties=None, subscription_identifiers=None)
        for name in _PUBLISH_PROPS:
            out[name] = None
    if isinstance(packet, Connect):
        out.update(client_id=packet.client_id, connect_protocol_level=packet.protocol_level,
                   clean_start=packet.clean_start, keepalive=packet.keepalive)
        w = packet.will
        if w is not None:
            wp = w.properties
            out.update(will_topic=w.topic, will_payload=w.payload, will_qos=w.qos,
                       will_retain=w.retain, will_properties={
                           "will_delay_interval": wp.will_delay_interval,
                           "payload_format_indicator": wp.payload_format_indicator,
                           "message_expiry_interval": wp.message_expiry_interval,
                           "content_type": wp.content_type,
                           "response_topic": wp.response_topic,
                           "correlation_data": wp.correlation_data,
                           "user_properties": [{"key": k, "value": v}
                                               for k, v in wp.user_properties]})
    return out


def compare(row: dict, expected: dict) -> list[str]:
    """Differences between a parsed row and the reference ('' when equal)."""
    diffs = []
    for key, want in expected.items():
        got = row[key]
        if got != want:
            diffs.append(f"{key}: parsed {got!r}, codec {want!r}")
    if expected["valid"]:
        for key in ("rule", "error", "error_code"):
            if row[key] is not None:
                diffs.append(f"{key} set on a valid row: {row[key]!r}")
    else:
        if not (row["error"] or "").startswith(f"[{expected['rule']}] "):
            diffs.append(f"error {row['error']!r} does not start with [{expected['rule']}]")
        for key in ("topic", "payload", "packet_id", "reason_code", "client_id",
                    "user_properties"):
            if row[key] is not None:
                diffs.append(f"{key} set on an invalid row: {row[key]!r}")
    return diffs
