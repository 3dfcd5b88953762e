"""lakegate against Apache ActiveMQ Artemis, a second real AMQP 1.0 peer
(issue 39): the shared broker of scripts/services on 127.0.0.1:5673 and a
private instance for the outage (tests/amqp/artemis.py).

Artemis delivers what it was sent: ``to`` (the MQTT topic, whatever the
link's target), the header's delivery-count and ttl, no body when none was
sent. It answers a sender's rcv-settle-mode *second* with *first* (it
settles each transfer itself): the enmasse profile runs with its default
here, and the forwarder's warning is checked. A message the edge rejects is
moved to Artemis's dead-letter address ``DLQ``, its ``to`` rewritten to
``DLQ``, with ``x-opt-ORIG-ADDRESS`` / ``x-opt-ORIG-QUEUE`` annotations;
the rejection's condition (lakegate's rule) is not kept, which is why the
edge logs it (issue 39, deliverable 3, has the facts measured).

A producer on Artemis's anonymous relay (its ``to`` is the address) and
the topic link ``topic://#`` (refused: it loops through the dead-letter
address) have a test each.

Skips, saying why, when Artemis is not installed here (scripts/bootstrap
resolves it with Maven; it needs Java); fails when it is but does not
answer (scripts/services up), as the other brokers' tests do.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from proton import Message, symbol

from bridge.amqp.addresses import RESERVED_PROPERTY
from bridge.amqp.mapping import ANN_PAYLOAD_FORMAT, ANN_USER_PROPERTIES, ID_PROPERTY
from bridge.amqp.sender import Forwarder
from bridge.config import AmqpConfig, load_config
from tests.amqp import artemis
from tests.amqp.artemis import ArtemisNode, TopicConsumer, unique
from tests.amqp.rows import row
from tests.amqp.test_receiver import send
from tests.edge.conftest import capture_backend, edge_config, run_edge  # noqa: F401 - the edge's fixtures, for the downlink
from tests.edge.test_downlink import cmd, link_ready, raw_subscriber
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.broker,
              pytest.mark.skipif(artemis.missing() is not None, reason=str(artemis.missing()))]

ANNS = {"seed": ("x-retain", "x-qos"), "enmasse": ("x-opt-retain-message", "x-opt-mqtt-qos")}
CLIENT_ADDRESS = "queue://mqtt.to.{client_id}"


@pytest.fixture(scope="module")
def url() -> str:
    return artemis.need()


@pytest.fixture(scope="module")
def consumer(url):
    c = TopicConsumer(url, unique())
    yield c
    c.close()


def config(url: str, *sets: str) -> AmqpConfig:
    return load_config(None, [f"amqp.url={url}", "amqp.peer=artemis", "amqp.address_template=topic://{routing_key}",
                              "amqp.max_retries=2", "amqp.retry_backoff_s=0.05", "amqp.disposition_timeout_s=10",
                              *sets], env={}).amqp


# ------------------------------------------------------------------ forwarding
@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_every_field_of_the_mapping_arrives(profile, consumer, url, caplog):
    retain_ann, qos_ann = ANNS[profile]
    topic = consumer.topic(f"fields-{profile}")
    now = time.time()
    ups = [{"key": "k", "value": "1"}, {"key": "unit", "value": "C"}, {"key": "k", "value": "2"}]
    batch = [
        row(topic, 0, qos=0, payload=b"q0"),
        row(topic, 1, qos=1, packet_id=11, retain=True, payload=b"q1-retained"),
        row(topic, 2, qos=1, packet_id=12, dup=True, payload=b"q1-dup"),
        row(topic, 3, qos=2, packet_id=13, payload=b"\x00\xffq2"),
        row(topic, 4, kind="pubrel", packet_id=13),
        row(topic, 5, qos=1, packet_id=14, payload="{\"t\": 21.5}".encode(), payload_format_indicator=1,
            message_expiry_interval=3600, receive_time=dt.datetime.fromtimestamp(now - 600, dt.timezone.utc),
            response_topic=f"{topic}/reply", correlation_data=b"\x01corr", user_properties=ups,
            content_type="application/json"),
    ]
    with caplog.at_level(logging.WARNING, logger="bridge.amqp"), Forwarder(config(url, f"amqp.profile={profile}")) as fwd:
        res = fwd.forward(batch)
    assert (res.qos0, res.accepted, res.expired) == (1, 5, 0)
    got = {m.properties[ID_PROPERTY]: m for m in consumer.wait(topic, 6)}
    assert len(got) == 6
    address = "topic://" + topic.replace("/", ".")
    second = [r.getMessage() for r in caplog.records if "rcv-settle-mode" in r.getMessage()]
    if profile == "enmasse":  # asked for second, Artemis answers first: said once, and it goes on
        assert second == [f"AMQP peer attached qos2 link to {address!r} with rcv-settle-mode first, not second"]
    else:
        assert second == []

    def common(m, offset, qos, retain, payload, delivery_count=0):
        assert m.address == topic  # `to`: the MQTT topic, verbatim (the link's target is `address`)
        assert m.properties[ID_PROPERTY] == f"mqtt-frames/0/{offset}"
        assert m.annotations[symbol(retain_ann)] is retain
        assert m.annotations[symbol(qos_ann)] == qos
        assert m.durable is (qos > 0)
        assert m.inferred and bytes(m.body) == payload  # one Data section
        assert m.subject == ("publish" if profile == "seed" else None)
        assert m.delivery_count == delivery_count  # the sender's, kept (RabbitMQ 3.x puts its own)

    m = got["mqtt-frames/0/0"]
    common(m, 0, 0, False, b"q0")
    assert m.id is None
    common(got["mqtt-frames/0/1"], 1, 1, True, b"q1-retained")
    assert got["mqtt-frames/0/1"].id == 11
    common(got["mqtt-frames/0/2"], 2, 1, False, b"q1-dup", delivery_count=1)  # DUP
    common(got["mqtt-frames/0/3"], 3, 2, False, b"\x00\xffq2")
    assert got["mqtt-frames/0/3"].id == 13

    rel = got["mqtt-frames/0/4"]
    assert (rel.subject, rel.id, rel.address, rel.durable) == ("pubrel", 13, topic, True)
    assert rel.annotations is None
    assert rel.body is None  # sent with no body, delivered with none

    m5 = got["mqtt-frames/0/5"]
    common(m5, 5, 1, False, b'{"t": 21.5}')
    assert m5.content_type == "application/json"
    assert bytes(m5.correlation_id) == b"\x01corr"
    assert m5.reply_to == "topic://" + f"{topic}/reply".replace("/", ".")  # through amqp.address_template
    assert 2990 < m5.ttl <= 3000  # an hour, received ten minutes ago
    assert m5.annotations[symbol(ANN_PAYLOAD_FORMAT)] == 1
    assert m5.properties == {"k": "1", "unit": "C", ID_PROPERTY: "mqtt-frames/0/5"}
    assert m5.annotations[symbol(ANN_USER_PROPERTIES)] == [["k", "1"], ["unit", "C"], ["k", "2"]]


@pytest.mark.parametrize("refuse", ["", None])  # "": the guard off; None: the peer's, _AMQ_
def test_lg_amqp_reserved_property_a_user_property_artemis_reads_as_an_order_is_quarantined(refuse, consumer, url):
    topic = consumer.topic(f"dupl-{refuse is None}")
    dupl = [{"key": "_AMQ_DUPL_ID", "value": "same"}]
    batch = [row(topic, i, qos=1, packet_id=i + 1, payload=b"m%d" % i, user_properties=dupl) for i in range(2)]
    batch.append(row(topic, 2, qos=1, packet_id=3, payload=b"plain", user_properties=[["_amq_x", "1"]]))
    sets = [] if refuse is None else [f"amqp.property_refuse={refuse}"]
    with Forwarder(config(url, *sets)) as fwd:
        res = fwd.forward(batch)
    if refuse == "":  # the peer accepts both and drops the second as a duplicate: lost without a trace
        assert res.accepted == 3 and not res.failures
        consumer.wait(topic, 2, timeout=10)
        time.sleep(2)  # what else arrives
        assert sorted(bytes(m.body) for m in consumer.wait(topic, 2)) == [b"m0", b"plain"]
        return
    assert res.accepted == 1 and [f.rule for f in res.failures] == [RESERVED_PROPERTY] * 2
    assert "'_AMQ_DUPL_ID'" in res.failures[0].error and (res.failures[0].offset, res.failures[1].offset) == (0, 1)
    assert [bytes(m.body) for m in consumer.wait(topic, 1)] == [b"plain"]  # a name only like it goes


def test_qos2_gives_the_publish_then_the_pubrel(consumer, url):
    topic = consumer.topic("qos2")
    with Forwarder(config(url)) as fwd:
        res = fwd.forward([row(topic, 0, qos=2, packet_id=77, payload=b"x"), row(topic, 1, kind="pubrel", packet_id=77)])
    assert res.accepted == 2
    pub, rel = consumer.wait(topic, 2)
    assert (pub.subject, pub.id, rel.subject, rel.id) == ("publish", 77, "pubrel", 77)


# ------------------------------------------------------------------ the downlink
@pytest.fixture
def downlink(run_edge, url):  # noqa: F811 - run_edge: the edge's fixture, imported above
    """A function: -> (edge, prefix); the edge receives from Artemis on the
    client addresses ``queue://mqtt.to.<client id>`` and on
    ``topic://<prefix>.#``. The queues it made are deleted afterwards."""
    made: list[str] = []
    edges: list = []

    def start(*extra: str):
        prefix = unique("dl")
        made.append(prefix)
        e = run_edge(f"amqp.url={url}", "amqp.peer=artemis", "amqp.downlink=true", f"amqp.container_id={prefix}",
                     "amqp.address_template=topic://{routing_key}", f"amqp.client_address_template={CLIENT_ADDRESS}",
                     f"amqp.downlink_topic_address=topic://{prefix}.#", "amqp.retry_backoff_s=0.1", *extra)
        edges.append(e)
        link_ready(e, f"topic://{prefix}.#")
        return e, prefix

    yield start
    for e in edges:  # first, or it would attach again to what is deleted
        e.stop()
    if made:  # client queues (named after the client ids, which hold the prefix) and subscription queues
        artemis.destroy_queues(url, lambda name: any(p in name for p in made))


def dead_letters(url: str, marker: str, n: int, timeout: float = 10) -> list[Message]:
    """The ``n`` messages in Artemis's ``DLQ`` whose application property
    ``lgtest`` is ``marker`` (taken; the others stay)."""
    from proton.reactor import Selector
    from proton.utils import BlockingConnection

    conn = BlockingConnection(url, timeout=timeout)
    try:
        r = conn.create_receiver("queue://DLQ", options=Selector(f"lgtest = '{marker}'"))
        out = []
        for _ in range(n):
            out.append(r.receive(timeout))
            r.accept()
        return out
    finally:
        conn.close()


def test_amqp_to_a_topic_address_reaches_an_mqtt5_subscriber(downlink, url):
    """A proton producer sends to ``topic://<prefix>.devices.7.cmd`` with the
    MQTT topic in ``to``; a paho MQTT 5 subscriber of the edge gets each
    with QoS = min(message, granted), RETAIN 0, the reverse mapping's
    properties; each is accepted."""
    edge, prefix = downlink()
    topic = f"{prefix}/devices/7/cmd"
    got: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}p", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, u, m: got.append(m)
    c.connect("127.0.0.1", edge.port)
    c.loop_start()
    try:
        c.subscribe(f"{prefix}/devices/+/cmd", qos=1)
        wait_for(lambda: edge.server.router.count(f"{prefix}p"), 10, "the paho subscription")
        send(url, f"topic://{prefix}.devices.7.cmd",
             cmd(topic, b"q0", 0),
             cmd(topic, b"q1", 1, content_type="text/plain", correlation_id=b"\x01\x02",
                 reply_to=f"topic://{prefix}.devices.7.reply", properties={"k": "v"},
                 annotations={symbol("x-retain"): True}),
             cmd(topic, b"q2", 2, ttl=120.0))
        wait_for(lambda: len(got) >= 3, 15, "three messages at the paho subscriber")
        by = {m.payload: m for m in got}
        assert [by[p].qos for p in (b"q0", b"q1", b"q2")] == [0, 1, 1]  # granted 1
        assert not any(m.retain for m in got)  # [MQTT-3.3.1-12]
        p1 = by[b"q1"].properties
        assert p1.ContentType == "text/plain" and p1.CorrelationData == b"\x01\x02"
        assert p1.ResponseTopic == f"{prefix}/devices/7/reply"  # read back through the address template
        assert p1.UserProperty == [("k", "v")]
        assert 115 <= by[b"q2"].properties.MessageExpiryInterval <= 120
        hub = edge.server.downlink
        wait_for(lambda: hub.rx.stats["accepted"] >= 3, 10, "three accepted")
        assert hub.rx.stats["rejected"] == hub.rx.stats["released"] == 0
    finally:
        c.disconnect()
        c.loop_stop()


def test_qos1_on_the_client_address_accepted_at_puback_released_when_the_client_drops(downlink, url):
    """``queue://mqtt.to.<client id>``: the delivery stays unsettled until
    the PUBACK; a client that drops without it has it released, Artemis
    keeps it in the client's queue and delivers it again when the client is
    back; accepted at that PUBACK, the queue is then empty."""
    edge, prefix = downlink()
    cid = f"{prefix}c"
    hub = edge.server.downlink
    topic = f"{prefix}/devices/7/cmd"
    c = raw_subscriber(edge, cid, 5, topic, 1)
    link_ready(edge, CLIENT_ADDRESS.format(client_id=cid))
    send(url, f"queue://mqtt.to.{cid}", cmd(topic, b"reboot", 1))
    pub = c.packet()
    assert pub[0] == 0x32 and pub.endswith(b"reboot")
    holds_for(lambda: hub.rx.stats["accepted"] == 0 and hub.rx.stats["released"] == 0, 0.3,
              "nothing settled before the PUBACK")
    c.close()  # no PUBACK
    wait_for(lambda: hub.rx.stats["released"], 10, "the delivery released")
    holds_for(lambda: hub.rx.stats["received"] == 1 and hub.rx.stats["released"] == 1, 0.5,
              "released once, not delivered again to the link being detached")
    assert artemis.message_count(url, f"mqtt.to.{cid}") == 1  # kept by Artemis
    c = raw_subscriber(edge, cid, 5, topic, 1)
    again = c.packet()
    assert again[0] == 0x32 and again.endswith(b"reboot"), (hub.stats, hub.rx.stats)
    c.send(b"\x40\x02" + again[4 + len(topic):6 + len(topic)])
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "accepted after the PUBACK")
    wait_for(lambda: artemis.message_count(url, f"mqtt.to.{cid}") == 0, 10, "the client's queue empty")
    c.send(b"\xe0\x00")
    c.close()


def test_bad_messages_are_rejected_with_their_rule_and_dead_lettered(downlink, url, caplog):
    """On the topic link: lakegate's own message accepted and dropped; a
    body no PUBLISH can hold rejected [LG-amqp-body], a topic no one
    subscribed to rejected [LG-amqp-no-subscription], each logged with its
    rule; the link stays (the next message arrives). Artemis moves each
    rejected message to ``DLQ``: ``to`` rewritten, the original address in
    an annotation, the rule nowhere (only in the edge's log)."""
    edge, prefix = downlink()
    hub = edge.server.downlink
    topic = f"{prefix}/t"
    c = raw_subscriber(edge, f"{prefix}s", 5, topic, 1)
    own = cmd(topic, b"mine", 1)
    own.properties = {"lakegate-id": "mqtt-frames/0/7"}
    mark = {"lgtest": prefix}
    with caplog.at_level(logging.WARNING, logger="bridge"):
        send(url, f"topic://{prefix}.t", own, cmd(topic, {"a": 1}, 1, properties=mark),
             cmd(f"{prefix}/nobody", b"x", 1, properties=mark), cmd(topic, b"after", 1))
        pub = c.packet()
        assert pub.endswith(b"after")
        wait_for(lambda: hub.stats["own"] == 1 and hub.rx.stats["rejected"] == 2, 10, "the outcomes")
    c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
    wait_for(lambda: hub.rx.stats["accepted"] == 2, 10, "the own one and the last accepted")
    lines = [r.getMessage() for r in caplog.records if "rejected [" in r.getMessage()]
    assert sum("[LG-amqp-body]" in x for x in lines) == 1 and sum("[LG-amqp-no-subscription]" in x for x in lines) == 1
    dead = dead_letters(url, prefix, 2)
    assert sorted(bytes(m.body) if m.body != {"a": 1} else b"map" for m in dead) == [b"map", b"x"]
    for m in dead:
        assert m.address == "DLQ"  # Artemis rewrites `to`: the MQTT topic is gone
        assert m.annotations[symbol("x-opt-ORIG-ADDRESS")] == f"{prefix}.t"
        assert not any("LG-amqp" in str(v) for v in list((m.annotations or {}).values())
                       + list((m.properties or {}).values()))
    c.send(b"\xe0\x00")
    c.close()


def test_qos2_on_the_client_address_amqp_pubrel_then_pubcomp(downlink, url):
    """QoS 2 as the seed draws it (``amqp.downlink_pubrel = "peer"``):
    AMQP_PUBLISH accepted at PUBREC, no PUBREL to the client until
    AMQP_PUBREL (subject "pubrel", the same message-id) comes, which is
    accepted at PUBCOMP."""
    edge, prefix = downlink("amqp.downlink_pubrel=peer")
    cid = f"{prefix}q"
    hub = edge.server.downlink
    topic = f"{prefix}/cmd"
    c = raw_subscriber(edge, cid, 5, topic, 2)
    link_ready(edge, CLIENT_ADDRESS.format(client_id=cid))
    send(url, f"queue://mqtt.to.{cid}", cmd(topic, b"two", 2, id="m-1"))
    pub = c.packet()
    assert pub[0] == 0x34 and pub.endswith(b"two")
    pid = pub[4 + len(topic):6 + len(topic)]
    c.send(b"\x50\x02" + pid)  # PUBREC
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "AMQP_PUBLISH accepted at PUBREC")
    c.sock.settimeout(0.5)
    assert c.packet() == b""  # no PUBREL before AMQP_PUBREL
    c.sock.settimeout(10)
    send(url, f"queue://mqtt.to.{cid}", Message(address=topic, subject="pubrel", id="m-1"))
    assert c.packet() == b"\x62\x02" + pid
    assert hub.rx.stats["accepted"] == 1  # the AMQP_PUBREL waits for PUBCOMP
    c.send(b"\x70\x02" + pid)
    wait_for(lambda: hub.rx.stats["accepted"] == 2, 10, "AMQP_PUBREL accepted at PUBCOMP")
    wait_for(lambda: artemis.message_count(url, f"mqtt.to.{cid}") == 0, 10, "the client's queue empty")
    c.send(b"\xe0\x00")
    c.close()


def test_a_producer_on_the_anonymous_relay_reaches_the_subscriber(downlink, url):
    """Artemis offers ANONYMOUS-RELAY: a producer may send every message on
    one link with no target, each message's address in its ``to``. To the
    edge's topic link, that ``to`` is ``topic://<routing key>``, an address
    of ``amqp.address_template``: its topic is ``<prefix>/devices/1/cmd``
    (``bridge.peers``: ``to_may_be_address``; taken verbatim, it was rejected
    [LG-amqp-no-subscription] for the topic ``topic://<prefix>.devices.1.cmd``)."""
    from proton.utils import BlockingConnection

    edge, prefix = downlink()
    topic = f"{prefix}/devices/1/cmd"
    c = raw_subscriber(edge, f"{prefix}r", 5, topic, 1)
    conn = BlockingConnection(url, timeout=15)
    try:
        relay = conn.create_sender(None)  # no target address: the relay
        relay.send(Message(address=f"topic://{prefix}.devices.1.cmd", body=b"via-relay",
                           annotations={symbol("x-qos"): 1}, properties={"lgtest": prefix}))
    finally:
        conn.close()
    hub = edge.server.downlink
    try:
        wait_for(lambda: hub.rx.stats["received"], 10, "the message at the edge")
        c.sock.settimeout(2)
        pub = c.packet()
        assert pub[:1] == b"\x32" and pub.endswith(b"via-relay"), (pub, hub.rx.stats)
        c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
    finally:
        c.send(b"\xe0\x00")
        c.close()
        if hub.rx.stats["rejected"]:
            dead_letters(url, prefix, 1)  # not left in the shared DLQ


# ------------------------------------------------------------------ a private Artemis
@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A private Artemis (tests/amqp/artemis.py), for what stops it or would
    disturb the shared one; a test leaves it running."""
    n = ArtemisNode(tmp_path_factory.mktemp("artemis"))
    n.start()
    yield n
    n.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_lg_amqp_topic_link_loop_topic_hash_is_refused_on_artemis():
    """``topic://#`` on Artemis subscribes to every address of the broker:
    its notifications, other clients' replies and ``DLQ``. The edge rejected
    each (no MQTT subscription matches ``DLQ``), Artemis dead-lettered it to
    ``DLQ``, which the same link received again: about 700 rejections (and
    WARNING lines) a second, ``DLQ`` growing without bound. Refused at start,
    with one line; the peer's default is no topic link at all."""
    from bridge.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"LG-amqp-topic-link-loop.*topic://cmd\.#"):
        load_config(None, ["amqp.peer=artemis", "amqp.downlink=true", "amqp.downlink_topic_address=topic://#"],
                    env={})
    cfg = load_config(None, ["amqp.peer=artemis", "amqp.downlink=true"], env={})
    assert cfg.amqp.downlink_topic_address == ""
    # a narrower one is the operator's to name
    load_config(None, ["amqp.peer=artemis", "amqp.downlink=true", "amqp.downlink_topic_address=topic://cmd.#"],
                env={})


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_topic_link_leaves_no_subscription_behind_when_artemis_restarts(run_edge, node):  # noqa: F811
    """The private Artemis restarted under an edge: its topic link attaches
    again, and the one subscription on the topic address is the link's.
    (A durable terminus under a new link name at each attach left a durable
    subscription queue ``<container id>.lakegate-dl-<n>`` behind at each
    reconnection, filling with every message of the address for ever.)"""
    prefix = unique("rs")
    edge = run_edge(f"amqp.url={node.url}", "amqp.peer=artemis", "amqp.downlink=true",
                    f"amqp.container_id={prefix}", f"amqp.downlink_topic_address=topic://{prefix}.#",
                    "amqp.client_address_template=", "amqp.retry_backoff_s=0.2")
    hub = edge.server.downlink
    address = f"topic://{prefix}.#"

    def subscriptions() -> list[str]:  # the queues on the wildcard address
        return list(artemis.management(node.url, "getQueueNames", resource=f"address.{prefix}.#"))

    try:
        link_ready(edge, address)
        wait_for(lambda: len(subscriptions()) == 1, 10, "the link's subscription")
        node.stop()
        node.start()
        wait_for(lambda: hub.rx.stats["reconnects"] >= 1 and address in hub.rx.links, 60, "the link attached again")
        c = raw_subscriber(edge, f"{prefix}s", 5, f"{prefix}/x", 0)
        send(node.url, f"topic://{prefix}.x", cmd(f"{prefix}/x", b"after", 0))
        assert c.packet().endswith(b"after")
        c.close()
        subs = subscriptions()
        assert len(subs) == 1, {q: artemis.message_count(node.url, q) for q in subs}
    finally:
        edge.stop()
        artemis.destroy_queues(node.url, lambda name: name.startswith(f"{prefix}-downlink."))


# ------------------------------------------------------------------ an outage
BATCH = 300


def receive_all(url: str, address: str, want: set[str], timeout: float) -> list[str]:
    """Every lakegate-id at ``address``, until ``want`` is covered or ``timeout``."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    got: list[str] = []
    left = set(want)
    deadline = time.monotonic() + timeout

    class H(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=500)

        def on_start(self, event: Any) -> None:
            host = url.split("@")[-1]
            self.conn = event.container.connect(f"amqp://{host}", user="guest", password="guest", reconnect=False)
            event.container.create_receiver(self.conn, address)
            self.timer = event.container.schedule(0.2, self)

        def on_message(self, event: Any) -> None:
            lid = event.message.properties[ID_PROPERTY]
            got.append(lid)
            left.discard(lid)
            if not left:
                self.timer.cancel()
                self.conn.close()

        def on_timer_task(self, event: Any) -> None:
            if time.monotonic() > deadline:
                self.conn.close()
            else:
                self.timer = event.container.schedule(0.2, self)

    Container(H()).run()
    return got


@pytest.mark.slow
@pytest.mark.subprocess
def test_artemis_stopped_and_started_while_forwarding_loses_nothing(node):
    """The private Artemis stopped (SIGTERM) and started again while batches
    of QoS 1 and 2 go to ``queue://<name>`` (anycast, durable): the
    forwarder reconnects, and every message arrives, none lost."""
    queue = unique("outage")
    cfg = load_config(None, [f"amqp.url={node.url}", "amqp.peer=artemis",
                             "amqp.address_template=queue://{routing_key}", "amqp.max_retries=20",
                             "amqp.retry_backoff_s=0.2", "amqp.disposition_timeout_s=5"], env={}).amqp
    sent: list[str] = []
    results: list[Any] = []
    errors: list[BaseException] = []
    progress = threading.Condition()
    stop = threading.Event()

    def run() -> None:
        offset = 0
        with Forwarder(cfg) as fwd:
            while not stop.is_set() and len(results) < 200:
                batch = []
                for _ in range(BATCH):
                    qos = 1 + (offset % 2)
                    batch.append(row(queue, offset, qos=qos, packet_id=offset % 65535 + 1, payload=b"m%d" % offset))
                    if qos == 2:
                        batch.append(row(queue, offset + 1, kind="pubrel", packet_id=offset % 65535 + 1))
                        offset += 1
                    offset += 1
                try:
                    res = fwd.forward(batch)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)
                    return
                finally:
                    with progress:
                        progress.notify_all()
                sent.extend(f"mqtt-frames/0/{r['offset']}" for r in batch)
                with progress:
                    results.append(res)
                    progress.notify_all()

    def wait_batches(n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with progress:
            while len(results) < n and not errors:
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(results)} batches within {timeout}s"
                progress.wait(left)

    t = threading.Thread(target=run, name="artemis-outage-forwarder")
    t.start()
    try:
        wait_batches(2, 30)
        node.stop()  # while batches are being forwarded
        node.start()
        after = len(results)
        wait_batches(after + 2, 60)
    finally:
        stop.set()
        t.join(90)
    assert not errors, errors
    assert sum(r.reconnects for r in results) >= 1
    want = set(sent)
    got = receive_all(node.url, f"queue://{queue}", want, timeout=60)
    missing = want - set(got)
    assert not missing, f"{len(missing)} of {len(want)} messages lost, e.g. {sorted(missing)[:5]}"
    assert sum(r.accepted for r in results) == len(want)
