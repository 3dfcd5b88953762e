"""A connected client as a subscriber (bridge/edge/subscribing.py and
sending.py, parts of the Session): SUBSCRIBE / UNSUBSCRIBE answers,
deliveries, the subscriber's acknowledgements and the re-sends on
reconnection. Driven by bytes and explicit times through the Harness: no
socket, no event loop.

Test names carry the rule id they check (OASIS MQTT 5.0 numbering; project
ids LG-... from bridge/edge/rules.py)."""

from __future__ import annotations

import pytest

from bridge.edge.message import Message
from bridge.edge.router import Router
from bridge.edge.session import Limits
from bridge.edge.state import SessionStore
from bridge.mqtt import (
    Connack, Disconnect, Properties, PubAck, PubComp, PubRec, PubRel, Publish, Suback, Subscribe,
    Subscription, Unsubscribe, encode,
)
from bridge.mqtt.codec import decode_packet
from tests.edge.util import Harness, connect, publish


# ------------------------------------------------------------------ helpers
def client(level: int = 5, cid: str = "sub", *, router: Router | None = None,
           store: SessionStore | None = None, limits: Limits | None = None,
           conn_id: str = "c1", now: float = 0.0, **fields) -> Harness:
    h = Harness(limits, router=router, store=store, conn_id=conn_id, now=now)
    h.feed(connect(level, client_id=cid, **fields))
    assert h.session.state == "connected", h.closed
    h.take()
    return h


def subscribe(h: Harness, *subs: Subscription | str, pid: int = 1,
              sub_id: int | None = None) -> bytes:
    """SUBSCRIBE (a str is a filter at QoS 2); returns what was sent back."""
    items = [Subscription(x, 2) if isinstance(x, str) else x for x in subs]
    props = Properties(subscription_identifiers=[sub_id] if sub_id is not None else [])
    h.feed(encode(Subscribe(pid, items, props), h.session.level))
    return h.take()


def route(h: Harness, topic: str = "a/b", qos: int = 2, *, n: int = 0, level: int = 5,
          origin: str = "pub", ready: bool = True, received: float | None = None,
          payload: bytes | None = None, **fields) -> Message:
    """A PUBLISH accepted from ``origin`` (at protocol ``level``), captured at
    (0, ``n``), fanned out by the router; then the session sends what it may."""
    body = b"m%d" % n if payload is None else payload
    frame = publish(level, topic, body, qos, packet_id=77 if qos else None, **fields)
    msg = Message.from_frame(frame, level, origin=origin,
                             received=h.now if received is None else received, ref=(0, n),
                             ready=ready)
    h.session.router.route(msg)
    h.perform(h.session.deliver(h.now))
    return msg


def packets(data: bytes, level: int) -> list:
    out = []
    while data:
        p, n = decode_packet(data, level, from_client=False)
        out.append(p)
        data = data[n:]
    return out


def ack(cls, pid: int, level: int = 5, reason: int = 0) -> bytes:
    return encode(cls(pid, reason), level)


def sent(h: Harness) -> list:
    return packets(h.take(), h.session.level)


# ------------------------------------------------------------------ SUBSCRIBE
@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_3_8_4_6_suback_has_one_code_per_filter_in_the_order_of_the_subscribe(level):
    h = client(level)
    subs = [Subscription("a/#", 1), Subscription("b", 0), Subscription("c/+", 2)]
    (suback,) = packets(subscribe(h, *subs, pid=9), level)
    assert isinstance(suback, Suback) and suback.packet_id == 9
    assert list(suback.reason_codes) == [1, 0, 2]
    assert h.headers()["granted"] == b"010002"
    assert sorted(s.topic_filter for s in h.session.router.tree.subscriptions("sub")) == [
        "a/#", "b", "c/+"]


@pytest.mark.parametrize("level, refused", [(3, 0x80), (4, 0x80), (5, 0x97)])
def test_lg_edge_subscription_quota_refuses_filters_beyond_the_limit(level, refused):
    h = client(level, limits=Limits(max_subscriptions_per_client=2))
    head = b"\x90\x06\x00\x03\x00" if level == 5 else b"\x90\x05\x00\x03"
    # (MQTT 3.1 has no failure code; the edge sends 0x80 as 3.1.1 does)
    assert subscribe(h, "a", "b", "c", pid=3) == head + bytes((2, 2, refused))
    assert h.headers()["granted"] == bytes((2, 2, refused)).hex().encode()
    assert h.session.state == "connected"
    assert len(h.notices) == 1 and "[LG-edge-subscription-quota]" in h.notices[0]
    assert "1 of 3 filters refused" in h.notices[0]
    assert h.session.router.count("sub") == 2
    # at the limit, re-subscribing a filter it holds is a replacement, granted
    assert subscribe(h, Subscription("b", 1), pid=4)[-1] == 1
    # an UNSUBSCRIBE makes room
    h.feed(encode(Unsubscribe(5, ["a"]), level))
    h.take()
    assert subscribe(h, "c", pid=6)[-1] == 2


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_3_8_4_3_a_subscribe_repeating_a_filter_replaces_the_subscription(level):
    h = client(level)
    subscribe(h, Subscription("a/+", 2), sub_id=1 if level == 5 else None)
    subscribe(h, Subscription("a/+", 0), pid=2, sub_id=2 if level == 5 else None)
    assert h.session.router.count("sub") == 1
    route(h, qos=2)
    (p,) = sent(h)
    assert isinstance(p, Publish) and p.qos == 0  # the new subscription's QoS, one copy
    if level == 5:
        assert p.properties.subscription_identifiers == [2]


def test_mqtt_3_8_4_3_a_subscription_identifier_applies_to_every_filter_of_its_subscribe():
    h = client(5)
    subscribe(h, Subscription("a/#", 1), Subscription("a/b", 0), sub_id=12)
    assert {s.sub_id for s in h.session.router.tree.subscriptions("sub")} == {12}
    route(h, qos=1)
    (p,) = sent(h)
    # one copy; both subscriptions carry the identifier (sent once per subscription today)
    assert set(p.properties.subscription_identifiers) == {12}


# ------------------------------------------------------------------ UNSUBSCRIBE
def test_mqtt_3_11_3_1_unsuback_has_0x00_or_0x11_per_filter():
    h = client(5)
    subscribe(h, "a/b", "c")
    h.feed(encode(Unsubscribe(4, ["x", "a/b", "c", "c"]), 5))
    assert h.take() == b"\xb0\x07\x00\x04\x00" + bytes((0x11, 0x00, 0x00, 0x11))
    assert h.session.router.count("sub") == 0
    route(h)
    assert h.take() == b""


@pytest.mark.parametrize("level", [3, 4])
def test_unsuback_in_3_x_has_no_codes_and_the_subscription_ends(level):
    h = client(level)
    subscribe(h, "a/b")
    h.feed(encode(Unsubscribe(4, ["a/b", "x"]), level))
    assert h.take() == b"\xb0\x02\x00\x04"
    route(h)
    assert h.take() == b""


# ------------------------------------------------------------------ QoS 1 and 2 flows
@pytest.mark.parametrize("level", [3, 4, 5])
def test_qos_1_outbound_flow_puback_ends_the_delivery_and_is_captured_with_ack_ref(level):
    h = client(level)
    subscribe(h, "a/b")
    route(h, qos=1, n=5)
    (p,) = sent(h)
    assert (p.qos, p.packet_id, p.dup, p.retain) == (1, 1, False, False)
    h.feed(ack(PubAck, 1, level))
    assert h.take() == b"" and h.replies[-1] is None
    assert h.frames()[-1] == ack(PubAck, 1, level)
    assert h.headers()["ack_ref"] == b"0:5"
    assert len(h.session.client.outbox) == 0


@pytest.mark.parametrize("level", [3, 4, 5])
def test_qos_2_outbound_flow_pubrec_gets_pubrel_then_pubcomp_ends_it(level):
    h = client(level)
    subscribe(h, "a/b")
    route(h, qos=2, n=8)
    (p,) = sent(h)
    assert (p.qos, p.packet_id) == (2, 1)
    h.feed(ack(PubRec, 1, level))
    (rel,) = sent(h)
    assert isinstance(rel, PubRel) and rel.packet_id == 1 and rel.reason_code == 0
    assert h.headers()["ack_ref"] == b"0:8"
    h.feed(ack(PubComp, 1, level))
    assert h.take() == b""
    assert h.headers()["ack_ref"] == b"0:8"
    assert len(h.session.client.outbox) == 0


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos, wrong", [(2, [PubAck]), (1, [PubRec]), (1, [PubComp]),
                                        (2, [PubComp]), (2, [PubRec, PubAck])])
def test_lg_edge_ack_mismatch_a_wrong_kind_of_acknowledgement_closes(level, qos, wrong):
    h = client(level)
    subscribe(h, "a/b")
    route(h, qos=qos)
    h.take()
    *before, last = wrong
    for cls in before:
        h.feed(ack(cls, 1, level))
    h.take()
    assert h.closed is None
    h.feed(ack(last, 1, level))
    assert h.closed is not None and h.closed.startswith("[LG-edge-ack-mismatch]")
    # the frame is captured as a rejected one, with its rule
    assert h.frames()[-1] == ack(last, 1, level)
    assert h.headers()["reject"] == b"LG-edge-ack-mismatch"
    out = h.take()
    if level == 5:
        assert out.endswith(b"\xe0\x01\x82")  # DISCONNECT Protocol Error
    else:
        assert out == b""  # 3.x has no DISCONNECT from the server: closed


@pytest.mark.parametrize("level", [3, 4, 5])
def test_a_run_of_pubacks_read_together_is_one_capture_record_with_ack_refs(level):
    h = client(level)
    subscribe(h, "a/b")
    for n in (5, 6, 7):
        route(h, qos=1, n=n)
    assert [p.packet_id for p in sent(h)] == [1, 2, 3]
    before = len(h.records)
    run = ack(PubAck, 1, level) + ack(PubAck, 2, level) + ack(PubAck, 99, level) \
        + ack(PubAck, 3, level)
    assert len(run) == 16  # 4-byte PUBACKs at every level
    h.feed(run)
    assert len(h.records) == before + 1 and h.closed is None
    assert h.frames()[-1] == run  # the frames byte for byte, in order
    assert h.headers()["ack_refs"] == b"0:5 0:6 - 0:7"  # 99 acknowledges nothing
    assert "ack_ref" not in h.headers() and h.replies[-1] is None
    assert len(h.session.client.outbox) == 0
    assert h.session.frames_in >= 4


@pytest.mark.parametrize("level", [4, 5])
def test_lg_edge_ack_mismatch_a_puback_for_a_qos_2_delivery_inside_a_run(level):
    h = client(level)
    subscribe(h, "a/b")
    route(h, qos=1, n=5)
    route(h, qos=2, n=6)
    h.take()
    h.feed(ack(PubAck, 1, level) + ack(PubAck, 2, level) + ack(PubAck, 3, level))
    # the PUBACK before it is captured as usual, the offending one as rejected
    assert h.frames()[-2] == ack(PubAck, 1, level) and h.headers(-2)["ack_ref"] == b"0:5"
    assert h.frames()[-1] == ack(PubAck, 2, level)
    assert h.headers()["reject"] == b"LG-edge-ack-mismatch"
    assert h.closed is not None and h.closed.startswith("[LG-edge-ack-mismatch]")


def test_acknowledgements_of_nothing_are_captured_without_ack_ref():
    h = client(5)
    subscribe(h, "a/b")
    route(h, qos=1)  # packet id 1 is in flight
    h.take()
    h.feed(ack(PubAck, 3) + ack(PubComp, 4) + ack(PubRec, 5, 5, 0x80))
    assert h.take() == b"" and h.closed is None
    assert [f[0] for f in h.frames()[-3:]] == [0x40, 0x70, 0x50]
    assert not any("ack_ref" in h.headers(i) for i in (-1, -2, -3))
    assert list(h.session.client.outbox.inflight) == [1]


@pytest.mark.parametrize("level, reply", [(5, b"\x62\x03\x00\x03\x92"), (4, b"\x62\x02\x00\x03")])
def test_mqtt_4_3_3_4_a_pubrec_for_nothing_still_gets_a_pubrel(level, reply):
    h = client(level)
    h.feed(ack(PubRec, 3, level))
    assert h.take() == reply


# ------------------------------------------------------------------ windows
def test_mqtt_3_3_4_9_the_clients_receive_maximum_bounds_what_is_unacknowledged():
    h = client(5, properties=Properties(receive_maximum=2))
    subscribe(h, "a/b")
    for n in range(4):
        route(h, qos=1, n=n)
    assert [p.packet_id for p in sent(h)] == [1, 2]
    h.feed(ack(PubAck, 1))  # the freed slot is used at once
    assert [p.packet_id for p in sent(h)] == [3]
    h.feed(ack(PubAck, 2) + ack(PubAck, 3))
    assert [p.packet_id for p in sent(h)] == [4]


def test_mqtt_3_3_4_9_pubrec_0x80_or_more_frees_the_window_and_gets_no_pubrel():
    h = client(5, properties=Properties(receive_maximum=1))
    subscribe(h, "a/b")
    route(h, qos=2, n=0)
    route(h, qos=2, n=1)
    assert [p.packet_id for p in sent(h)] == [1]
    h.feed(ack(PubRec, 1, 5, 0x80))
    out = sent(h)
    assert [type(p).__name__ for p in out] == ["Publish"] and out[0].packet_id == 2


def test_mqtt_3_3_4_9_pubrec_below_0x80_holds_the_slot_until_pubcomp():
    h = client(5, properties=Properties(receive_maximum=1))
    subscribe(h, "a/b")
    route(h, qos=2, n=0)
    route(h, qos=2, n=1)
    h.take()
    h.feed(ack(PubRec, 1))
    assert [type(p).__name__ for p in sent(h)] == ["PubRel"]
    h.feed(ack(PubComp, 1))
    assert [p.packet_id for p in sent(h)] == [2]


@pytest.mark.parametrize("level, props, window", [
    (4, Properties(), 3),                          # 3.x: edge.max_inflight_messages
    (5, Properties(), 3),                          # no Receive Maximum: 65,535, capped
    (5, Properties(receive_maximum=100), 3),       # capped by the edge's limit
    (5, Properties(receive_maximum=2), 2),
])
def test_mqtt_3_3_4_9_window_is_the_smaller_of_receive_maximum_and_the_edges_limit(
        level, props, window):
    h = client(level, limits=Limits(max_inflight_messages=3), properties=props)
    subscribe(h, "a/b")
    for n in range(5):
        route(h, qos=1, n=n)
    assert len(sent(h)) == window


def test_mqtt_3_1_2_25_a_publish_larger_than_the_clients_maximum_packet_size_is_not_sent():
    h = client(5, properties=Properties(maximum_packet_size=40))
    subscribe(h, "a/b")
    big = route(h, qos=1, n=0, payload=b"x" * 100)
    route(h, qos=1, n=1)
    (p,) = sent(h)
    assert p.payload == b"m1" and p.packet_id == 2
    assert h.session.client.outbox.too_large == 1 and big.frame_size(5, 1) > 40


# ------------------------------------------------------------------ what is sent
def test_mqtt_3_3_2_5_a_message_whose_expiry_passed_while_queued_is_not_sent():
    h = client(5)
    subscribe(h, "a/b")
    route(h, qos=1, n=0, ready=False, received=0.0,
          properties=Properties(message_expiry_interval=5))
    h.session.client.outbox.queue[0].msg.ready = True
    h.perform(h.session.deliver(10.0))
    assert h.take() == b"" and h.session.client.outbox.expired == 1


def test_mqtt_3_3_2_6_the_expiry_sent_is_decremented_by_the_time_waited():
    h = client(5)
    subscribe(h, "a/b")
    msg = route(h, qos=1, ready=False, received=100.0,
                properties=Properties(message_expiry_interval=60))
    msg.ready = True
    h.perform(h.session.deliver(121.5))
    (p,) = sent(h)
    assert p.properties.message_expiry_interval == 39


def test_a_message_not_yet_durable_holds_back_everything_behind_it():
    h = client(5)
    subscribe(h, "a/b")
    first = route(h, qos=1, n=0, ready=False)
    route(h, qos=0, n=1)
    route(h, qos=2, n=2)
    assert h.take() == b""
    first.ready = True
    h.perform(h.session.deliver(h.now))
    assert [p.payload for p in sent(h)] == [b"m0", b"m1", b"m2"]


def test_mqtt_3_8_3_3_no_local_through_the_session():
    h = client(5, "me")
    subscribe(h, Subscription("a/b", 1, no_local=True))
    route(h, origin="me", n=0)
    assert h.take() == b""
    route(h, origin="someone", n=1)
    assert [p.payload for p in sent(h)] == [b"m1"]


@pytest.mark.parametrize("published_retain, rap, expect", [
    (True, False, False), (True, True, True), (False, True, False)])
def test_mqtt_3_3_1_12_and_13_retain_flag_of_a_live_message(published_retain, rap, expect):
    h = client(5)
    subscribe(h, Subscription("a/b", 1, retain_as_published=rap))
    route(h, retain=published_retain)
    (p,) = sent(h)
    assert p.retain is expect


def test_shared_subscription_one_member_per_message():
    router = Router()
    store = SessionStore()
    members = [client(5, f"m{i}", router=router, store=store, conn_id=f"c{i}") for i in range(2)]
    for m in members:
        subscribe(m, Subscription("$share/g/a/#", 1))
    for n in range(4):
        route(members[0], qos=1, n=n)
        for m in members:
            m.perform(m.session.deliver(m.now))
    got = [[p.payload for p in sent(m)] for m in members]
    assert sorted(got[0] + got[1]) == [b"m0", b"m1", b"m2", b"m3"]
    assert len(got[0]) == len(got[1]) == 2


@pytest.mark.parametrize("level", [3, 4, 5])
def test_the_same_delivery_to_mqtt_3_1_3_1_1_and_5_subscribers(level):
    h = client(level)
    subscribe(h, Subscription("a/#", 1), sub_id=4 if level == 5 else None)
    props = Properties(content_type="text/plain", user_properties=[("u", "1"), ("u", "2")])
    route(h, "a/b", qos=2, retain=True, properties=props)
    out = h.take()
    if level == 5:
        assert out == (b"\x32\x27\x00\x03a/b\x00\x01\x1d\x03\x00\x0atext/plain"
                       b"\x26\x00\x01u\x00\x011\x26\x00\x01u\x00\x012\x0b\x04m0")
    else:
        assert out == b"\x32\x09\x00\x03a/b\x00\x01m0"


# ------------------------------------------------------------------ reconnection
def _persistent(level: int) -> dict:
    if level == 5:
        return {"clean_start": False,
                "properties": Properties(session_expiry_interval=3600)}
    return {"clean_start": False}


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_4_4_0_1_reconnection_re_sends_with_dup_and_pubrel_first_in_order(level):
    router = Router()
    store = SessionStore()
    h = client(level, router=router, store=store, **_persistent(level))
    subscribe(h, Subscription("a/#", 2))
    route(h, qos=1, n=0)
    route(h, qos=2, n=1)
    route(h, qos=2, n=2)
    assert [(p.packet_id, p.dup) for p in sent(h)] == [(1, False), (2, False), (3, False)]
    h.feed(ack(PubRec, 2, level))
    assert [type(p) for p in sent(h)] == [PubRel]
    # the connection ends; the server hands the session back to the store
    h.perform(h.session.connection_lost(1.0))
    store.close(h.session.client, 1.0)
    route(h, qos=1, n=3)  # queued while offline
    route(h, qos=0, n=4)  # QoS 0 is not queued for an offline session
    assert h.take() == b""
    h2 = Harness(router=router, store=store, conn_id="c2", now=2.0)
    h2.feed(connect(level, client_id="sub", **_persistent(level)))
    connack, *rest = packets(h2.take(), level)
    assert isinstance(connack, Connack)
    assert connack.session_present is (level != 3)  # MQTT 3.1's CONNACK has no such flag
    shape = [(type(p).__name__, p.packet_id, getattr(p, "dup", None), getattr(p, "payload", None))
             for p in rest]
    assert shape == [("Publish", 1, True, b"m0"), ("PubRel", 2, None, None),
                     ("Publish", 3, True, b"m2"), ("Publish", 4, False, b"m3")]
    # the flows go on where they stood
    h2.feed(ack(PubComp, 2, level) + ack(PubAck, 1, level) + ack(PubRec, 3, level))
    assert [(type(p), p.packet_id) for p in packets(h2.take(), level)] == [(PubRel, 3)]


def test_deliver_sends_nothing_before_the_connection_is_accepted_or_after_it_ended():
    h = Harness(auto_accept=False)
    h.feed(connect(5, client_id="sub"))
    assert h.session.deliver(0.0) == []
    h = client(5)
    subscribe(h, "a/b")
    h.feed(encode(Disconnect(), 5))
    route(h, qos=0)
    assert h.take() == b""
