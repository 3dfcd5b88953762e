"""Fan-out over the subscription tree (bridge/edge/router.py): which
sessions get a message, at which QoS, with which RETAIN flag and
Subscription Identifiers. Pure memory: no socket, no loop.

Test names carry the rule id they check (OASIS MQTT 5.0 numbering)."""

from __future__ import annotations

import pytest

from bridge.edge.delivery import Receiver
from bridge.edge.message import Message
from bridge.edge.router import Router
from bridge.edge.state import ClientSession
from bridge.edge.subscription import Sub


def session(router: Router, cid: str, *, connected: bool = True,
            username: str | None = None) -> ClientSession:
    s = ClientSession(cid, persistent=True, expiry_s=3600)
    s.connected = connected
    s.username = username
    router.attach(s)
    return s


def sub(router: Router, s: ClientSession, topic_filter: str, qos: int = 2, **opts) -> Sub:
    x = Sub(s.client_id, topic_filter, qos, **opts)
    router.subscribe(s, x)
    return x


def msg(topic: str = "a/b", qos: int = 2, retain: bool = False, origin: str = "pub",
        n: int = 0) -> Message:
    return Message(topic, qos, retain, b"p%d" % n, origin=origin, ref=(0, n), ready=True)


def queued(s: ClientSession) -> list[tuple[str, int, bool, tuple[int, ...]]]:
    """(topic, qos, retain, sub_ids) of each delivery in the session's outbox."""
    if s.outbox is None:
        return []
    return [(d.msg.topic, d.qos, d.retain, d.sub_ids) for d in s.outbox.queue]


# ------------------------------------------------------------------ QoS
@pytest.mark.parametrize("published", [0, 1, 2])
@pytest.mark.parametrize("granted", [0, 1, 2])
def test_mqtt_3_8_4_8_qos_is_the_minimum_of_published_and_granted(published, granted):
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/+", granted)
    assert r.route(msg(qos=published)) == [s]
    assert queued(s) == [("a/b", min(published, granted), False, ())]


@pytest.mark.parametrize("qos_a, qos_b", [(0, 2), (2, 0), (1, 0), (0, 1), (1, 2)])
def test_mqtt_3_3_4_2_overlapping_subscriptions_one_copy_at_their_maximum_qos(qos_a, qos_b):
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/#", qos_a)
    sub(r, s, "a/b", qos_b)
    r.route(msg(qos=2))
    assert [q for _t, q, _r, _i in queued(s)] == [max(qos_a, qos_b)]


# ------------------------------------------------------------------ Subscription Identifiers
def test_mqtt_3_3_4_3_and_4_one_copy_carries_every_matching_subscriptions_identifier():
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/#", 1, sub_id=7)
    sub(r, s, "+/b", 0)               # no identifier: contributes none
    sub(r, s, "a/b", 0, sub_id=300)
    sub(r, s, "x/#", 2, sub_id=9)     # does not match
    r.route(msg())
    ((topic, qos, _retain, ids),) = queued(s)
    assert topic == "a/b" and qos == 1 and sorted(ids) == [7, 300]


def test_mqtt_3_3_4_3_a_single_subscription_with_an_identifier():
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/b", 1, sub_id=1)
    r.route(msg())
    assert queued(s) == [("a/b", 1, False, (1,))]


# ------------------------------------------------------------------ RETAIN
@pytest.mark.parametrize("published_retain", [False, True])
def test_mqtt_3_3_1_12_retain_is_0_on_a_live_message_without_retain_as_published(
        published_retain):
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/b", 1)
    r.route(msg(retain=published_retain))
    assert queued(s)[0][2] is False


@pytest.mark.parametrize("published_retain", [False, True])
def test_mqtt_3_3_1_13_retain_as_published_keeps_the_publishers_flag(published_retain):
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/b", 1, retain_as_published=True)
    r.route(msg(retain=published_retain))
    assert queued(s)[0][2] is published_retain


@pytest.mark.parametrize("rap_on", ["a/#", "a/b"])
def test_mqtt_3_3_1_13_retain_as_published_on_one_of_overlapping_subscriptions(rap_on):
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/#", 1, retain_as_published=rap_on == "a/#")
    sub(r, s, "a/b", 0, retain_as_published=rap_on == "a/b")
    r.route(msg(retain=True))
    assert [(q, ret) for _t, q, ret, _i in queued(s)] == [(1, True)]


# ------------------------------------------------------------------ topic
def test_mqtt_3_3_2_3_the_delivered_topic_is_the_published_one_matching_the_filter():
    r = Router()
    s = session(r, "c")
    sub(r, s, "site/+/temp/#", 0)
    r.route(msg("site/7/temp/inside"))
    r.route(msg("site/7/humidity"))
    r.route(msg("site/7/temp"))  # '#' also matches the parent level
    assert [t for t, *_ in queued(s)] == ["site/7/temp/inside", "site/7/temp"]


# ------------------------------------------------------------------ No Local
def test_mqtt_3_8_3_3_no_local_does_not_forward_to_the_publishing_client_id():
    r = Router()
    me = session(r, "me")
    other = session(r, "other")
    sub(r, me, "a/b", 1, no_local=True)
    sub(r, other, "a/b", 1, no_local=True)
    assert r.route(msg(origin="me")) == [other]
    assert queued(me) == [] and len(queued(other)) == 1
    assert r.route(msg(origin="other")) == [me]


def test_mqtt_3_8_3_3_no_local_leaves_the_overlapping_subscription_without_it():
    r = Router()
    me = session(r, "me")
    sub(r, me, "a/#", 2, no_local=True, sub_id=1)
    sub(r, me, "a/b", 1, sub_id=2)
    r.route(msg(origin="me"))
    assert queued(me) == [("a/b", 1, False, (2,))]


# ------------------------------------------------------------------ shared subscriptions
def test_shared_subscription_each_message_goes_to_one_member_in_turn():
    r = Router()
    members = [session(r, f"m{i}") for i in range(3)]
    for m in members:
        sub(r, m, "$share/g/a/+", 1)
    for n in range(6):
        assert len(r.route(msg(n=n))) == 1
    assert [len(queued(m)) for m in members] == [2, 2, 2]
    got = sorted(d.msg.ref[1] for m in members for d in m.outbox.queue)
    assert got == list(range(6))


def test_shared_subscription_prefers_connected_members():
    r = Router()
    up = session(r, "up")
    down = session(r, "down", connected=False)
    sub(r, down, "$share/g/a/b", 1)
    sub(r, up, "$share/g/a/b", 1)
    for n in range(4):
        r.route(msg(n=n), connected=lambda cid: cid == "up")
    assert (len(queued(up)), len(queued(down))) == (4, 0)


def test_shared_subscription_qos_retain_and_identifier_are_the_members():
    r = Router()
    s = session(r, "c")
    sub(r, s, "$share/g/a/b", 1, retain_as_published=True, sub_id=5)
    r.route(msg(qos=2, retain=True))
    assert queued(s) == [("a/b", 1, True, (5,))]


@pytest.mark.parametrize("rap", [False, True])
def test_mqtt_3_3_1_12_and_13_retain_on_a_shared_subscription(rap):
    r = Router()
    s = session(r, "c")
    sub(r, s, "$share/g/a/b", 1, retain_as_published=rap)
    r.route(msg(retain=True))
    assert queued(s)[0][2] is rap


def test_two_groups_and_a_direct_subscription_each_get_their_copy():
    r = Router()
    s = session(r, "c")
    sub(r, s, "$share/g1/a/b", 1, sub_id=1)
    sub(r, s, "$share/g2/a/#", 1, sub_id=2)
    sub(r, s, "a/b", 1, sub_id=3)
    assert r.route(msg()) == [s]  # the session once in the result
    assert sorted(ids for *_x, ids in queued(s)) == [(1,), (2,), (3,)]


# ------------------------------------------------------------------ disconnected sessions
def test_a_disconnected_persistent_session_queues_qos_1_and_2_not_qos_0():
    r = Router()
    s = session(r, "c", connected=False)
    sub(r, s, "a/b", 2)
    assert r.route(msg(qos=0, n=0)) == []
    r.route(msg(qos=1, n=1))
    r.route(msg(qos=2, n=2))
    assert [q for _t, q, _r, _i in queued(s)] == [1, 2]


def test_a_qos_0_subscription_of_a_disconnected_session_queues_nothing():
    r = Router()
    s = session(r, "c", connected=False)
    sub(r, s, "a/b", 0)
    assert r.route(msg(qos=2)) == [] and queued(s) == []


# ------------------------------------------------------------------ ACL at delivery
class _Acl:
    def __init__(self, readable: set[str]) -> None:
        self.readable = readable

    def can_read(self, username, client_id, topic) -> bool:
        return username in self.readable


def test_a_session_whose_user_may_not_read_the_topic_is_skipped():
    acl = _Acl({"alice"})
    r = Router(acl=lambda: acl)
    a = session(r, "a", username="alice")
    b = session(r, "b", username="bob")
    sub(r, a, "a/#", 1)
    sub(r, b, "a/#", 1)
    assert r.route(msg()) == [a]
    acl.readable.add("bob")  # a changed ACL applies to existing subscriptions
    assert r.route(msg()) == [a, b]


# ------------------------------------------------------------------ bounds, drop
def test_the_queue_bound_drops_are_counted_per_client():
    r = Router(max_queued_messages=2)
    s = session(r, "c")
    sub(r, s, "a/b", 1)
    for n in range(5):
        r.route(msg(n=n))
    assert r.dropped == {"c": 3}
    assert [d.msg.ref[1] for d in s.outbox.queue] == [3, 4]


def test_drop_forgets_the_sessions_subscriptions_and_queue():
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/b", 1)
    sub(r, s, "a/#", 1)
    r.route(msg())
    gone = r.drop("c")
    assert sorted(x.topic_filter for x in gone) == ["a/#", "a/b"]
    assert r.count("c") == 0 and len(s.outbox) == 0 and "c" not in r.sessions
    assert r.route(msg()) == []


def test_a_routed_message_reaches_the_subscriber_as_a_publish_frame():
    r = Router()
    s = session(r, "c")
    sub(r, s, "a/#", 1, sub_id=4)
    r.route(Message("a/b", 2, True, b"body", origin="p", ready=True))
    (frame,) = s.outbox.pump(Receiver(5, 10), 0.0)
    assert frame == b"\x32\x0e\x00\x03a/b\x00\x01\x02\x0b\x04body"


def test_a_session_in_one_nodes_subscriptions_and_in_a_shared_group_is_returned_once():
    """The fast path (every match at one node) and a Shared Subscription
    group: the session gets both deliveries and appears once among the
    sessions to pump."""
    r = Router()
    a, b = session(r, "a"), session(r, "b")
    sub(r, a, "a/+", 1)
    sub(r, b, "a/+", 1)
    sub(r, a, "$share/g/a/b", 1)
    got = r.route(msg(qos=1))
    assert sorted(s.client_id for s in got) == ["a", "b"] and len(got) == 2
    assert len(queued(a)) == 2 and len(queued(b)) == 1
