"""Retained messages on SUBSCRIBE through the session (sans-IO): Retain
Handling, Shared Subscriptions, order after the SUBACK, Subscription
Identifiers, the Packet Identifiers a replay reserves. Test names carry the
rule ids."""

from __future__ import annotations

import pytest

from bridge.edge.journal import Replayer
from bridge.edge.message import Message
from bridge.edge.retained.store import RetainedStore
from bridge.edge.router import Router
from bridge.mqtt import (
    Properties, PubAck, Publish, Suback, Subscribe, Subscription, decode_packet, encode,
)
from tests.edge.util import Harness, connect


def store(tmp_path, topics=("r/a", "r/b"), qos=1) -> RetainedStore:
    s = RetainedStore(tmp_path / "no-table", "mqtt-frames")
    for i, t in enumerate(topics):
        s.capture(t, i, (0, i), Message(t, qos, True, b"v-" + t.encode(), origin="pub",
                                          ready=True, ref=(0, i)))
    return s


def client(tmp_path, level=5, cid="sub", router=None, **kw) -> Harness:
    router = router or Router()
    if router.retained is None:
        router.retained = store(tmp_path, **kw)
    h = Harness(router=router)
    h.feed(connect(level, client_id=cid))
    h.take()
    return h


def sub(h: Harness, *subs: Subscription, pid=1, sub_id=None) -> list:
    props = Properties(subscription_identifiers=[sub_id] if sub_id else [])
    h.feed(encode(Subscribe(pid, list(subs), props), h.session.level))
    data = h.take()
    out = []
    while data:
        p, n = decode_packet(data, h.session.level, from_client=False)
        out.append(p)
        data = data[n:]
    return out


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_3_3_1_8_retained_messages_follow_the_suback_with_retain_1(tmp_path, level):
    h = client(tmp_path, level)
    got = sub(h, Subscription("r/#", 1))
    assert isinstance(got[0], Suback)
    pubs = got[1:]
    assert sorted(p.topic for p in pubs) == ["r/a", "r/b"]
    assert all(isinstance(p, Publish) and p.retain and p.qos == 1 for p in pubs)
    assert h.headers()["retained_k"] == b"2"  # the identifiers the replay took


def test_mqtt_3_3_1_9_retain_handling_0_sends_them_on_every_subscribe(tmp_path):
    h = client(tmp_path)
    assert len(sub(h, Subscription("r/+", 0, retain_handling=0))) == 3
    assert len(sub(h, Subscription("r/+", 0, retain_handling=0), pid=2)) == 3
    assert "retained_k" not in h.headers()  # QoS 0 takes no identifier


def test_mqtt_3_3_1_10_retain_handling_1_sends_them_only_for_a_new_subscription(tmp_path):
    h = client(tmp_path)
    assert len(sub(h, Subscription("r/+", 1, retain_handling=1))) == 3
    assert len(sub(h, Subscription("r/+", 1, retain_handling=1), pid=2)) == 1  # SUBACK only


def test_mqtt_3_3_1_11_retain_handling_2_sends_none(tmp_path):
    h = client(tmp_path)
    assert [type(p) for p in sub(h, Subscription("r/+", 1, retain_handling=2))] == [Suback]


def test_lg_retained_shared_a_shared_subscription_gets_no_retained_messages(tmp_path):
    h = client(tmp_path)
    assert [type(p) for p in sub(h, Subscription("$share/g/r/+", 1))] == [Suback]


def test_mqtt_3_3_4_3_and_3_8_4_8_subscription_identifier_and_minimum_qos(tmp_path):
    h = client(tmp_path, qos=2)
    pubs = sub(h, Subscription("r/a", 1), sub_id=42)[1:]
    assert [(p.qos, p.properties.subscription_identifiers) for p in pubs] == [(1, [42])]


def test_mqtt_3_3_4_9_replay_waits_for_acknowledgements_and_live_messages_follow(tmp_path):
    h = client(tmp_path, topics=[f"r/{i}" for i in range(30)])
    pubs = sub(h, Subscription("r/#", 1))[1:]
    assert len(pubs) == 20  # edge.max_inflight_messages [MQTT-3.3.4-9]
    live = Message("r/live", 1, False, b"L", origin="pub", ready=True, ref=(1, 1))
    h.session.router.route(live)
    rest = []
    for p in pubs:
        h.feed(encode(PubAck(p.packet_id), 5))
    data = h.take()
    while data:
        p, n = decode_packet(data, 5, from_client=False)
        rest.append(p)
        data = data[n:]
    assert [p.retain for p in rest] == [True] * 10 + [False]
    assert rest[-1].topic == "r/live" and rest[-1].packet_id == 31


def test_a_replayed_subscribe_takes_the_same_identifiers(tmp_path):
    """After a crash the journal replays the SUBSCRIBE with ``retained_k``:
    the next live delivery gets the identifier it had (31 here)."""
    h = client(tmp_path, topics=[f"r/{i}" for i in range(30)])
    sub(h, Subscription("r/#", 1))
    frame, headers = h.records[-1]
    router = Router()
    s = h.session.client
    rp = Replayer(router, {"sub": s})
    router.attach(s)
    s.outbox = None
    from types import SimpleNamespace

    rp.record(SimpleNamespace(value=frame, key=b"sub", partition=0, offset=0, timestamp_us=0),
              8, dict(headers), "sub")
    assert router.outbox(s).next_k == 30


def test_lg_acl_subscribe_retained_messages_are_checked_against_the_acl_at_delivery(tmp_path):
    """A grant on ``#`` over an ACL that lets the client read only
    ``r/a``: the other topic's retained message does not go out."""
    from bridge.edge.acl import AclFile

    acl = AclFile.parse("topic read r/a\n")
    router = Router(acl=lambda: acl)
    h = client(tmp_path, router=router)
    got = sub(h, Subscription("r/#", 1))
    assert isinstance(got[0], Suback) and [p.topic for p in got[1:]] == ["r/a"]
