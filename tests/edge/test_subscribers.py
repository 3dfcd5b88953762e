"""Real subscribers against a running edge (issue 22, item 6, second bullet):
paho-mqtt at MQTT 3.1, 3.1.1 and 5 and mosquitto_sub / mosquitto_pub, as
subscribers and publishers, against an in-process edge (tests/edge/conftest.py).

What a subscriber gets, each rule by its id: the delivered QoS is the lower
of the published and granted QoS [MQTT-3.8.4-8]; ``+`` and ``#`` match, and
do not match ``$`` topics as a first level [MQTT-4.7.2-1]; a Shared
Subscription gives each message to one member (MQTT 5.0 section 4.8.2);
No Local [MQTT-3.8.3-3]; Retain As Published [MQTT-3.3.1-12, -13] and RETAIN
0 on live messages otherwise [MQTT-3.3.1-9]; Subscription Identifiers
[MQTT-3.3.4-3]; Message Expiry [MQTT-3.3.2-5, -6]; User Properties in order
[MQTT-3.3.2-17, -18]; one publisher's messages in order [MQTT-4.6.0-6]; an
offline persistent session gets what was queued.

Persistent sessions across restarts: an in-process edge stopped and started
on the same data directory, and ``lakegate edge`` subprocesses stopped with
SIGTERM or SIGKILL (marked ``subprocess``) while a subscriber holds
unacknowledged deliveries: nothing acknowledged to the publisher is lost,
PUBRELs and unacknowledged PUBLISHes come again with DUP 1 and their Packet
Identifiers [MQTT-4.4.0-1, MQTT-3.3.1-1].

paho hands a QoS 2 message to the application at PUBREL, possibly after
later QoS 0/1 ones: order is checked on the wire (raw subscribers) or per
QoS, never across QoS 2 and the rest through paho.

Bad input and limits (issue 22): invalid Topic Filters close the connection
as ``bridge/mqtt/subscribe.py`` decides, the subscription quota refuses one
filter and keeps the client, a subscriber that does not read its socket and
one that does not acknowledge leave every other client served with memory
bounded.

Absence is proved with a sentinel: messages from one publisher reach one
session in order [MQTT-4.6.0-6], so once the message published last has
arrived, anything published before it that was due has arrived too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import NamedTuple

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from bridge.config import load_config
from bridge.mqtt import Properties, Publish, Subscribe, Subscription, Will, encode
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.strings import encode_string
from bridge.mqtt.varint import encode_varint
from bridge.mqtt.rules import RULES
from tests.edge.conftest import RawClient, wait_for, wait_records
from tests.edge.util import headers_of, read_log

#: every test that starts an edge runs on both capture logs, and on two edges of a cluster whose
#: connections alternate between them (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka", "cluster")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTOCOLS = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}
LEVELS = [3, 4, 5]
DEADLINE = 10.0


class Got(NamedTuple):
    """One PUBLISH as a paho subscriber received it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    props: object


class Client:
    """A paho client (connected, its network loop in a thread) that records
    every message it receives. 3.x: ``clean`` is Clean Session; 5: Clean
    Start, with ``expiry`` as Session Expiry Interval and ``connect_props``
    further CONNECT properties by paho name."""

    def __init__(self, port: int, level: int, client_id: str, *, clean: bool = True,
                 expiry: int | None = None, connect_props: dict | None = None) -> None:
        self.level = level
        self.client_id = client_id
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=PROTOCOLS[level],
                             clean_session=None if level == 5 else clean)
        self.c.max_inflight_messages_set(0)  # no client-side window: publish order = wire order
        self.got: list[Got] = []
        self.subacks: dict[int, list[int]] = {}
        self.connack = None
        self._lock = threading.Lock()
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        props = None
        if level == 5 and (expiry is not None or connect_props):
            props = PahoProperties(PacketTypes.CONNECT)
            if expiry is not None:
                props.SessionExpiryInterval = expiry
            for k, v in (connect_props or {}).items():
                setattr(props, k, v)
        kw = {"clean_start": clean, "properties": props} if level == 5 else {}
        self.c.connect("127.0.0.1", port, keepalive=30, **kw)
        self.c.loop_start()
        wait_for(lambda: self.connack is not None, DEADLINE, f"CONNACK for {client_id}")

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connack = (flags.session_present, reason_code.value)

    def _on_message(self, client, userdata, m) -> None:
        with self._lock:
            self.got.append(Got(m.topic, m.payload, m.qos, bool(m.retain), bool(m.dup),
                                getattr(m, "properties", None)))

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self.subacks[mid] = [rc.value for rc in reason_codes]

    def subscribe(self, *subs, sub_id: int | None = None) -> list[int]:
        """SUBSCRIBE ``(filter, qos)`` or ``(filter, SubscribeOptions)`` pairs;
        returns the SUBACK's codes."""
        props = None
        if sub_id is not None:
            props = PahoProperties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        rc, mid = self.c.subscribe(list(subs), properties=props)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return wait_for(lambda: self.subacks.get(mid), DEADLINE, f"SUBACK for {self.client_id}")

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                props: PahoProperties | None = None) -> mqtt.MQTTMessageInfo:
        return self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)

    def publish_all(self, items) -> None:
        """Publish ``(topic, payload, qos)`` items; wait until each is acknowledged."""
        infos = [self.publish(t, p, q) for t, p, q in items]
        for info in infos:
            info.wait_for_publish(DEADLINE)
            assert info.is_published()

    def messages(self) -> list[Got]:
        with self._lock:
            return list(self.got)

    def wait_for_payload(self, payload: bytes, what: str = "") -> list[Got]:
        """Wait until ``payload`` arrived; return everything received so far."""
        return wait_for(lambda: (lambda g: g if any(m.payload == payload for m in g) else None)(
            self.messages()), DEADLINE, what or f"{payload!r} at {self.client_id}")

    def wait_count(self, n: int, what: str = "") -> list[Got]:
        return wait_for(lambda: (lambda g: g if len(g) >= n else None)(self.messages()),
                        DEADLINE, what or f"{n} messages at {self.client_id}")

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
        # paho keeps its wake-up socket pair (two loopback TCP sockets) until
        # the client is collected; a module's hundreds of clients must not
        # pile them up toward select()'s 1,024 descriptors
        self.c._reset_sockets()


@pytest.fixture
def clients(edge):
    """A function: (level, client_id, **kw) -> a connected :class:`Client` on ``edge``."""
    made: list[Client] = []

    def make(level: int, client_id: str, port: int | None = None, **kw) -> Client:
        c = Client(port or edge.port, level, client_id, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _props(**values) -> PahoProperties:
    p = PahoProperties(PacketTypes.PUBLISH)
    for k, v in values.items():
        setattr(p, k, v)
    return p


def _payloads(got) -> list[bytes]:
    return [m.payload for m in got]


# ---------------------------------------------------------------- QoS
@pytest.mark.parametrize("pub_level", LEVELS)
@pytest.mark.parametrize("sub_level", LEVELS)
def test_mqtt_3_8_4_8_delivered_qos_is_min_of_published_and_granted(clients, sub_level, pub_level):
    sub = clients(sub_level, f"qs-{sub_level}-{pub_level}")
    assert sub.subscribe(("q/g0/#", 0), ("q/g1/#", 1), ("q/g2/#", 2)) == [0, 1, 2]
    pub = clients(pub_level, f"qp-{sub_level}-{pub_level}")
    items = [(f"q/g{g}/p{p}", f"{g}{p}".encode(), p) for g in range(3) for p in range(3)]
    pub.publish_all(items)
    got = sub.wait_count(9)
    assert sorted((m.topic, m.qos) for m in got) == sorted(
        (f"q/g{g}/p{p}", min(g, p)) for g in range(3) for p in range(3))
    assert not any(m.retain or m.dup for m in got)  # [MQTT-3.3.1-9], [MQTT-3.3.1-3]
    assert len(got) == 9


# ---------------------------------------------------------------- wildcards
@pytest.mark.parametrize("level", LEVELS)
def test_mqtt_4_7_2_1_wildcards_and_dollar_topics(clients, level):
    filters = {"hash": "#", "plus": "+/x", "plus2": "+/+", "hashtail": "+/#",
               "dollar": "$foo/#", "dollarplus": "$foo/+", "exact": "a/x", "deep": "a/#"}
    subs = {}
    for name, tf in filters.items():
        subs[name] = clients(level, f"w{level}-{name}")
        assert subs[name].subscribe((tf, 1), ("zz/end", 1)) == [1, 1]
    pub = clients(level, f"w{level}-pub")
    topics = ["$foo/x", "$SYS/x", "a/x", "a", "b/x", "a/b/c", "zz/end"]
    pub.publish_all([(t, t.encode(), 1) for t in topics])
    expect = {
        "hash": ["a/x", "a", "b/x", "a/b/c"],
        "plus": ["a/x", "b/x"],
        "plus2": ["a/x", "b/x"],
        "hashtail": ["a/x", "a", "b/x", "a/b/c"],  # '#' matches its parent level too
        "dollar": ["$foo/x"],
        "dollarplus": ["$foo/x"],
        "exact": ["a/x"],
        "deep": ["a/x", "a", "a/b/c"],
    }
    for name, want in expect.items():
        got = subs[name].wait_for_payload(b"zz/end")  # the sentinel, once (overlap: one copy)
        assert [m.topic for m in got] == want + ["zz/end"], name


# ---------------------------------------------------------------- shared
def test_shared_subscription_each_message_to_exactly_one_member(clients):
    a = clients(5, "share-a")
    b = clients(5, "share-b")
    for c in (a, b):
        assert c.subscribe(("$share/g/sh/+", SubscribeOptions(qos=1)), ("sh-end", 1)) == [1, 1]
    time.sleep(0.5)  # (a cluster's edges learn of each other's members from their beats, within 0.1 s)
    pub = clients(4, "share-pub")
    n = 40
    pub.publish_all([(f"sh/{i % 3}", str(i).encode(), 1) for i in range(n)]
                    + [("sh-end", b"end", 1)])
    for c in (a, b):
        c.wait_for_payload(b"end")
    ga = [m.payload for m in a.messages() if m.topic != "sh-end"]
    gb = [m.payload for m in b.messages() if m.topic != "sh-end"]
    assert len(ga) + len(gb) == n
    assert set(ga).isdisjoint(gb)
    assert set(ga) | set(gb) == {str(i).encode() for i in range(n)}
    assert ga and gb  # both members get some
    # each member sees its share in the order published [MQTT-4.6.0-6 per session]
    assert [int(p) for p in ga] == sorted(int(p) for p in ga)


def test_shared_subscription_with_one_member_gone_delivers_to_the_other(clients):
    a = clients(5, "share2-a")
    b = clients(5, "share2-b")
    for c in (a, b):
        assert c.subscribe(("$share/h/s2/#", 1)) == [1]
    b.close()  # a clean session: its subscription ends with it
    pub = clients(5, "share2-pub")
    pub.publish_all([("s2/x", str(i).encode(), 1) for i in range(10)])
    got = a.wait_count(10)
    assert _payloads(got) == [str(i).encode() for i in range(10)]


# ---------------------------------------------------------------- MQTT 5 options
def test_mqtt_3_8_3_3_no_local(clients):
    me = clients(5, "nl-me")
    assert me.subscribe(("nl/#", SubscribeOptions(qos=1, noLocal=True))) == [1]
    control = clients(5, "nl-control")
    assert control.subscribe(("nl/#", 1)) == [1]
    other = clients(5, "nl-other")
    me.publish_all([("nl/a", b"mine", 1)])
    other.publish_all([("nl/a", b"theirs", 1)])
    control.wait_count(2)
    assert _payloads(control.messages()) == [b"mine", b"theirs"]
    assert _payloads(me.wait_for_payload(b"theirs")) == [b"theirs"]


@pytest.mark.parametrize("sub_level", LEVELS)
def test_mqtt_3_3_1_12_and_13_retain_as_published(clients, sub_level):
    plain = clients(sub_level, f"rap-plain-{sub_level}")
    assert plain.subscribe(("rap/#", 1)) == [1]
    rap = clients(5, f"rap-keep-{sub_level}")
    assert rap.subscribe(("rap/#", SubscribeOptions(qos=1, retainAsPublished=True))) == [1]
    pub = clients(4, f"rap-pub-{sub_level}")
    infos = [pub.publish("rap/a", b"retained", 1, retain=True),
             pub.publish("rap/a", b"plain", 1, retain=False)]
    for info in infos:
        info.wait_for_publish(DEADLINE)
    kept = rap.wait_count(2)
    assert [(m.payload, m.retain) for m in kept] == [(b"retained", True), (b"plain", False)]
    live = plain.wait_count(2)
    # a live message goes out with RETAIN 0 [MQTT-3.3.1-9 (3.1.1), MQTT-3.3.1-12]
    assert [(m.payload, m.retain) for m in live] == [(b"retained", False), (b"plain", False)]


def test_mqtt_3_3_4_3_subscription_identifiers(clients):
    sub = clients(5, "sid")
    assert sub.subscribe(("si/#", 0), sub_id=7) == [0]
    assert sub.subscribe(("si/+/x", 2), sub_id=9) == [2]
    assert sub.subscribe(("si-end", 1)) == [1]
    pub = clients(5, "sid-pub")
    pub.publish_all([("si/a/x", b"both", 2), ("si/b", b"seven", 1), ("si-end", b"end", 1)])
    # (paho hands a QoS 2 message over at PUBREL, possibly after later ones)
    got = wait_for(lambda: (lambda g: g if {b"both", b"end"} <= set(_payloads(g)) else None)(
        sub.messages()), DEADLINE, "both and end")
    by = {m.payload: m for m in got}
    # overlapping subscriptions: one copy, at the maximum granted QoS of the
    # matches [MQTT-3.3.4-2], with every identifier [MQTT-3.3.4-3]
    assert sorted(_payloads(got)) == [b"both", b"end", b"seven"]
    assert by[b"both"].qos == 2
    assert sorted(by[b"both"].props.SubscriptionIdentifier) == [7, 9]
    assert (by[b"seven"].props.SubscriptionIdentifier, by[b"seven"].qos) == ([7], 0)
    assert not hasattr(by[b"end"].props, "SubscriptionIdentifier")


def test_mqtt_3_3_2_17_and_18_user_properties_forwarded_in_order(clients):
    v5 = clients(5, "up-5")
    v4 = clients(4, "up-4")
    for c in (v5, v4):
        assert c.subscribe(("up/#", 1)) == [1]
    pub = clients(5, "up-pub")
    user = [("z", "1"), ("a", "2"), ("z", "3"), ("m", ""), ("a", "2")]
    props = _props(UserProperty=user, ContentType="text/plain", ResponseTopic="up/reply",
                   CorrelationData=b"\x00\x01corr", PayloadFormatIndicator=1)
    info = pub.publish("up/x", b"payload", 1, props=props)
    info.wait_for_publish(DEADLINE)
    m = v5.wait_count(1)[0]
    assert m.props.UserProperty == user
    assert (m.props.ContentType, m.props.ResponseTopic, m.props.CorrelationData,
            m.props.PayloadFormatIndicator) == ("text/plain", "up/reply", b"\x00\x01corr", 1)
    m4 = v4.wait_count(1)[0]  # 3.1.1 has no properties; the message itself arrives
    assert (m4.topic, m4.payload, m4.qos) == ("up/x", b"payload", 1)


@pytest.mark.parametrize("sub_level, pub_level", [(5, 3), (5, 4), (3, 5), (4, 5)])
def test_mixed_versions(clients, sub_level, pub_level):
    sub = clients(sub_level, f"mix-s{sub_level}-{pub_level}")
    assert sub.subscribe(("mix/#", 2)) == [2]
    pub = clients(pub_level, f"mix-p{sub_level}-{pub_level}")
    props = _props(UserProperty=[("k", "v")], MessageExpiryInterval=60) if pub_level == 5 else None
    infos = [pub.publish(f"mix/{q}", bytes(range(256)) * q + b"end", q, props=props)
             for q in range(3)]
    for info in infos:
        info.wait_for_publish(DEADLINE)
    got = sub.wait_count(3)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        (f"mix/{q}", bytes(range(256)) * q + b"end", q) for q in range(3)]


def test_mqtt_3_11_3_1_unsubscribe_ends_delivery(clients):
    sub = clients(5, "unsub")
    assert sub.subscribe(("us/a", 1), ("us/b", 1)) == [1, 1]
    codes = {}
    sub.c.on_unsubscribe = lambda client, userdata, mid, rcs, props: codes.update(
        {mid: [rc.value for rc in rcs]})
    _rc, mid = sub.c.unsubscribe(["us/a", "us/never"])
    assert wait_for(lambda: codes.get(mid), DEADLINE, "UNSUBACK") == [0x00, 0x11]
    pub = clients(4, "unsub-pub")
    pub.publish_all([("us/a", b"gone", 1), ("us/b", b"kept", 1)])
    assert _payloads(sub.wait_for_payload(b"kept")) == [b"kept"]


def test_inbound_topic_alias_is_resolved_not_forwarded(clients):
    sub = clients(5, "alias-sub")
    assert sub.subscribe(("al/#", 1)) == [1]
    pub = clients(5, "alias-pub")
    infos = [pub.publish("al/very/long/name" if i == 0 else "", str(i).encode(), 1,
                         props=_props(TopicAlias=2)) for i in range(3)]
    for info in infos:
        info.wait_for_publish(DEADLINE)
    got = sub.wait_count(3)
    assert [(m.topic, m.payload) for m in got] == [("al/very/long/name", str(i).encode())
                                                   for i in range(3)]
    assert not any(hasattr(m.props, "TopicAlias") for m in got)


def test_mqtt_3_1_2_25_message_over_the_clients_maximum_packet_size_not_sent(clients):
    sub = clients(5, "maxp", connect_props={"MaximumPacketSize": 200})
    assert sub.subscribe(("mp/#", 1)) == [1]
    pub = clients(4, "maxp-pub")
    pub.publish_all([("mp/x", b"a" * 300, 1), ("mp/x", b"small", 1), ("mp/x", b"b" * 150, 0),
                     ("mp/x", b"end", 1)])
    assert _payloads(sub.wait_for_payload(b"end")) == [b"small", b"b" * 150, b"end"]


@pytest.mark.parametrize("level", [4, 5])
def test_will_is_delivered_to_subscribers(edge, raw, clients, level):
    sub = clients(5, f"will-sub-{level}")
    assert sub.subscribe(("will/#", 2)) == [2]
    wprops = Properties(user_properties=[("w", "1"), ("a", "2")], content_type="text/plain",
                        message_expiry_interval=60) if level == 5 else Properties()
    c = raw()
    assert c.connect(level, client_id=f"will-{level}",
                     will=Will("will/x", b"gone", 1, False, wprops))[0] == 0x20
    c.close()  # no DISCONNECT: the Will is published
    m = sub.wait_count(1)[0]
    assert (m.topic, m.payload, m.qos, m.retain) == ("will/x", b"gone", 1, False)
    if level == 5:
        assert m.props.UserProperty == [("w", "1"), ("a", "2")]
        assert m.props.ContentType == "text/plain"
        assert 55 <= m.props.MessageExpiryInterval <= 60


def test_shared_subscription_prefers_the_connected_member(clients):
    away = clients(5, "sh3-away", expiry=300)
    here = clients(5, "sh3-here")
    for c in (away, here):
        assert c.subscribe(("$share/k/s3/#", 1)) == [1]
    away.close()  # persistent: still a member, disconnected
    time.sleep(0.5)  # (a cluster's edges learn that from each other's beats, within 0.1 s)
    pub = clients(5, "sh3-pub")
    pub.publish_all([("s3/x", str(i).encode(), 1) for i in range(10)])
    assert _payloads(here.wait_count(10)) == [str(i).encode() for i in range(10)]
    back = clients(5, "sh3-away", clean=False, expiry=300)
    assert back.connack[0] is True
    assert back.subscribe(("sh3-end", 1)) == [1]
    pub.publish_all([("sh3-end", b"end", 1)])
    assert _payloads(back.wait_for_payload(b"end")) == [b"end"]  # nothing was queued for it


def test_mqtt_3_1_2_4_clean_session_reconnect_has_no_subscriptions(clients):
    first = clients(4, "clean-sub", clean=True)
    assert first.subscribe(("cs/#", 1)) == [1]
    first.close()
    again = clients(4, "clean-sub", clean=True)
    assert again.connack[0] is False
    assert again.subscribe(("cs-end", 1)) == [1]
    pub = clients(4, "clean-pub")
    pub.publish_all([("cs/x", b"old subscription", 1), ("cs-end", b"end", 1)])
    assert _payloads(again.wait_for_payload(b"end")) == [b"end"]


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_4_4_0_1_session_taken_over_gets_the_inflight_deliveries_again(
        edge, raw, clients, level):
    cid = f"takeover-{level}"
    first = raw()
    assert _session_connect(first, level, cid)[0] == 0x20
    first.send_packet(Subscribe(1, [Subscription("to/#", 1)]), level)
    assert first.packet()[0] == 0x90
    pub = clients(4, f"takeover-pub-{level}")
    pub.publish_all([("to/x", str(i).encode(), 1) for i in range(3)])
    sent = [_server_publish(first, level) for _ in range(3)]
    second = raw()  # the same Client Identifier while the first is connected
    assert _session_connect(second, level, cid)[2] == 1
    again = [_server_publish(second, level) for _ in range(3)]
    assert [(p.payload, p.packet_id, p.dup) for p in again] == [
        (p.payload, p.packet_id, True) for p in sent]
    if level == 5:
        assert first.packet() == b"\xe0\x01\x8e"  # Session taken over
    assert first.closed()
    second.send(b"".join(b"\x40\x02" + p.packet_id.to_bytes(2, "big") for p in again))
    pub.publish_all([("to/x", b"next", 1)])
    assert _server_publish(second, level).payload == b"next"


# ---------------------------------------------------------------- expiry
def test_mqtt_3_3_2_5_and_6_message_expiry_for_offline_persistent_session(edge, clients):
    v5 = clients(5, "exp-5", clean=True, expiry=300)
    v4 = clients(4, "exp-4", clean=False)
    for c in (v5, v4):
        assert c.subscribe(("exp/#", 1)) == [1]
        c.close()
    pub = clients(5, "exp-pub")
    for info in [pub.publish("exp/short", b"short", 1, props=_props(MessageExpiryInterval=1)),
                 pub.publish("exp/long", b"long", 1, props=_props(MessageExpiryInterval=60)),
                 pub.publish("exp/none", b"none", 1)]:
        info.wait_for_publish(DEADLINE)
    published = time.monotonic()
    time.sleep(2.2)  # the subject of the test: "short" expires while they are offline
    back5 = clients(5, "exp-5", clean=False, expiry=300)
    back4 = clients(4, "exp-4", clean=False)
    waited = time.monotonic() - published
    assert back5.connack[0] and back4.connack[0]  # session present
    for c in (back5, back4):
        got = c.wait_for_payload(b"none")
        assert _payloads(got) == [b"long", b"none"], c.client_id  # [MQTT-3.3.2-5]
    long5, none5 = back5.messages()
    left = long5.props.MessageExpiryInterval  # decremented [MQTT-3.3.2-6]
    assert 60 - int(waited) - 1 <= left <= 58
    assert not hasattr(none5.props, "MessageExpiryInterval")


# ---------------------------------------------------------------- order
def _take_publishes(c: RawClient, level: int, n: int | None = None,
                    last: bytes | None = None) -> list[Publish]:
    """Read ``n`` PUBLISH packets (or up to the one with payload ``last``) on
    a raw subscriber, acknowledging each as it arrives (PUBACK; PUBREC, then
    PUBCOMP for the PUBREL), in wire order."""
    out: list[Publish] = []
    deadline = time.monotonic() + DEADLINE
    while len(out) < n if n is not None else not out or out[-1].payload != last:
        assert time.monotonic() < deadline, f"{len(out)} of {n or last} PUBLISH packets"
        pkt = c.packet()
        assert pkt, f"connection closed after {len(out)} of {n} PUBLISH packets"
        kind = pkt[0] >> 4
        if kind == 3:
            p = decode_packet(pkt, level, from_client=False)[0]
            out.append(p)
            if p.qos == 1:
                c.send(b"\x40\x02" + p.packet_id.to_bytes(2, "big"))
            elif p.qos == 2:
                c.send(b"\x50\x02" + p.packet_id.to_bytes(2, "big"))
        elif kind == 6:
            c.send(b"\x70\x02" + pkt[2:4])
        else:
            raise AssertionError(f"unexpected packet {pkt[:8].hex()}")
    return out


@pytest.mark.parametrize("sub_level", [4, 5])
def test_mqtt_4_6_0_6_200_mixed_qos_messages_arrive_in_order(edge, raw, clients, sub_level):
    """Wire order at a raw QoS 2 subscriber (paho hands a QoS 2 message to
    the application only at PUBREL, after later QoS 0/1 ones)."""
    sub = raw()
    assert sub.connect(sub_level, client_id=f"ord-s{sub_level}")[0] == 0x20
    sub.send_packet(Subscribe(1, [Subscription("ord/#", 2)]), sub_level)
    assert sub.packet()[0] == 0x90
    pub = clients(4, f"ord-p{sub_level}")
    n = 200
    pub.publish_all([(f"ord/{i % 5}", str(i).encode(), i % 3) for i in range(n)])
    got = _take_publishes(sub, sub_level, n)
    assert [int(m.payload) for m in got] == list(range(n))
    assert [m.qos for m in got] == [i % 3 for i in range(n)]
    assert not any(m.dup for m in got)


@pytest.mark.parametrize("bound", ["edge.max_queued_messages=4", "edge.max_queued_bytes=4096"])
def test_offline_queue_bound_drops_the_oldest_and_says_so(run_edge, monkeypatch, caplog, bound):
    """MQTT 5.0 section 4.1: a server may limit the Session State it keeps;
    the edge keeps the newest, drops the oldest, and logs the count once."""
    monkeypatch.setattr("bridge.edge.housekeeping.SNAPSHOT_INTERVAL_S", 0.2)
    caplog.set_level(logging.INFO, logger="bridge.edge")
    edge = run_edge(bound)
    sub = Client(edge.port, 4, "bounded", clean=False)
    assert sub.subscribe(("bq/#", 1)) == [1]
    sub.close()
    pub = Client(edge.port, 4, "bounded-pub")
    try:
        pub.publish_all([("bq/x", b"%04d" % i + b"." * 1020, 1) for i in range(10)])
    finally:
        pub.close()
    line = wait_for(lambda: [r.getMessage() for r in caplog.records
                             if "client=bounded:" in r.getMessage()
                             and "queued messages dropped" in r.getMessage()],
                    DEADLINE, "the drop line")
    assert len(line) == 1 and "6 queued messages dropped" in line[0]
    back = Client(edge.port, 4, "bounded", clean=False)
    try:
        assert back.connack[0] is True
        got = back.wait_count(4)
        assert [m.payload[:4] for m in got] == [b"0006", b"0007", b"0008", b"0009"]
    finally:
        back.close()


def test_qos2_publish_resent_by_its_publisher_is_delivered_once_MQTT_4_3_3_10(edge, raw, clients):
    sub = clients(5, "once-sub")  # QoS 1: paho hands messages over in wire order
    assert sub.subscribe(("once/#", 1), ("once-end", 1)) == [1, 1]
    pub = raw()
    assert pub.connect(4, client_id="once-pub", clean_start=False)[0] == 0x20
    frame = encode(Publish(qos=2, topic="once/x", packet_id=7, payload=b"exactly once"), 4)
    pub.send(frame)
    assert pub.packet() == b"\x50\x02\x00\x07"
    pub.send(bytes((frame[0] | 8,)) + frame[1:])  # the same, DUP 1, before PUBREL
    assert pub.packet() == b"\x50\x02\x00\x07"
    pub.send(b"\x62\x02\x00\x07")
    assert pub.packet() == b"\x70\x02\x00\x07"
    pub.send(encode(Publish(qos=1, topic="once-end", packet_id=8, payload=b"end"), 4))
    assert pub.packet() == b"\x40\x02\x00\x08"
    assert _payloads(sub.wait_for_payload(b"end")) == [b"exactly once", b"end"]


@pytest.mark.parametrize("first, then", [(4, 5), (5, 4)])
def test_persistent_session_resumed_at_another_protocol_level(clients, first, then):
    """The queued messages are encoded for the connection that takes them:
    MQTT 5 properties for a 5 subscriber, none for 3.1.1."""
    sub = clients(first, f"lvl-{first}", clean=False, expiry=300)
    assert sub.subscribe(("lvl/#", 1)) == [1]
    sub.close()
    pub = clients(5, f"lvl-pub-{first}")
    info = pub.publish("lvl/x", b"queued", 1, props=_props(UserProperty=[("k", "v")]))
    info.wait_for_publish(DEADLINE)
    back = clients(then, f"lvl-{first}", clean=False, expiry=300)
    assert back.connack[0] is True
    m = back.wait_count(1)[0]
    assert (m.topic, m.payload, m.qos) == ("lvl/x", b"queued", 1)
    if then == 5:
        assert m.props.UserProperty == [("k", "v")]


def test_mqtt_3_1_2_4_clean_start_discards_the_queued_session(clients):
    sub = clients(5, "cs5", clean=True, expiry=300)
    assert sub.subscribe(("cs5/#", 1)) == [1]
    sub.close()
    pub = clients(5, "cs5-pub")
    pub.publish_all([("cs5/x", b"queued", 1)])
    fresh = clients(5, "cs5", clean=True, expiry=300)
    assert fresh.connack[0] is False
    assert fresh.subscribe(("cs5-end", 1)) == [1]
    pub.publish_all([("cs5/x", b"no subscription", 1), ("cs5-end", b"end", 1)])
    assert _payloads(fresh.wait_for_payload(b"end")) == [b"end"]


# ---------------------------------------------------------------- re-sends
def _session_connect(c: RawClient, level: int, cid: str) -> bytes:
    props = Properties(session_expiry_interval=300) if level == 5 else Properties()
    return c.connect(level, client_id=cid, clean_start=False, properties=props)


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.no_cluster("it waits for one edge to see the subscriber gone; tests/edge/cluster/test_sessions.py "
                        "resends in-flight deliveries on another edge")
def test_mqtt_4_4_0_1_unacknowledged_resent_with_dup_and_same_ids_on_reconnect(
        edge, raw, clients, level):
    """Without an edge restart: the session (and its outbox) stays in memory."""
    cid = f"dup-{level}"
    first = raw()
    connack = _session_connect(first, level, cid)
    assert (connack[0], connack[2], connack[3]) == (0x20, 0, 0)  # a new session, accepted
    first.send_packet(Subscribe(1, [Subscription("dup/#", 2)]), level)
    assert first.packet()[0] == 0x90
    pub = clients(4, f"dup-pub-{level}")
    pub.publish_all([("dup/1", b"one", 1), ("dup/2", b"two", 2), ("dup/3", b"three", 2)])
    sent = [_server_publish(first, level) for _ in range(3)]
    assert [(p.payload, p.qos, p.dup) for p in sent] == [
        (b"one", 1, False), (b"two", 2, False), (b"three", 2, False)]
    first.send(b"\x50\x02" + sent[2].packet_id.to_bytes(2, "big"))  # PUBREC for "three"
    assert first.packet() == b"\x62\x02" + sent[2].packet_id.to_bytes(2, "big")
    first.close()  # no PUBACK, no PUBREC for two, no PUBCOMP
    wait_for(lambda: not edge.call(lambda: cid in edge.server.clients), DEADLINE,
             "the edge to see the subscriber gone")
    pub.publish_all([("dup/4", b"four", 1), ("dup/5", b"five", 0)])  # QoS 0: not queued
    again = raw()
    assert _session_connect(again, level, cid)[2] == 1  # session present
    one, two = _server_publish(again, level), _server_publish(again, level)
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in (one, two)] == [
        (b"one", 1, True, sent[0].packet_id), (b"two", 2, True, sent[1].packet_id)]
    assert again.packet() == b"\x62\x02" + sent[2].packet_id.to_bytes(2, "big")  # PUBREL again
    four = _server_publish(again, level)
    assert (four.payload, four.dup) == (b"four", False)
    again.send(b"\x40\x02" + one.packet_id.to_bytes(2, "big")
               + b"\x50\x02" + two.packet_id.to_bytes(2, "big")
               + b"\x70\x02" + sent[2].packet_id.to_bytes(2, "big")
               + b"\x40\x02" + four.packet_id.to_bytes(2, "big"))
    assert again.packet() == b"\x62\x02" + two.packet_id.to_bytes(2, "big")
    again.send(b"\x70\x02" + two.packet_id.to_bytes(2, "big"))
    _quiet(again)
    acks = wait_records(edge.config,
                        lambda r: r.key == cid.encode() and "ack_ref" in headers_of(r), 6)
    assert len(acks) == 6  # PUBREC, PUBACK, PUBREC, PUBCOMP, PUBACK, PUBCOMP with ack_ref


# ---------------------------------------------------------------- restarts
@pytest.mark.parametrize("level", LEVELS)
def test_offline_persistent_session_gets_its_queue_after_a_graceful_restart(run_edge, level):
    """3.1.1 Clean Session 0 / MQTT 5 Session Expiry: subscriptions (with
    their identifier) and what queued while offline survive a stop and start
    of the edge, less the message whose expiry passed, with the interval of
    the others decremented by the time they waited [MQTT-3.3.2-5, -6]; a
    session whose expiry passed meanwhile does not survive."""
    edge = run_edge()
    sub = Client(edge.port, level, f"gr-{level}", clean=False, expiry=300)
    short = Client(edge.port, 5, f"gr-short-{level}", clean=True, expiry=1)
    pub = Client(edge.port, 5, f"gr-pub-{level}")
    try:
        if level == 5:
            assert sub.subscribe(("gr/#", 2), sub_id=5) == [2]
        else:
            assert sub.subscribe(("gr/#", 2)) == [2]
        assert short.subscribe(("gr/#", 1)) == [1]
        pub.publish_all([("gr/live", b"live", 1)])
        assert _payloads(sub.wait_count(1)) == [b"live"]
        sub.close()
        short.close()
        items = [(f"gr/{i}", str(i).encode(), i % 3) for i in range(1, 13)]
        pub.publish_all(items[:6])
        for info in [pub.publish("gr/exp", b"expires", 1, props=_props(MessageExpiryInterval=1)),
                     pub.publish("gr/exp", b"stays", 1, props=_props(MessageExpiryInterval=60))]:
            info.wait_for_publish(DEADLINE)
        gone = time.monotonic()
        pub.publish_all(items[6:])
    finally:
        pub.close()
    edge.stop()
    edge = run_edge()
    time.sleep(max(0.0, 1.3 - (time.monotonic() - gone)))  # past the short expiries
    back = Client(edge.port, level, f"gr-{level}", clean=False, expiry=300)
    late = Client(edge.port, 5, f"gr-short-{level}", clean=False, expiry=300)
    pub = Client(edge.port, 4, f"gr-pub2-{level}")
    try:
        # session present or not (MQTT 3.1's CONNACK has no such flag)
        assert back.connack[0] is (level > 3) and late.connack[0] is False
        # QoS 0 is not kept offline; "expires" expired [MQTT-3.3.2-5]
        want = [(t, p, q) for t, p, q in items[:6] + [("gr/exp", b"stays", 1)] + items[6:] if q]
        got = back.wait_count(len(want))
        for q in (1, 2):  # paho hands QoS 2 over at PUBREL: compare per QoS
            assert [m.payload for m in got if m.qos == q] == [p for _t, p, qq in want if qq == q]
        assert len(got) == len(want)
        if level == 5:
            assert all(m.props.SubscriptionIdentifier == [5] for m in got)
            stays = next(m for m in got if m.payload == b"stays")
            assert 60 - int(time.monotonic() - gone) - 1 <= stays.props.MessageExpiryInterval < 60
        # the subscription itself survived: a new message reaches it
        assert late.subscribe(("gr-end", 1)) == [1]
        pub.publish_all([("gr/after", b"after", 1), ("gr-end", b"end", 1)])
        back.wait_for_payload(b"after")
        assert _payloads(late.wait_for_payload(b"end")) == [b"end"]  # nothing of the old session
    finally:
        for c in (back, late, pub):
            c.close()


def _start_edge(data_dir, *sets: str, snapshot_s: float | None = None
                ) -> tuple[subprocess.Popen, int]:
    """``lakegate edge`` as a subprocess (tests/edge/test_crash.py's, with
    --set); ``snapshot_s``: the session snapshot interval instead of
    bridge.edge.persist.SNAPSHOT_INTERVAL_S (a test-only change)."""
    args = [sys.executable, "-m", "bridge"]
    if snapshot_s is not None:
        args = [sys.executable, "-c",
                "import sys, bridge.edge.housekeeping as h; "
                f"h.SNAPSHOT_INTERVAL_S = {snapshot_s}; "
                "from bridge.cli import main; sys.exit(main(sys.argv[1:]))"]
    args += ["edge", "--port", "0", "--set", f"data_dir={data_dir}", "--set", "log_level=WARNING"]
    for kv in sets:
        args += ["--set", kv]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if not select.select([proc.stdout], [], [], 60)[0]:  # the edge prints one line once it listens
        proc.kill()
        raise AssertionError("the edge subprocess printed no listening line in 60 s")
    line = proc.stdout.readline()
    m = re.search(r"mqtt://127\.0\.0\.1:(\d+)", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"no listening line: {line!r} {proc.stderr.read()}")
    return proc, int(m.group(1))


def _snapshot_outbox(data_dir, cid: str) -> list | None:
    """The outbox rows of ``cid`` in the edge's session snapshot (None: none yet)."""
    path = load_config(None, [f"data_dir={data_dir}"], env={}).edge_state_dir / "sessions.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = doc["sessions"].get(cid)
    return None if entry is None or "outbox" not in entry else entry["outbox"]["d"]


class _Publisher(threading.Thread):
    """Publishes ``k/{i}`` with payload ``i`` at QoS 1 and 2 (i odd: 2) in
    batches until ``limit`` or the connection ends; ``acked``: the payloads
    the edge acknowledged (PUBACK, PUBREC), in order."""

    def __init__(self, port: int, level: int, limit: int = 3000) -> None:
        super().__init__(daemon=True)
        self.port, self.level, self.limit = port, level, limit
        self.acked: list[int] = []

    def run(self) -> None:
        try:
            c = RawClient(self.port, timeout=10)
            c.connect(self.level, client_id="k-pub")
            i = 0
            while i < self.limit:
                batch = list(range(i, i + 20))
                i += 20
                c.send(b"".join(encode(Publish(qos=1 + n % 2, topic=f"k/{n % 7}",
                                               packet_id=n % 60000 + 1, payload=str(n).encode()),
                                       self.level) for n in batch))
                rels = []
                for n in batch:
                    pkt = c.packet()
                    if not pkt or pkt[0] == 0xE0:  # closed, or DISCONNECT 0x8B (SIGTERM)
                        return
                    assert pkt[0] in (0x40, 0x50), pkt
                    self.acked.append(n)
                    if pkt[0] == 0x50:
                        rels.append(b"\x62\x02" + pkt[2:4])
                c.send(b"".join(rels))
                for _ in rels:
                    if not c.packet():
                        return
        except OSError:
            return


def _packets(c: RawClient, level: int, n: int) -> list:
    """The next ``n`` packets, PUBLISH decoded, others as bytes."""
    out = []
    for _ in range(n):
        pkt = c.packet()
        assert pkt, f"connection closed after {len(out)} of {n} packets"
        out.append(decode_packet(pkt, level, from_client=False)[0] if pkt[0] >> 4 == 3 else pkt)
    return out


@pytest.mark.subprocess
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_4_4_0_1_inflight_to_a_subscriber_that_does_not_ack_survive_an_edge_stop(
        tmp_path, capture_backend, level, stop):
    """A connected persistent subscriber holds a full window of unacknowledged
    QoS 1/2 deliveries (one PUBREC'd, two PUBACKed) while a publisher goes
    on; the edge is killed (or stopped). After the restart the subscriber
    gets the PUBREL again, then the unacknowledged PUBLISHes with DUP 1 and
    the Packet Identifiers they had, then everything else the publisher got
    an acknowledgement for, in order, once."""
    window = 20  # edge.max_inflight_messages (default)
    proc, port = _start_edge(tmp_path, "edge.max_queued_messages=100000", *capture_backend)
    cid = f"held-{level}"
    pub = None
    try:
        sub = RawClient(port, timeout=10)
        assert _session_connect(sub, level, cid)[0] == 0x20
        ids = Properties(subscription_identifiers=[3]) if level == 5 else Properties()
        sub.send_packet(Subscribe(1, [Subscription("k/#", 2)], ids), level)
        assert sub.packet()[0] == 0x90
        pub = _Publisher(port, level)
        pub.start()
        before = _packets(sub, level, window)
        assert [int(p.payload) for p in before] == list(range(window))
        assert not any(p.dup for p in before)
        q1 = [p for p in before if p.qos == 1]
        q2 = [p for p in before if p.qos == 2]
        sub.send(b"".join(b"\x40\x02" + p.packet_id.to_bytes(2, "big") for p in q1[:2])
                 + b"\x50\x02" + q2[0].packet_id.to_bytes(2, "big"))
        # two PUBLISHes into the freed slots, and the PUBREL (once the PUBREC,
        # and the PUBACKs before it, are durable)
        more = _packets(sub, level, 3)
        rel = b"\x62\x02" + q2[0].packet_id.to_bytes(2, "big")
        assert rel in more
        sent = before + [p for p in more if not isinstance(p, bytes)]
        done = {int(p.payload) for p in q1[:2]} | {int(q2[0].payload)}
        unacked = [p for p in sent if int(p.payload) not in done]
        assert len(unacked) == window - 1  # the PUBREL'd one holds a slot too
        wait_for(lambda: len(pub.acked) >= 300, DEADLINE, "300 messages acknowledged")
        if stop == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        pub.join(20)
        sub.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    acked = list(pub.acked)
    proc, port = _start_edge(tmp_path, "edge.max_queued_messages=100000", *capture_backend)
    try:
        sub = RawClient(port, timeout=10)
        assert _session_connect(sub, level, cid)[2] & 1  # session present
        assert sub.packet() == rel  # [MQTT-4.4.0-1]: PUBREL again, same Packet Identifier
        again = _packets(sub, level, len(unacked))
        assert [(p.payload, p.packet_id, p.qos, p.dup) for p in again] == [
            (p.payload, p.packet_id, p.qos, True) for p in unacked]
        sub.send(b"\x70\x02" + rel[2:4])  # PUBCOMP
        rest = _take_publishes(sub, level, last=str(acked[-1]).encode())
        seen = [int(p.payload) for p in again + rest]
        assert seen == sorted(seen) and len(seen) == len(set(seen))  # in order, once
        if level == 5:  # the subscription, rebuilt, keeps its identifier [MQTT-3.3.4-3]
            assert all(p.properties.subscription_identifiers == [3] for p in again + rest)
        missing = set(acked) - done - set(seen)
        assert not missing, f"{len(missing)} acknowledged messages lost"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.subprocess
@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_3_3_1_1_deliveries_after_the_snapshot_resent_with_dup_after_sigkill(
        tmp_path, capture_backend, level):
    """The subscriber is connected when the session snapshot is written and
    when the edge dies; deliveries sent after the snapshot come back from the
    replay of the capture log, and went out before: DUP 1 [MQTT-3.3.1-1], as
    those the snapshot holds, all with their Packet Identifiers [MQTT-4.4.0-1]."""
    proc, port = _start_edge(tmp_path, *capture_backend, snapshot_s=1.5)
    cid = f"snap-{level}"
    try:
        sub = RawClient(port, timeout=10)
        assert _session_connect(sub, level, cid)[0] == 0x20
        sub.send_packet(Subscribe(1, [Subscription("s/#", 2)]), level)
        assert sub.packet()[0] == 0x90
        pub = RawClient(port, timeout=10)
        pub.connect(4, client_id="snap-pub")

        def publish(first: int, n: int) -> list[Publish]:
            for i in range(first, first + n):
                pub.send(encode(Publish(qos=1 + i % 2, topic=f"s/{i}", packet_id=i + 1,
                                        payload=str(i).encode()), 4))
                ack = pub.packet()
                if ack[0] == 0x50:
                    pub.send(b"\x62\x02" + ack[2:4])
                    assert pub.packet()[0] == 0x70
            return [_server_publish(sub, level) for _ in range(n)]

        early = publish(0, 6)
        rows = wait_for(lambda: (lambda r: r if r and len(r) == 6 else None)(
            _snapshot_outbox(tmp_path, cid)), DEADLINE, "a snapshot holding the 6 deliveries")
        late = publish(6, 4)
        # acknowledged after the snapshot: PUBACK for 0, PUBREC for 1 (PUBREL back
        # once both are durable)
        sub.send(b"\x40\x02" + early[0].packet_id.to_bytes(2, "big")
                 + b"\x50\x02" + early[1].packet_id.to_bytes(2, "big"))
        rel = b"\x62\x02" + early[1].packet_id.to_bytes(2, "big")
        assert sub.packet() == rel
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _snapshot_outbox(tmp_path, cid) == rows, "a second snapshot raced the kill"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    proc, port = _start_edge(tmp_path, *capture_backend)
    try:
        sub = RawClient(port, timeout=10)
        assert _session_connect(sub, level, cid)[2] & 1
        unacked = early[2:] + late
        again = _packets(sub, level, 1 + len(unacked))
        assert again[0] == rel
        assert [(p.payload, p.packet_id, p.dup) for p in again[1:]] == [
            (p.payload, p.packet_id, True) for p in unacked]
    finally:
        proc.kill()
        proc.wait(10)


# ---------------------------------------------------------------- mosquitto
MOSQ = shutil.which("mosquitto_sub") and shutil.which("mosquitto_pub")


def _mosquitto_pub(port: int, topic: str, message: str, qos: int = 1, version="mqttv311"):
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", version,
                    "-q", str(qos), "-t", topic, "-m", message], check=True, timeout=20,
                   capture_output=True)


def _mosquitto_sub(port: int, count: int, client_id: str, version: str) -> subprocess.Popen:
    args = ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", version,
            "-t", "site/#", "-q", "1", "-c", "-i", client_id, "-C", str(count), "-W", "15", "-v"]
    if version == "mqttv5":
        args += ["-x", "600"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _subscribed(edge, client_id: str, times: int) -> None:
    """Wait until ``client_id``'s ``times``-th SUBSCRIBE is in the capture log."""
    wait_records(edge.config,
                 lambda r: r.key == client_id.encode() and r.value[0] == 0x82, times)


@pytest.mark.skipif(not MOSQ, reason="mosquitto_sub / mosquitto_pub not installed "
                    "(Debian package mosquitto-clients)")
@pytest.mark.parametrize("restart", [False, True], ids=["same-edge", "edge-restarted"])
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_persistent_session_gets_what_queued_offline(run_edge, version, restart):
    """The issue's "Done when": mosquitto_sub -c -i me gets live messages;
    stopped, more are published; (the edge restarts;) back, it gets them."""
    edge = run_edge()
    cid = f"me-{version}"
    live = _mosquitto_sub(edge.port, 3, cid, version)
    try:
        _subscribed(edge, cid, 1)
        for i in range(3):
            _mosquitto_pub(edge.port, f"site/live/{i}", f"live {i}", qos=i % 2 + 1)
        out, err = live.communicate(timeout=20)
    finally:
        live.kill()
    assert live.returncode == 0, err
    assert out.splitlines() == [f"site/live/{i} live {i}" for i in range(3)]
    # the subscriber is gone (its session stays); publish while it is offline
    for i in range(4):
        _mosquitto_pub(edge.port, f"site/queued/{i}", f"queued {i}", qos=i % 2 + 1,
                       version=version)
    _mosquitto_pub(edge.port, "elsewhere", "not for me")
    _mosquitto_pub(edge.port, "site/qos0", "QoS 0 is not kept for an offline session", qos=0)
    if restart:
        edge.stop()
        edge = run_edge()
    back = _mosquitto_sub(edge.port, 4, cid, version)
    try:
        out, err = back.communicate(timeout=20)
    finally:
        back.kill()
    assert back.returncode == 0, err
    assert out.splitlines() == [f"site/queued/{i} queued {i}" for i in range(4)]


# ---------------------------------------------------------------- bad input
def _subscribe_frame(level: int, *subs: Subscription, packet_id: int = 1) -> bytes:
    """A SUBSCRIBE, encoded without the codec's checks (raw filters)."""
    body = packet_id.to_bytes(2, "big") + (b"\x00" if level == 5 else b"")
    for s in subs:
        opts = s.qos | (4 if s.no_local else 0) | (8 if s.retain_as_published else 0)
        body += encode_string(s.topic_filter) + bytes((opts,))
    return b"\x82" + encode_varint(len(body)) + body


INVALID_FILTERS = [
    ("a/#/b", 4, "MQTT-4.7.1-1"), ("a#", 4, "MQTT-4.7.1-1"), ("a/b+", 4, "MQTT-4.7.1-2"),
    ("", 4, "MQTT-4.7.3-1"), ("a/#/b", 5, "MQTT-4.7.1-1"), ("+a", 5, "MQTT-4.7.1-2"),
    ("$share//x", 5, "MQTT-4.8.2-1"), ("$share/g", 5, "MQTT-4.8.2-2"),
    ("$share/g+/x", 5, "MQTT-4.8.2-2"), ("", 3, "MQTT-4.7.3-1"),
]


@pytest.mark.parametrize("tf, level, rule", INVALID_FILTERS)
def test_invalid_filter_closes_the_connection(edge, raw, clients, tf, level, rule):
    good = clients(5, f"bystander-{level}")
    assert good.subscribe(("ok/#", 1)) == [1]
    c = raw()
    assert c.connect(level, client_id=f"bad-{level}")[0] == 0x20
    c.send(_subscribe_frame(level, Subscription("ok/fine", 1), Subscription(tf, 1)))
    if level == 5:
        assert c.packet() == bytes((0xE0, 1, RULES[rule].reason_code))
    assert c.closed()
    rec = wait_records(edge.config,
                       lambda r: r.key == f"bad-{level}".encode()
                       and headers_of(r).get("reject") is not None, 1)[0]
    assert headers_of(rec)["reject"] == rule.encode()
    # the whole SUBSCRIBE is refused: nothing of it was subscribed
    pub = clients(4, f"bad-pub-{level}")
    pub.publish_all([("ok/fine", b"x", 1)])
    good.wait_for_payload(b"x")
    assert edge.call(lambda: edge.server.router.count(f"bad-{level}")) == 0


@pytest.mark.parametrize("level", [4, 5])
def test_oversize_subscribe_closes_the_connection(run_edge, level):
    edge = run_edge("edge.max_packet_bytes=1024")
    c = RawClient(edge.port)
    try:
        assert c.connect(level, client_id=f"big-sub-{level}")[0] == 0x20
        c.send(_subscribe_frame(level, *[Subscription(f"f/{i:04d}/" + "x" * 40, 1)
                                         for i in range(40)]))
        if level == 5:
            assert c.packet() == b"\xe0\x01\x95"  # Packet too large
        assert c.closed()
        assert edge.call(lambda: edge.server.router.count(f"big-sub-{level}")) == 0
        other = Client(edge.port, level, f"after-big-{level}")
        try:
            assert other.subscribe(("f/#", 1)) == [1]
        finally:
            other.close()
    finally:
        c.close()


def test_thousands_of_subscriptions_stop_at_the_limit(clients):
    c = clients(5, "thousands")
    codes = c.subscribe(*[(f"t/{i}/+", 1) for i in range(1200)])
    assert codes == [1] * 1000 + [0x97] * 200  # edge.max_subscriptions_per_client = 1000
    pub = clients(5, "thousands-pub")
    pub.publish_all([("t/999/x", b"in", 1), ("t/1000/x", b"out", 1), ("t/0/x", b"end", 1)])
    assert _payloads(c.wait_for_payload(b"end")) == [b"in", b"end"]


def test_mqtt_3_8_3_4_no_local_on_shared_subscription_is_a_protocol_error(edge, raw):
    c = raw()
    assert c.connect(5, client_id="nl-shared")[0] == 0x20
    c.send(_subscribe_frame(5, Subscription("$share/g/x", 1, no_local=True)))
    assert c.packet() == bytes((0xE0, 1, 0x82))
    assert c.closed()


@pytest.mark.parametrize("level, refusal", [(5, 0x97), (4, 0x80), (3, 0x80)])
def test_subscription_quota_refuses_the_extra_filter_and_keeps_the_client(
        run_edge, level, refusal):
    edge = run_edge("edge.max_subscriptions_per_client=3")
    sub = Client(edge.port, level, f"quota-{level}")
    try:
        assert sub.subscribe(("qa/1", 1), ("qa/2", 1), ("qa/3", 1), ("qa/4", 1)) == [
            1, 1, 1, refusal]
        assert sub.subscribe(("qa/5", 0)) == [refusal]
        assert sub.subscribe(("qa/2", 2)) == [2]  # a replacement is not an extra one
        pub = Client(edge.port, 4, f"quota-pub-{level}")
        try:
            pub.publish_all([("qa/4", b"refused", 1), ("qa/5", b"refused", 1),
                             ("qa/1", b"one", 1), ("qa/2", b"two", 2)])
            got = sub.wait_for_payload(b"two")
            assert [(m.payload, m.qos) for m in got] == [(b"one", 1), (b"two", 2)]
        finally:
            pub.close()
    finally:
        sub.close()


def _server_publish(c: RawClient, level: int) -> Publish:
    p = c.packet()
    assert p and p[0] >> 4 == 3, p
    return decode_packet(p, level, from_client=False)[0]


def _quiet(c: RawClient, seconds: float = 0.3) -> None:
    """Nothing arrives on ``c`` for ``seconds`` (a bounded read)."""
    assert not c.buf
    c.sock.settimeout(seconds)
    try:
        with pytest.raises(socket.timeout):
            c.sock.recv(1)
    finally:
        c.sock.settimeout(5)


def test_mqtt_3_3_4_9_subscriber_that_never_acknowledges_gets_at_most_the_window(run_edge):
    edge = run_edge("edge.max_inflight_messages=5")
    silent = RawClient(edge.port, timeout=5)
    small = RawClient(edge.port, timeout=5)
    pub = other = None
    try:
        assert silent.connect(4, client_id="noack-4")[0] == 0x20
        silent.send_packet(Subscribe(1, [Subscription("na/#", 1)]), 4)
        assert silent.packet() == b"\x90\x03\x00\x01\x01"
        # MQTT 5 Receive Maximum 3, below the edge's window [MQTT-3.3.4-9]
        props = Properties(receive_maximum=3)
        assert small.connect(5, client_id="noack-5", properties=props)[0] == 0x20
        small.send_packet(Subscribe(1, [Subscription("na/#", 2)]), 5)
        assert small.packet()[0] == 0x90
        pub = Client(edge.port, 4, "noack-pub")
        pub.publish_all([("na/x", str(i).encode(), 1) for i in range(20)])
        other = Client(edge.port, 5, "noack-other")
        assert other.subscribe(("na/#", 1)) == [1]
        pub.publish_all([("na/x", b"after", 1)])
        other.wait_for_payload(b"after")  # the edge serves everyone else
        for c, level, window in ((silent, 4, 5), (small, 5, 3)):
            got = [_server_publish(c, level) for _ in range(window)]
            assert [(p.payload, p.qos, p.dup) for p in got] == [
                (str(i).encode(), 1, False) for i in range(window)]
            _quiet(c)  # nothing beyond the window
            # one PUBACK frees one slot: exactly one more PUBLISH
            c.send(b"\x40\x02" + got[0].packet_id.to_bytes(2, "big"))
            nxt = _server_publish(c, level)
            assert nxt.payload == str(window).encode()
            _quiet(c)
    finally:
        for c in (silent, small):
            c.close()
        for c in (pub, other):
            if c is not None:
                c.close()


def _small_window_client(port: int) -> RawClient:
    """A :class:`RawClient` whose socket has a 4 kB receive buffer, set
    before connecting so that the TCP window stays small: a peer that stops
    reading fills it at once."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    c = RawClient.__new__(RawClient)
    c.sock, c.buf = sock, b""
    return c


@pytest.mark.no_cluster("it inspects one edge's outbox of the stuck subscriber")
def test_subscriber_that_never_reads_leaves_the_edge_serving_others(run_edge, monkeypatch,
                                                                     caplog):
    """A QoS 0 subscriber that stops reading: the edge's transport buffer
    fills, it stops sending to it and its session queue applies (bounded by
    edge.max_queued_messages, the oldest dropped, counted and logged in one
    line); every other client goes on."""
    monkeypatch.setattr("bridge.edge.housekeeping.SNAPSHOT_INTERVAL_S", 0.3)
    limit = 100
    edge = run_edge(f"edge.max_queued_messages={limit}")
    stuck_c = _small_window_client(edge.port)
    stuck = stuck_c.sock
    pub = other = None
    caplog.set_level(logging.INFO, logger="bridge.edge")
    try:
        assert stuck_c.connect(4, client_id="stuck")[0] == 0x20
        stuck_c.send_packet(Subscribe(1, [Subscription("#", 0)]), 4)  # '#' on a busy edge
        assert stuck_c.packet()[0] == 0x90
        # from here on the stuck subscriber reads nothing
        other = Client(edge.port, 4, "reader")
        assert other.subscribe(("big/#", 1)) == [1]
        pub = Client(edge.port, 5, "big-pub")
        chunk = b"x" * 16384
        n = 400  # 6.5 MB
        t0 = time.monotonic()
        for k in range(0, n, 25):  # bursts the reader's queue absorbs (its window is 20)
            pub.publish_all([("big/x", b"%05d" % i + chunk, 1) for i in range(k, k + 25)])
        got = other.wait_count(n)
        assert [int(m.payload[:5]) for m in got] == list(range(n))
        assert time.monotonic() - t0 < 30

        def box():
            s = edge.server.router.sessions["stuck"]
            conn = edge.server.clients["stuck"]
            return (len(s.outbox.queue), s.outbox.queued_bytes, s.outbox.dropped,
                    conn.transport.get_write_buffer_size())
        queued, qbytes, dropped, buffered = edge.call(box)
        assert queued <= limit and qbytes <= limit * (len(chunk) + 5)
        assert dropped > 0
        assert buffered < 4 << 20  # the transport buffer stopped growing
        line = wait_for(lambda: [r.getMessage() for r in caplog.records
                                 if "client=stuck" in r.getMessage()
                                 and "queued messages dropped" in r.getMessage()],
                        DEADLINE, "the drop line in the edge's log")
        assert "edge.max_queued_messages = 100" in line[0]
        assert not [r for r in caplog.records if "client=reader" in r.getMessage()
                    and "dropped" in r.getMessage()]
        # a fresh client still gets served
        late = Client(edge.port, 3, "late")
        try:
            assert late.subscribe(("late", 1)) == [1]
            pub.publish_all([("late", b"hello", 1)])
            late.wait_for_payload(b"hello")
        finally:
            late.close()
    finally:
        stuck.close()
        for c in (pub, other):
            if c is not None:
                c.close()
