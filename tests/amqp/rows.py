"""Test rows shaped like schemas.forward.FORWARD_DDL."""

from __future__ import annotations

from typing import Any

__all__ = ["row"]


def row(topic: str, offset: int, **kw: Any) -> dict[str, Any]:
    """A FORWARD_DDL row (dict) with sensible defaults."""
    r = dict(kind="publish", topic=topic, packet_id=None, qos=0, retain=False, dup=False, payload=b"",
             payload_format_indicator=None, message_expiry_interval=None, response_topic=None,
             correlation_data=None, user_properties=None, content_type=None, stream="mqtt-frames",
             partition=0, offset=offset, seq=offset, conn_id="c1", client_id="dev1", receive_time=None)
    r.update(kw)
    return r
