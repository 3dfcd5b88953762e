"""The fast encoder writes what proton would: decoded by proton, field by
field equal to map_row's Message, for both profiles and every rule."""

from __future__ import annotations

import datetime as dt

import pytest
from proton import Message, timestamp

from bridge.amqp.mapping import PROFILES, map_row
from bridge.amqp.wire import encode_row, wire_bytes
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
    # the longest Message Expiry Interval: more than ttl (uint ms) holds -> absolute-expiry-time
    row("a", 7, qos=1, packet_id=4, message_expiry_interval=2**32 - 1, receive_time=NOW - 2),
    row("a", 8, qos=2, packet_id=5, message_expiry_interval=4_294_968, receive_time=NOW),  # 1 s over the ttl
    row("a", 9, qos=0, message_expiry_interval=4_294_967, receive_time=NOW),  # the longest that fits ttl
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


@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_expiry_beyond_ttl_range_is_an_absolute_expiry_time_in_both_encoders(profile):
    r = row("a", 1, qos=1, packet_id=1, message_expiry_interval=2**32 - 1, receive_time=NOW - 2)
    for out in (map_row(r, profile, T, NOW), encode_row(r, profile, T, NOW)):
        m = decoded(wire_bytes(out, NOW))  # raised struct.error / OverflowError before
        assert m.ttl == 0  # left out
        assert m.expiry_time == pytest.approx(NOW - 2 + 2**32 - 1)
    fits = row("a", 2, qos=1, packet_id=1, message_expiry_interval=4_294_967, receive_time=NOW)
    m = decoded(wire_bytes(encode_row(fits, profile, T, NOW), NOW))
    assert m.ttl == pytest.approx(4_294_967.0) and m.expiry_time == 0


def test_expiry_just_beyond_ttl_gets_ttl_too_once_it_fits_at_send_time():
    r = row("a", 1, qos=1, packet_id=1, message_expiry_interval=4_294_968, receive_time=NOW)
    fast, ref = encode_row(r, "seed", T, NOW), map_row(r, "seed", T, NOW)
    a, b = decoded(wire_bytes(ref, NOW + 2.0)), decoded(wire_bytes(fast, NOW + 2.0))
    for f in FIELDS:
        assert getattr(b, f) == getattr(a, f), f
    assert b.ttl == pytest.approx(4_294_966.0) and b.expiry_time == pytest.approx(NOW + 4_294_968)


def test_plain_int_out_of_uint_range_is_refused():
    with pytest.raises(ValueError, match="^4294967296 does not fit an AMQP uint$"):
        encode_value(2**32)


def test_expired_between_mapping_and_sending():
    out = encode_row(row("a", 1, qos=1, packet_id=1, message_expiry_interval=5, receive_time=NOW - 4), "seed", T, NOW)
    assert wire_bytes(out, NOW) is not None
    assert wire_bytes(out, NOW + 1.0) is None


@pytest.mark.parametrize("value, encoded", [
    (None, b"\x40"), (True, b"\x41"), (False, b"\x42"), (0, b"\x43"), (5, b"\x52\x05"),
    (70000, b"\x70\x00\x01\x11\x70"), ([], b"\x45"), ("é", b"\xa1\x02\xc3\xa9"),
    (timestamp(1_700_000_000_123), b"\x83\x00\x00\x01\x8b\xcf\xe5\x68\x7b"),
])
def test_encode_value(value, encoded):
    assert encode_value(value) == encoded


def test_unknown_type_is_refused():
    with pytest.raises(TypeError, match="^no AMQP encoding for float$"):
        encode_value(1.5)
