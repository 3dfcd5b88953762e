"""The fast encoder writes what proton would: decoded by proton, field by
field equal to map_row's Message, for both profiles and every rule."""

from __future__ import annotations

import datetime as dt

import pytest
from proton import Message

from bridge.amqp.mapping import PROFILES, encode_row, map_row, wire_bytes
from bridge.amqp.wire import encode_value
from tests.amqp.rows import row

NOW = 1_700_000_000.0
T = "/topic/{routing_key}"
FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count", "id", "user_id", "address", "subject",
          "reply_to", "correlation_id", "content_encoding", "expiry_time", "creation_time", "group_id",
          "group_sequence", "reply_to_group_id", "annotations", "properties", "inferred")

CATALOGUE = [
    row("a/b", 0),
    row("a/b", 1, qos=1, packet_id=1, retain=True, dup=True, payload=b"x"),
    row("a/b", 2, qos=2, packet_id=65535, payload=b"\x00" * 300),  # ulong > 255, vbin32
    row("t" * 300, 3, qos=1, packet_id=256, payload=None),  # str32 topic, empty Data
    row("a", 4, kind="pubrel", packet_id=9),
    row("a/b/c", 5, qos=1, packet_id=7, payload=b"{}", payload_format_indicator=0, message_expiry_interval=3600,
        receive_time=dt.datetime.fromtimestamp(NOW - 1.5, dt.timezone.utc), response_topic="r/" + "y" * 260,
        correlation_data=b"\x01" * 10, content_type="application/json",
        user_properties=[{"key": f"k{i % 40}", "value": "v" * 5} for i in range(60)]),  # map32, list32
    row("a", 6, qos=1, packet_id=3, content_type="ü", message_expiry_interval=10, receive_time=NOW - 2),
]


def decoded(data: bytes) -> Message:
    m = Message()
    m.decode(data)
    return m


@pytest.mark.parametrize("profile", ["seed", "enmasse"])
@pytest.mark.parametrize("r", CATALOGUE, ids=lambda r: f"offset{r['offset']}")
def test_encode_row_decodes_to_map_rows_message(profile, r):
    ref = map_row(r, PROFILES[profile], T, NOW)
    fast = encode_row(r, PROFILES[profile], T, NOW)
    assert (fast.address, fast.link, fast.qos, fast.key, fast.expires_at) == \
        (ref.address, ref.link, ref.qos, ref.key, ref.expires_at)
    a, b = decoded(wire_bytes(ref, NOW)), decoded(wire_bytes(fast, NOW))
    for f in FIELDS:
        assert getattr(b, f) == getattr(a, f), f
    assert (a.content_type == b.content_type) and bytes(a.body or b"") == bytes(b.body or b"")
    assert (a.body is None) == (b.body is None)


def test_expired_between_mapping_and_sending():
    out = encode_row(row("a", 1, qos=1, packet_id=1, message_expiry_interval=5, receive_time=NOW - 4), "seed", T, NOW)
    assert wire_bytes(out, NOW) is not None
    assert wire_bytes(out, NOW + 1.0) is None


@pytest.mark.parametrize("value, encoded", [
    (None, b"\x40"), (True, b"\x41"), (False, b"\x42"), (0, b"\x43"), (5, b"\x52\x05"),
    (70000, b"\x70\x00\x01\x11\x70"), ([], b"\x45"), ("é", b"\xa1\x02\xc3\xa9"),
])
def test_encode_value(value, encoded):
    assert encode_value(value) == encoded


def test_unknown_type_is_refused():
    with pytest.raises(TypeError, match="^no AMQP encoding for float$"):
        encode_value(1.5)
