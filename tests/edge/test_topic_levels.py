"""The depth bound of topics and filters (issue 38 item 5): a Topic Name or
Topic Filter of more than ``edge.max_topic_levels`` levels (200, as
Mosquitto's TOPIC_HIERARCHY_LIMIT) is refused [LG-edge-topic-levels], so no
topic tree of the edge (subscriptions, retained overlay) grows deeper than
the bound. Sans-IO through the Harness, plus the server end to end.

Test names carry the rule ids (OASIS MQTT 5.0 numbering; project ids LG-...
from bridge/edge/rules.py)."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, EdgeConfig, load_config
from bridge.edge import rules as edge_rules
from bridge.edge.actions import Capture
from bridge.edge.router import Router
from bridge.edge.session import Limits
from bridge.mqtt import (
    Properties, PubAck, PubRec, Suback, Subscribe, Subscription, Unsuback, Unsubscribe, Will,
    decode_packet, encode,
)
from tests.edge.util import Harness, connect, publish

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

RULE = edge_rules.TOPIC_LEVELS


def topic(levels: int, prefix: str = "t") -> str:
    return "/".join([prefix] + ["x"] * (levels - 1))


def client(level: int = 5, limits: Limits | None = None, router: Router | None = None,
           cid: str = "dev") -> Harness:
    h = Harness(limits, router=router or Router())
    h.feed(connect(level, client_id=cid))
    assert h.session.state == "connected", h.closed
    h.take()
    return h


def feed(h: Harness, data: bytes) -> list[Capture]:
    """Feed ``data``; return the Capture actions (to see what is delivered)."""
    actions = h.session.receive_data(data, h.now)
    h.perform(actions)
    return [a for a in actions if isinstance(a, Capture)]


def packets(data: bytes, level: int) -> list:
    out = []
    while data:
        p, n = decode_packet(data, level, from_client=False)
        out.append(p)
        data = data[n:]
    return out


def test_lg_edge_topic_levels_defaults_to_200_levels_as_mosquitto():
    assert EdgeConfig().max_topic_levels == 200
    assert Limits().max_topic_levels == 200
    cfg = load_config(None, ["edge.max_topic_levels=7"], env={})
    assert Limits.from_config(cfg.edge).max_topic_levels == 7
    with pytest.raises(ConfigError, match="edge.max_topic_levels: must be positive"):
        load_config(None, ["edge.max_topic_levels=0"], env={})
    rule = edge_rules.EDGE_RULES[RULE]
    assert "edge.max_topic_levels" in rule.text and rule.reason_code == 0x90


# ------------------------------------------------------------------ PUBLISH
@pytest.mark.parametrize("qos, ack", [(1, PubAck), (2, PubRec)])
def test_lg_edge_topic_levels_publish_refused_0x90(qos, ack):
    h = client(5)
    caps = feed(h, publish(5, topic(201), b"secret", qos, packet_id=9, retain=True))
    (p,) = packets(h.take(), 5)
    assert isinstance(p, ack) and p.packet_id == 9 and p.reason_code == 0x90  # Topic Name invalid
    assert h.closed is None and h.session.state == "connected"
    assert [c.deliver for c in caps] == [None]  # never routed, retained or delivered
    hd = h.headers()
    assert hd["reject"] == RULE.encode() and hd["reject_code"] == b"144"
    assert b"201 levels" in hd["reject_error"] and b"secret" not in hd["reject_error"]
    assert 9 not in h.session.client.qos2  # a PUBREC >= 0x80 ends the exchange
    # the connection goes on: a topic at the bound is taken
    caps = feed(h, publish(5, topic(200), b"ok", qos, packet_id=10))
    (p,) = packets(h.take(), 5)
    assert p.reason_code == 0 and caps[0].deliver == topic(200)


def test_lg_edge_topic_levels_publish_qos0_is_dropped_and_the_connection_kept():
    h = client(5)
    caps = feed(h, publish(5, topic(500), b"p", 0))
    assert h.take() == b"" and h.closed is None
    assert [c.deliver for c in caps] == [None]
    assert h.headers()["reject"] == RULE.encode()


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_lg_edge_topic_levels_publish_closes_a_3x_connection(level, qos):
    h = client(level)
    caps = feed(h, publish(level, topic(201), b"secret", qos, packet_id=3))
    assert h.take() == b""  # no PUBACK/PUBREC: 3.x has no code to refuse with
    assert h.closed is not None and f"[{RULE}]" in h.closed and "201 levels" in h.closed
    assert "secret" not in h.closed
    assert all(c.deliver is None for c in caps)
    assert h.headers()["reject"] == RULE.encode()


def test_lg_edge_topic_levels_a_topic_alias_is_checked_as_resolved():
    h = client(5, Limits(max_topic_levels=3))
    deep = "a/b/c/d"
    feed(h, publish(5, deep, b"1", 1, packet_id=1, properties=Properties(topic_alias=1)))
    caps = feed(h, publish(5, "", b"2", 1, packet_id=2, properties=Properties(topic_alias=1)))
    assert [p.reason_code for p in packets(h.take(), 5)] == [0x90, 0x90]
    assert caps[0].deliver is None and h.closed is None
    caps = feed(h, publish(5, "a/b/c", b"3", 1, packet_id=3))
    assert caps[0].deliver == "a/b/c"


def test_lg_edge_topic_levels_a_refused_publish_reaches_no_subscriber():
    router = Router()
    sub = client(5, router=router, cid="sub")
    sub.feed(encode(Subscribe(1, [Subscription("#", 1)]), 5))
    sub.take()
    pub = client(5, Limits(max_topic_levels=2), router=router, cid="pub")
    caps = feed(pub, publish(5, "a/b/c", b"no", 1, packet_id=1))
    assert [c.deliver for c in caps] == [None]  # the server routes (and retains) nothing
    sub.perform(sub.session.deliver(sub.now))
    assert sub.take() == b""


# ------------------------------------------------------------------ SUBSCRIBE
@pytest.mark.parametrize("level, code", [(3, 0x80), (4, 0x80), (5, 0x8F)])
def test_lg_edge_topic_levels_subscribe_refused_0x8f(level, code):
    h = client(level)
    subs = [Subscription("ok/#", 1), Subscription(topic(201) + "/#", 1),
            Subscription(topic(199) + "/#", 2), Subscription("$share/g/" + topic(199), 1)]
    h.feed(encode(Subscribe(4, subs), level))
    # a $share/{group}/ prefix counts, as subscribed (as Mosquitto counts it)
    share = code if level == 5 else 0x80
    head = b"\x90\x07\x00\x04\x00" if level == 5 else b"\x90\x06\x00\x04"
    # (MQTT 3.1 has no failure code; the edge sends 0x80 as 3.1.1 does)
    assert h.take() == head + bytes([1, code, 2, share])
    assert h.session.state == "connected"
    held = {s.topic_filter for s in h.session.router.tree.subscriptions("dev")}
    assert held == {"ok/#", topic(199) + "/#"}
    (notice,) = h.notices
    assert f"[{RULE}]" in notice and "2 of 4 filters refused" in notice and "202 levels" in notice
    assert h.headers()["granted"] == bytes([1, code, 2, share]).hex().encode()


def test_lg_edge_topic_levels_unsubscribe_of_a_too_deep_filter_is_0x8f():
    h = client(5)
    h.feed(encode(Unsubscribe(5, [topic(300), "none"]), 5))
    (unsuback,) = packets(h.take(), 5)
    assert isinstance(unsuback, Unsuback) and list(unsuback.reason_codes) == [0x8F, 0x11]


def test_lg_edge_topic_levels_unsubscribe_removes_a_deep_subscription_of_a_larger_setting():
    """A subscription granted under a larger setting (restored from the log)
    can still be removed."""
    h = client(5, Limits(max_topic_levels=300))
    h.feed(encode(Subscribe(1, [Subscription(topic(250), 1)]), 5))
    h.take()
    h.session.limits = Limits(max_topic_levels=200)
    h.feed(encode(Unsubscribe(2, [topic(250)]), 5))
    (unsuback,) = packets(h.take(), 5)
    assert list(unsuback.reason_codes) == [0x00]


# ------------------------------------------------------------------ Will
@pytest.mark.parametrize("level", [4, 5])
def test_lg_edge_topic_levels_will_topic_refused(level):
    h = Harness(Limits(max_topic_levels=10))
    h.feed(connect(level, client_id="w", will=Will(topic(11), b"bye", 1)))
    sent = h.take()
    if level == 5:
        (connack,) = packets(sent, 5)
        assert connack.reason_code == 0x90  # Topic Name invalid
    else:
        assert sent == b""  # 3.x has no such return code: closed without CONNACK
    assert h.closed is not None and f"[{RULE}]" in h.closed
    assert h.headers()["reject"] == RULE.encode()
    assert not h.wills and not h.requests
    ok = Harness(Limits(max_topic_levels=10))
    ok.feed(connect(level, client_id="w", will=Will(topic(10), b"bye", 1)))
    assert ok.session.state == "connected"


# ------------------------------------------------------------------ server
@pytest.mark.subprocess
def test_lg_edge_topic_levels_over_the_wire(run_edge, edge_config):
    from tests.edge.conftest import RawClient

    cfg = edge_config()
    e = run_edge(config=cfg)
    c = RawClient(e.port, timeout=10)
    assert c.connect(5, client_id="deep")[3] == 0
    c.publish(5, topic=topic(201), payload=b"x", qos=1, packet_id=1, retain=True)
    p, _ = decode_packet(c.packet(), 5, from_client=False)
    assert isinstance(p, PubAck) and p.reason_code == 0x90
    c.send(encode(Subscribe(2, [Subscription("#", 1), Subscription(topic(201), 1)]), 5))
    p, _ = decode_packet(c.packet(), 5, from_client=False)
    assert isinstance(p, Suback) and list(p.reason_codes) == [1, 0x8F]
    c.publish(5, topic="after", payload=b"y", qos=1, packet_id=3)
    got = [decode_packet(c.packet(), 5, from_client=False)[0] for _ in range(2)]
    # no retained message for the refused topic: the first thing after the
    # SUBACK is the live message (and our PUBACK)
    assert sorted(type(x).__name__ for x in got) == ["PubAck", "Publish"]
    assert [x.topic for x in got if not isinstance(x, PubAck)] == ["after"]
    c.close()
    e.stop()
    # after a restart (the overlay is rebuilt from the log): still no retained
    # message for the refused topic
    e2 = run_edge(config=cfg)
    c = RawClient(e2.port, timeout=10)
    assert c.connect(5, client_id="again")[3] == 0
    c.send(encode(Subscribe(2, [Subscription("#", 1), Subscription("after", 1)]), 5))
    p, _ = decode_packet(c.packet(), 5, from_client=False)
    assert isinstance(p, Suback) and list(p.reason_codes) == [1, 1]
    c.publish(5, topic="marker", payload=b"m", qos=1, packet_id=4)
    got = [decode_packet(c.packet(), 5, from_client=False)[0] for _ in range(2)]
    assert [x.topic for x in got if not isinstance(x, PubAck)] == ["marker"]
    c.close()


# ------------------------------------------------------------------ length
LENGTH = edge_rules.TOPIC_LENGTH


def test_lg_edge_topic_length_defaults_to_mqtts_maximum():
    assert EdgeConfig().max_topic_length == 65535 == Limits().max_topic_length
    cfg = load_config(None, ["edge.max_topic_length=64"], env={})
    assert Limits.from_config(cfg.edge).max_topic_length == 64
    with pytest.raises(ConfigError, match="edge.max_topic_length: must be at most 65535"):
        load_config(None, ["edge.max_topic_length=65536"], env={})
    with pytest.raises(ConfigError, match="edge.max_topic_length: must be positive"):
        load_config(None, ["edge.max_topic_length=0"], env={})


@pytest.mark.parametrize("qos, ack", [(1, PubAck), (2, PubRec)])
def test_lg_edge_topic_length_publish_refused_0x90(qos, ack):
    h = client(5, Limits(max_topic_length=8))
    caps = feed(h, publish(5, "a" * 9, b"p", qos, packet_id=2))
    (p,) = packets(h.take(), 5)
    assert isinstance(p, ack) and p.reason_code == 0x90 and h.closed is None
    assert [c.deliver for c in caps] == [None]
    assert h.headers()["reject"] == LENGTH.encode()
    assert b"9 characters exceeds edge.max_topic_length 8" in h.headers()["reject_error"]
    caps = feed(h, publish(5, "a" * 8, b"p", qos, packet_id=3))
    assert packets(h.take(), 5)[0].reason_code == 0 and caps[0].deliver == "a" * 8


def test_lg_edge_topic_length_publish_closes_a_3x_connection():
    h = client(4, Limits(max_topic_length=8))
    feed(h, publish(4, "a" * 9, b"p", 1, packet_id=2))
    assert h.take() == b"" and h.closed is not None and f"[{LENGTH}]" in h.closed


@pytest.mark.parametrize("level, code", [(4, 0x80), (5, 0x8F)])
def test_lg_edge_topic_length_subscribe_refused_0x8f(level, code):
    h = client(level, Limits(max_topic_length=8))
    h.feed(encode(Subscribe(1, [Subscription("a" * 9, 1), Subscription("a/#", 1)]), level))
    (suback,) = packets(h.take(), level)
    assert list(suback.reason_codes) == [code, 1]
    assert f"[{LENGTH}]" in h.notices[0]
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("dev")] == ["a/#"]
    h.feed(encode(Unsubscribe(2, ["a" * 9]), level))
    if level == 5:
        assert list(packets(h.take(), 5)[0].reason_codes) == [0x8F]


def test_lg_edge_topic_length_will_topic_refused():
    h = Harness(Limits(max_topic_length=8))
    h.feed(connect(5, client_id="w", will=Will("a" * 9, b"bye", 1)))
    (connack,) = packets(h.take(), 5)
    assert connack.reason_code == 0x90 and f"[{LENGTH}]" in h.closed
