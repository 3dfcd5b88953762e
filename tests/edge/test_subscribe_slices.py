"""A large SUBSCRIBE or UNSUBSCRIBE is handled a slice at a time (issue 38,
item 5): the event loop is never held for the whole packet, nothing changes
until every filter is decided, a session that ends with its connection gets
the filters applied a slice at a time too (a persistent one in one step, as
the capture log's replay meets it), the answer is the same as for the packet
handled at once, and the log line about refused filters stays small. Sans-IO."""

from __future__ import annotations

import pytest

import bridge.edge.subscribing as subscribing
from bridge.edge.message import Message
from bridge.edge.session import Limits
from bridge.edge.subscription import Sub
from bridge.mqtt import Subscribe, Subscription, Unsubscribe, encode
from bridge.mqtt.fixed_header import encode_fixed_header
from tests.edge.util import Harness, connect

_PINGREQ = b"\xc0\x00"


def _client(level: int = 5, limit: int = 100, **fields) -> Harness:
    h = Harness(Limits(max_subscriptions_per_client=limit, max_packet_bytes=4 << 20))
    h.feed(connect(level, client_id="big", **fields))
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


def _deep(n: int, depth: int = 100) -> list[Subscription]:
    """Issue 38's subscription flood: distinct filters of ``depth`` levels."""
    return [Subscription("/".join([f"d{j:04d}"] + [f"{j:04d}.{k:03d}" for k in range(1, depth)]), 1)
            for j in range(n)]


def test_lg_edge_turn_budget_a_large_subscribe_is_applied_in_slices_then_answered():
    h = _client(4, limit=1001)
    s = h.session
    tree = s.router.tree
    s.router.subscribe(s.client, Sub("big", "old/#", 1))  # held from before
    subs = _deep(1000) + _deep(3)  # the last three repeat: each is applied once
    frame = encode(Subscribe(9, subs), 4)
    h.perform(s.receive_data(frame, h.now))
    counts = [tree.count("big")]
    decoded = [len(s._work[1].items)]
    suback_at = None
    while s.work_pending:
        # a message for the subscription held before comes in meanwhile
        if len(counts) == 5:
            s.router.route(Message("old/x", 1, False, b"live", b"", ready=True))
        h.perform(s.work(h.now))
        counts.append(tree.count("big"))
        if s._work is not None:
            decoded.append(len(s._work[1].items))
        if suback_at is None and h.sent:
            suback_at = len(counts) - 1
    steps = [b - a for a, b in zip(counts, counts[1:])]
    assert counts[-1] == 1001 and sum(steps) == 1000
    most = subscribing.SLICE_FILTER_BYTES // len(subs[0].topic_filter) + 1  # 74 of 896 chars
    assert max(steps) <= most and len([x for x in steps if x]) >= 1000 // most
    assert max(b - a for a, b in zip(decoded, decoded[1:])) <= most  # decoded by bytes too
    # answered once every filter is applied, and first: the message waited for it
    assert suback_at == len(counts) - 1
    out = h.take()
    body = b"\x00\x09" + b"\x01" * 1003
    suback = encode_fixed_header(0x90, len(body)) + body
    assert out[:len(suback)] == suback
    assert out[len(suback)] >> 4 == 3 and b"live" in out[len(suback):]
    assert h.headers()["granted"] == (b"\x01" * 1003).hex().encode()


def test_lg_edge_turn_budget_a_persistent_session_applies_a_subscribe_in_one_step():
    # the capture log's replay (bridge.edge.journal) applies the SUBSCRIBE at
    # its record: no message may have been routed to part of it before
    h = _client(4, limit=1000, clean_start=False)
    s = h.session
    assert s.client.persistent
    tree = s.router.tree
    h.perform(s.receive_data(encode(Subscribe(9, _deep(1000, 20)), 4), h.now))
    counts = [tree.count("big")]
    while s.work_pending:
        h.perform(s.work(h.now))
        counts.append(tree.count("big"))
    assert counts[-1] == 1000 and counts[:-1] == [0] * (len(counts) - 1)
    assert h.take()[:1] == b"\x90"


def test_lg_edge_turn_budget_large_subscribes_in_one_read_take_a_turn_each():
    # 20 SUBSCRIBEs of 50 deep filters (45 kB each), sent at once: each is
    # decided and applied in turns of its own, none behind another in one turn
    h = _client(4, limit=1000)
    s = h.session
    tree = s.router.tree
    deep = _deep(1000)
    data = b"".join(encode(Subscribe(i + 1, deep[i * 50:(i + 1) * 50]), 4) for i in range(20))
    h.perform(s.receive_data(data, h.now))
    counts = [tree.count("big")]
    while s.work_pending:
        h.perform(s.work(h.now))
        counts.append(tree.count("big"))
    assert counts[-1] == 1000 and len(counts) > 20  # (the first read's turn, then one each)
    assert max(b - a for a, b in zip(counts, counts[1:])) <= 50
    assert h.take().count(b"\x90\x34") == 20  # 20 SUBACKs of 50 codes
