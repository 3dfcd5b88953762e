"""AMQP -> MQTT through the edge (bridge/edge/downlink.py, issue 24) on the
real RabbitMQ of scripts/services: a python-qpid-proton producer sends to a
client's own address and to topic addresses; paho-mqtt, mosquitto_sub and
raw MQTT clients receive.

With RabbitMQ in between, the producer's disposition is RabbitMQ's (given
when the message is queued). What the edge settles is RabbitMQ's delivery to
it, so "accepted only after the MQTT acknowledgement" is checked on the
edge's receiver (its counted outcomes) and by what RabbitMQ does next: a
released message comes again, an accepted one does not."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.packettypes import PacketTypes
from proton import Message, symbol

from bridge.mqtt import Subscribe, Subscription
from tests.amqp.conftest import rabbitmqctl
from tests.amqp.test_receiver import send
from tests.edge.conftest import RawClient
from tests.waiting import holds_for, wait_for

pytestmark = pytest.mark.broker

CLIENT_ADDRESS = "/queue/mqtt.to.{client_id}"


@pytest.fixture
def downlink(run_edge, rabbitmq):
    """A function: -> (edge, prefix); the edge receives from RabbitMQ on the
    client addresses and on ``/topic/<prefix>.#``. Queues it made are deleted."""
    made: list[str] = []

    def start(*extra: str):
        prefix = f"dl{uuid.uuid4().hex[:8]}"
        e = run_edge(f"amqp.url={rabbitmq}", "amqp.downlink=true",
                     f"amqp.client_address_template={CLIENT_ADDRESS}",
                     f"amqp.downlink_topic_address=/topic/{prefix}.#", "amqp.retry_backoff_s=0.1",
                     *extra)
        hub = e.server.downlink
        wait_for(lambda: hub.rx.links, 15, "the topic link")
        made.append(prefix)
        return e, prefix

    yield start
    ctl = rabbitmqctl()
    if ctl is not None:  # the client queues of this test's clients (named after the prefix)
        out = subprocess.run([ctl, "-q", "list_queues", "name"], capture_output=True, text=True,
                             timeout=60).stdout
        for name in out.split():
            if any(p in name for p in made):
                subprocess.run([ctl, "-q", "delete_queue", name], capture_output=True, timeout=60)


def cmd(topic: str, body: bytes, qos: int | None = None, **kw) -> Message:
    ann = {} if qos is None else {symbol("x-qos"): qos}
    ann.update(kw.pop("annotations", {}))
    return Message(address=topic, body=body, annotations=ann or None, **kw)


def link_ready(edge, address: str) -> None:
    wait_for(lambda: address in edge.server.downlink.rx.links, 15, f"the link on {address}")


def raw_subscriber(edge, cid: str, level: int, topic_filter: str, qos: int,
                   clean: bool = True, **connect) -> RawClient:
    c = RawClient(edge.port, timeout=10)
    ack = c.connect(level, client_id=cid, clean_start=clean, **connect)
    assert ack[0] == 0x20
    c.send_packet(Subscribe(1, [Subscription(topic_filter, qos)]), level)
    assert c.packet()[0] == 0x90
    return c


def test_amqp_to_topic_reaches_every_matching_subscriber_MQTT_3_3_1_12(downlink, rabbitmq):
    """Paho (MQTT 5) and mosquitto_sub (3.1.1) subscribers of a topic get
    what a proton producer sends to its topic address: QoS = min(message,
    granted), RETAIN 0 on a live delivery [MQTT-3.3.1-12], properties from
    the reverse mapping."""
    edge, prefix = downlink()
    topic = f"{prefix}/devices/7/cmd"
    got: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}p", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, u, m: got.append(m)
    c.connect("127.0.0.1", edge.port)
    c.loop_start()
    sub = None
    try:
        c.subscribe(f"{prefix}/devices/+/cmd", qos=1)
        wait_for(lambda: edge.server.router.count(f"{prefix}p"), 10, "the paho subscription")
        if shutil.which("mosquitto_sub"):
            sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(edge.port),
                                    "-i", f"{prefix}m", "-t", topic, "-q", "2", "-V", "mqttv311",
                                    "-v"], stdout=subprocess.PIPE, text=True)
            wait_for(lambda: edge.server.router.count(f"{prefix}m"), 10, "mosquitto_sub's subscription")
        send(rabbitmq, f"/topic/{prefix}.devices.7.cmd",
             cmd(topic, b"q0", 0),
             cmd(topic, b"q1", 1, content_type="text/plain", correlation_id=b"\x01\x02",
                 reply_to=f"/topic/{prefix}.devices.7.reply", properties={"k": "v"},
                 annotations={symbol("x-retain"): True}),
             cmd(topic, b"q2", 2, ttl=120.0))
        wait_for(lambda: len(got) >= 3, 15, "three messages at the paho subscriber")
        by = {m.payload: m for m in got}
        assert [by[p].qos for p in (b"q0", b"q1", b"q2")] == [0, 1, 1]  # granted 1
        assert not any(m.retain for m in got)  # [MQTT-3.3.1-12]
        p1 = by[b"q1"].properties
        assert p1.ContentType == "text/plain" and p1.CorrelationData == b"\x01\x02"
        assert p1.ResponseTopic == f"{prefix}/devices/7/reply"
        assert p1.UserProperty == [("k", "v")]
        assert 115 <= by[b"q2"].properties.MessageExpiryInterval <= 120
        if sub is not None:
            lines = []
            deadline = time.monotonic() + 15
            while len(lines) < 3 and time.monotonic() < deadline:
                lines.append(sub.stdout.readline().strip())
            assert lines == [f"{topic} q0", f"{topic} q1", f"{topic} q2"]
        hub = edge.server.downlink
        wait_for(lambda: hub.rx.stats["accepted"] >= 3, 10, "three accepted")
    finally:
        c.disconnect()
        c.loop_stop()
        if sub is not None:
            sub.terminate()
            sub.wait(10)


def test_qos1_accepted_only_after_puback_and_released_when_the_client_drops(downlink, rabbitmq):
    """The seed's QoS 1 flow on the client's own address: the delivery stays
    unsettled until PUBACK; a clean-session client that drops without
    PUBACK gets it again on its next connection (released, not accepted),
    and only then: the link is detached before the release, so RabbitMQ
    does not hand it straight back to the going link."""
    edge, prefix = downlink()
    cid = f"{prefix}c"
    hub = edge.server.downlink
    topic = f"{prefix}/devices/7/cmd"
    c = raw_subscriber(edge, cid, 5, topic, 1)
    link_ready(edge, CLIENT_ADDRESS.format(client_id=cid))
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"reboot", 1))
    pub = c.packet()
    assert pub[0] == 0x32 and pub.endswith(b"reboot")
    holds_for(lambda: hub.rx.stats["accepted"] == 0 and hub.rx.stats["released"] == 0, 0.3,
              "nothing settled before the PUBACK")
    c.close()  # no PUBACK
    wait_for(lambda: hub.rx.stats["released"], 10, "the delivery released")
    # released after its link was detached: RabbitMQ keeps it for the next
    # link instead of handing it straight back (it did, under load)
    holds_for(lambda: hub.rx.stats["received"] == 1 and hub.rx.stats["released"] == 1, 0.5,
              "released once, not delivered again to the link being detached")
    c = raw_subscriber(edge, cid, 5, topic, 1)
    again = c.packet()
    assert again, (hub.stats, hub.rx.stats, list(hub.rx.links), hub.client_of)
    assert again[0] == 0x32 and again.endswith(b"reboot")
    pid = again[2 + 2 + len(topic):4 + 2 + len(topic)]
    c.send(b"\x40\x02" + pid)
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "accepted after the PUBACK")
    c.send(b"\xe0\x00")
    c.close()


def test_qos2_seed_flow_amqp_pubrel_then_pubcomp(downlink, rabbitmq):
    """QoS 2 as the seed draws it: AMQP_PUBLISH accepted at PUBREC, no PUBREL
    to the client until AMQP_PUBREL (subject "pubrel", same message-id)
    comes, which is accepted at PUBCOMP."""
    edge, prefix = downlink()
    cid = f"{prefix}q"
    hub = edge.server.downlink
    topic = f"{prefix}/cmd"
    c = raw_subscriber(edge, cid, 4, topic, 2)
    link_ready(edge, CLIENT_ADDRESS.format(client_id=cid))
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"two", 2, id="m-1"))
    pub = c.packet()
    assert pub[0] == 0x34 and pub.endswith(b"two")
    pid = pub[4 + len(topic):6 + len(topic)]
    c.send(b"\x50\x02" + pid)  # PUBREC
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "AMQP_PUBLISH accepted at PUBREC")
    c.sock.settimeout(0.5)
    assert c.packet() == b""  # no PUBREL before AMQP_PUBREL
    c.sock.settimeout(10)
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", Message(address=topic, subject="pubrel", id="m-1"))
    assert c.packet() == b"\x62\x02" + pid
    assert hub.rx.stats["accepted"] == 1  # the AMQP_PUBREL waits for PUBCOMP
    c.send(b"\x70\x02" + pid)
    wait_for(lambda: hub.rx.stats["accepted"] == 2, 10, "AMQP_PUBREL accepted at PUBCOMP")
    c.send(b"\xe0\x00")
    c.close()


def test_lakegate_own_messages_and_malformed_ones_never_reach_subscribers(downlink, rabbitmq):
    """Loop suppression (a message carrying lakegate-id was delivered from
    the capture log already), a message without a usable body rejected
    [LG-amqp-body], one no subscription matches rejected
    [LG-amqp-no-subscription]; the link stays: the next message arrives."""
    edge, prefix = downlink()
    hub = edge.server.downlink
    topic = f"{prefix}/t"
    c = raw_subscriber(edge, f"{prefix}s", 5, topic, 1)
    own = cmd(topic, b"mine", 1)
    own.properties = {"lakegate-id": "mqtt-frames/0/7"}
    send(rabbitmq, f"/topic/{prefix}.t", own, cmd(topic, {"a": 1}, 1),
         cmd(f"{prefix}/nobody", b"x", 1), cmd(topic, b"after", 1))
    pub = c.packet()
    assert pub.endswith(b"after")
    wait_for(lambda: hub.stats["own"] == 1 and hub.rx.stats["rejected"] == 2, 10, "the outcomes")
    c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
    c.send(b"\xe0\x00")
    c.close()


def test_credit_follows_the_receive_maximum_MQTT_3_3_4_9(downlink, rabbitmq):
    """A client with Receive Maximum 2 that does not acknowledge: the edge
    holds at most 2 of its messages unsettled (the link's credit), the rest
    wait at the peer; each PUBACK lets one more come."""
    from bridge.mqtt import Properties

    edge, prefix = downlink()
    cid = f"{prefix}r"
    hub = edge.server.downlink
    topic = f"{prefix}/r"
    c = raw_subscriber(edge, cid, 5, topic, 1, properties=Properties(receive_maximum=2))
    link_ready(edge, CLIENT_ADDRESS.format(client_id=cid))
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", *[cmd(topic, b"m%d" % i, 1) for i in range(6)])
    first = [c.packet(), c.packet()]
    holds_for(lambda: hub.rx.stats["received"] == 2, 0.5,  # no more credit than the window [MQTT-3.3.4-9]
              "at most Receive Maximum messages received")
    for p in first:
        c.send(b"\x40\x02" + p[4 + len(topic):6 + len(topic)])
    got = [c.packet() for _ in range(2)]
    assert [p[-2:] for p in first + got] == [b"m0", b"m1", b"m2", b"m3"]
    for p in got:
        c.send(b"\x40\x02" + p[4 + len(topic):6 + len(topic)])
    rest = [c.packet() for _ in range(2)]
    for p in rest:
        c.send(b"\x40\x02" + p[4 + len(topic):6 + len(topic)])
    wait_for(lambda: hub.rx.stats["accepted"] == 6, 10, "all six accepted")
    c.send(b"\xe0\x00")
    c.close()


def test_persistent_session_gets_what_arrived_while_away_MQTT_3_1_2_4(downlink, rabbitmq):
    """A persistent session keeps its address while the client is away (also
    when the same client had a clean session on it before): a
    command sent meanwhile waits (in its queue at the edge within the credit,
    beyond it at the peer) and reaches the client when it returns; it is
    accepted only at that PUBACK."""
    from bridge.mqtt import Properties

    edge, prefix = downlink()
    cid = f"{prefix}p"
    hub = edge.server.downlink
    topic = f"{prefix}/p"
    props = Properties(session_expiry_interval=300)
    address = CLIENT_ADDRESS.format(client_id=cid)
    c = raw_subscriber(edge, cid, 5, topic, 1)  # first a clean session: the queue is declared then
    link_ready(edge, address)
    c.send(b"\xe0\x00")
    c.close()
    wait_for(lambda: address not in hub.rx.links, 10, "the clean session's link gone")
    c = raw_subscriber(edge, cid, 5, topic, 1, clean=False, properties=props)
    link_ready(edge, address)  # RabbitMQ refuses an attach whose durability differs from the first
    c.send(b"\xe0\x00")
    c.close()
    wait_for(lambda: cid not in edge.server.clients, 10, "the client gone")
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"while-away", 1))
    wait_for(lambda: hub.rx.stats["received"] == 1, 10, "the command at the edge")
    assert hub.rx.stats["accepted"] == 0
    c = RawClient(edge.port, timeout=10)
    assert c.connect(5, client_id=cid, clean_start=False, properties=props)[2] == 1  # session present
    pub = c.packet()
    assert pub[0] == 0x32 and pub.endswith(b"while-away")
    c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "accepted at the PUBACK")
    c.send(b"\xe0\x00")
    c.close()


def test_a_refused_client_address_is_attached_again_after_a_backoff(downlink, rabbitmq, caplog):
    """RabbitMQ refuses the client's address while a queue of that name
    exists with other durability (PRECONDITION_FAILED, it ends the session):
    the edge logs it and attaches again with backoff, so once the operator
    deleted that queue the client receives its commands."""
    from proton.utils import BlockingConnection

    edge, prefix = downlink()
    cid = f"{prefix}x"
    hub = edge.server.downlink
    address = CLIENT_ADDRESS.format(client_id=cid)
    conn = BlockingConnection(rabbitmq)  # something else declared it non-durable
    conn.create_receiver(address)
    conn.close()
    topic = f"{prefix}/x"
    with caplog.at_level("ERROR", logger="bridge.amqp"):
        c = raw_subscriber(edge, cid, 5, topic, 1)
        wait_for(lambda: hub.rx.stats["refused"] >= 1, 15, "the link refused")
    assert "PRECONDITION_FAILED" in caplog.text and "attaching it again" in caplog.text
    subprocess.run([rabbitmqctl(), "-q", "delete_queue", f"mqtt.to.{cid}"], capture_output=True,
                   timeout=60)
    wait_for(lambda: address in hub.rx.links and address not in hub.rx.refused, 30,
             "the link attached again")
    send(rabbitmq, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"after", 1))
    pub = c.packet()
    assert pub[:1] == b"\x32" and pub.endswith(b"after")
    c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
    wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "accepted at the PUBACK")
    c.send(b"\xe0\x00")
    c.close()


def test_a_queue_of_the_operators_own_as_the_topic_link(run_edge, rabbitmq):
    """``amqp.downlink_topic_address`` = a named queue (RabbitMQ: bound to
    ``amq.topic`` by the operator, which leaves no server-named queue behind
    at each reconnection): messages on it reach subscribers by their ``to``;
    no leftover-queue warning for it."""
    prefix = f"dl{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}.downlink"
    try:
        edge = run_edge(f"amqp.url={rabbitmq}", "amqp.downlink=true", "amqp.client_address_template=",
                        f"amqp.downlink_topic_address=/queue/{queue}", "amqp.retry_backoff_s=0.1")
        hub = edge.server.downlink
        link_ready(edge, f"/queue/{queue}")
        topic = f"{prefix}/devices/1/cmd"
        c = raw_subscriber(edge, f"{prefix}s", 5, f"{prefix}/devices/+/cmd", 1)
        send(rabbitmq, f"/amq/queue/{queue}", cmd(topic, b"named", 1))
        pub = c.packet()
        assert pub[:1] == b"\x32" and pub.endswith(b"named")
        c.send(b"\x40\x02" + pub[4 + len(topic):6 + len(topic)])
        wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "accepted at the PUBACK")
        assert hub.rx.stats["leftover_queues"] == 0
        c.send(b"\xe0\x00")
        c.close()
    finally:
        ctl = rabbitmqctl()
        if ctl is not None:
            subprocess.run([ctl, "-q", "delete_queue", queue], capture_output=True, timeout=60)


@pytest.mark.slow
def test_the_peer_restarted_mid_flow_links_attach_again_nothing_accepted_undelivered(run_edge,
                                                                                    tmp_path_factory):
    """The tests' private RabbitMQ node stops and starts while the edge holds
    a QoS 1 command its client has not acknowledged. Afterwards the client's
    address and the topic link are attached again, the held command comes
    again (it was never accepted: the PUBACK of the copy sent before the
    restart settles nothing), the one acknowledged before the restart does
    not, and the peer's queue is empty only once the new copy is PUBACKed."""
    from tests.amqp.rabbitnode import RabbitNode, find_rabbitmq

    if find_rabbitmq() is None:
        pytest.skip("no RabbitMQ installation to start a private node from (scripts/services up)")
    node = RabbitNode(tmp_path_factory.mktemp("rabbit-edge-dl"))
    node.start()
    try:
        edge = run_edge(f"amqp.url={node.url}", "amqp.downlink=true",
                        f"amqp.client_address_template={CLIENT_ADDRESS}",
                        "amqp.downlink_topic_address=/topic/#", "amqp.retry_backoff_s=0.2")
        hub = edge.server.downlink
        cid = "restarted"
        address = CLIENT_ADDRESS.format(client_id=cid)
        topic = "devices/9/cmd"
        c = raw_subscriber(edge, cid, 5, topic, 1)
        link_ready(edge, address)
        link_ready(edge, "/topic/#")

        def pid_of(p: bytes) -> bytes:
            return p[4 + len(topic):6 + len(topic)]

        send(node.url, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"done", 1, durable=True))
        done = c.packet()
        assert done.endswith(b"done")
        c.send(b"\x40\x02" + pid_of(done))
        wait_for(lambda: hub.rx.stats["accepted"] == 1, 10, "the first command accepted")
        send(node.url, f"/amq/queue/mqtt.to.{cid}", cmd(topic, b"held", 1, durable=True))
        held = c.packet()
        assert held.endswith(b"held")  # no PUBACK yet

        node.stop()
        node.start()
        wait_for(lambda: hub.rx.stats["reconnects"] >= 1 and address in hub.rx.links
                 and "/topic/#" in hub.rx.links, 60, "both links attached again")
        again = c.packet()
        assert again[:1] == b"\x32" and again.endswith(b"held"), (again, hub.stats, hub.rx.stats,
                                                                   node._ctl("list_queues", "-q", "name", "messages").stdout)
        c.send(b"\x40\x02" + pid_of(held))  # the copy from before: its delivery is gone
        holds_for(lambda: hub.rx.stats["accepted"] == 1, 0.3, "the old copy's PUBACK settles nothing")
        queued = node._ctl("list_queues", "-q", "name", "messages").stdout
        assert f"mqtt.to.{cid}\t1" in queued, queued  # still the peer's, unacknowledged
        c.send(b"\x40\x02" + pid_of(again))
        wait_for(lambda: hub.rx.stats["accepted"] == 2, 10, "the new copy accepted at its PUBACK")
        wait_for(lambda: f"mqtt.to.{cid}\t0" in node._ctl("list_queues", "-q", "name",
                                                           "messages").stdout, 10, "the queue empty")

        send(node.url, f"/topic/devices.9.cmd", cmd(topic, b"via-topic", 0))
        assert c.packet().endswith(b"via-topic")  # the topic link works again
        c.send(b"\xe0\x00")
        c.close()
    finally:
        node.close()
