"""A large SUBSCRIBE or UNSUBSCRIBE is handled a slice at a time (issue 38,
item 5): the event loop is never held for the whole packet, nothing changes
until the last slice, the answer is the same as for the packet handled at
once, and the log line about refused filters stays small. Sans-IO."""

from __future__ import annotations

import pytest

import bridge.edge.subscribing as subscribing
from bridge.edge.session import Limits
from bridge.mqtt import Subscribe, Subscription, Unsubscribe, encode
from bridge.mqtt.fixed_header import encode_fixed_header
from tests.edge.util import Harness, connect

_PINGREQ = b"\xc0\x00"


def _client(level: int = 5, limit: int = 100) -> Harness:
    h = Harness(Limits(max_subscriptions_per_client=limit, max_packet_bytes=4 << 20))
    h.feed(connect(level, client_id="big"))
    assert h.take()[0] == 0x20
    return h


def _many(n: int, prefix: str = "f") -> list[Subscription]:
    return [Subscription(f"{prefix}/{i}", i % 3) for i in range(n)]


@pytest.mark.parametrize("level", [4, 5])
def test_lg_edge_subscription_quota_a_large_subscribe_is_sliced_and_answered_in_order(level):
    h = _client(level, limit=100)
    frame = encode(Subscribe(9, _many(20_000)), level)
    assert len(frame) > subscribing.SLICE_BYTES
    h.feed(frame + _PINGREQ)
    assert h.slices >= 20_000 // subscribing.SLICE_FILTERS
    out = h.take()
    refused = 0x97 if level == 5 else 0x80
    codes = [i % 3 for i in range(100)] + [refused] * 19_900
    head = 4 + (level == 5)
    body = (b"\x00\x09" + (b"\x00" if level == 5 else b"") + bytes(codes))
    suback = encode_fixed_header(0x90, len(body)) + body
    assert out == suback + b"\xd0\x00"  # the PINGREQ behind it answered after it
    assert h.session.router.tree.count("big") == 100
    (notice,) = h.notices
    assert len(notice) < 400 and "19900 of 20000 filters refused" in notice
    assert "[LG-edge-subscription-quota]" in notice
    assert h.headers()["granted"] == bytes(codes).hex().encode()
    assert head  # (the SUBACK's fixed header is as long as its body needs)


def test_lg_edge_a_sliced_subscribe_answers_as_the_same_packet_handled_at_once(monkeypatch):
    subs = _many(3_000) + [Subscription("f/7", 2), Subscription("g/#", 1)] + _many(50, "f")
    frame = encode(Subscribe(3, subs), 5)
    sliced = _client(5, limit=2_000)
    sliced.feed(frame)
    assert sliced.slices > 1
    monkeypatch.setattr(subscribing, "SLICE_BYTES", 1 << 30)
    import bridge.edge.session as session_mod

    monkeypatch.setattr(session_mod, "SLICE_BYTES", 1 << 30)
    whole = _client(5, limit=2_000)
    whole.feed(frame)
    assert whole.slices == 0
    assert sliced.take() == whole.take()
    assert list(sliced.session.router.tree) == list(whole.session.router.tree)
    assert sliced.headers() == whole.headers()


def test_mqtt_4_7_1_1_a_malformed_filter_in_a_late_slice_closes_and_changes_nothing():
    h = _client(5, limit=10_000)
    h.feed(encode(Subscribe(1, [Subscription("kept/#", 1)]), 5))
    h.take()
    good = encode(Subscribe(2, _many(5_000)), 5)
    bad_tf = b"a/#/b"
    body = good[good.index(b"\x00\x02\x00") :] + len(bad_tf).to_bytes(2, "big") + bad_tf + b"\x01"
    h.feed(encode_fixed_header(0x82, len(body)) + body)
    assert h.slices > 1
    assert h.closed is not None and "MQTT-4.7.1-1" in h.closed
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("big")] == ["kept/#"]
    assert h.take()[:3] == b"\xe0\x01\x81"  # DISCONNECT Malformed Packet, no SUBACK


def test_mqtt_3_11_3_1_a_large_unsubscribe_is_sliced_with_a_code_per_filter():
    h = _client(5, limit=50)
    h.feed(encode(Subscribe(1, _many(50)), 5))
    h.take()
    filters = [f"f/{i}" for i in range(0, 8_000, 2)]
    h.feed(encode(Unsubscribe(2, filters + ["f/0"]), 5))
    assert h.slices > 1
    out = h.take()
    codes = [0x00 if i < 50 else 0x11 for i in range(0, 8_000, 2)] + [0x11]
    body = b"\x00\x02\x00" + bytes(codes)
    assert out == encode_fixed_header(0xB0, len(body)) + body
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("big")] == \
        [f"f/{i}" for i in range(1, 50, 2)]


def test_lg_edge_bytes_arriving_during_the_slices_wait_for_them():
    h = _client(5, limit=10)
    frame = encode(Subscribe(5, _many(4_000)), 5)
    s = h.session
    h.perform(s.receive_data(frame[:-10], h.now))
    h.perform(s.receive_data(frame[-10:] + _PINGREQ[:1], h.now))
    assert s.work_pending  # the first slice ran, the rest waits for Session.work
    h.perform(s.receive_data(_PINGREQ[1:] + _PINGREQ, h.now))
    assert h.take() == b""  # nothing answered before the SUBACK
    while s.work_pending:
        h.perform(s.work(h.now))
    out = h.take()
    assert out.endswith(b"\xd0\x00\xd0\x00") and out[0] == 0x90
