"""Issue 39's walk-through with a back end that is not python-qpid-proton:
the Qpid protonj2 client (Java, ``tests/amqp/javaclient.py``) consumes what
the edge forwards and sends the commands, so that an encoding only proton
accepts cannot hide on either side.

One edge in this process, as ``lakegate edge`` runs it with
``amqp.forward_by = "edge"`` and ``amqp.downlink = true`` (the live
forwarder attached to its capture log), against each peer:

* **forward**: an MQTT 5 client publishes with every MQTT 5 property the
  mapping carries; the Java receiver on the peer's topic wildcard gets the
  message and each field is checked as protonj2 decodes it, AMQP types
  included (message-id ulong, x-qos int, x-retain boolean, the Payload
  Format Indicator ubyte, User Properties as string application
  properties);
* **downlink**: the Java sender sends a command with typed application
  properties (uint, boolean, string), content-type, correlation-id and
  reply-to, to the topic address and to the client's own address; the
  MQTT 5 subscriber gets exactly what the reverse mapping promises
  (docs/amqp-to-mqtt.md, "Reverse mapping") and nothing else, once, and the Java sender
  sees ``accepted``.

Peers: ``rabbitmq`` (3.10, ``scripts/services``; its addresses
``/topic/<routing key>``, ``/queue/mqtt.to.<client id>``) and ``artemis``
(ActiveMQ Artemis on 127.0.0.1:5673, ``topic://`` multicast and
``queue://`` anycast prefixes), skipped with the reason when nothing
answers there (``ARTEMIS_PORT`` names another port).

Without Java 17 or the protonj2 jars (``scripts/bootstrap`` puts them in
``.jvm/lib/protonj2/``) the tests skip and say why, except under CI
(``CI=true``), where ``scripts/test`` has bootstrapped them: there they fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import Endpoint

from bridge.amqp.live import LiveForwarder
from bridge.amqp.mapping import routing_key
from bridge.config import load_config
from bridge.edge.thread import EdgeThread
from tests.amqp import javaclient
from tests.amqp.conftest import rabbitmqctl
from tests.amqp.javaclient import body_bytes, data, typed
from tests.conftest import AMQP_URL
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.subprocess, pytest.mark.slow]

ARTEMIS = ("127.0.0.1", int(os.environ.get("ARTEMIS_PORT", "5673")))
ARTEMIS_URL = f"amqp://guest:guest@{ARTEMIS[0]}:{ARTEMIS[1]}"  # scripts/services: guest/guest or anonymous


@dataclass(frozen=True)
class Peer:
    """A peer's address forms (``{routing_key}``, ``{prefix}``, ``{client_id}``)."""

    name: str
    url: str
    #: ``amqp.address_template``: forwarding, a command's topic address, reply-to
    topic: str
    #: every topic under a test's prefix: the Java receiver's and the edge's topic link
    wildcard: str
    #: ``amqp.client_address_template``: the edge's link for a client
    client_link: str
    #: where a back end sends to a client's own address
    client_send: str


PEERS = {
    "rabbitmq": Peer("rabbitmq", AMQP_URL, "/topic/{routing_key}", "/topic/{prefix}.#",
                     "/queue/mqtt.to.{client_id}", "/amq/queue/mqtt.to.{client_id}"),
    "artemis": Peer("artemis", ARTEMIS_URL, "topic://{routing_key}", "topic://{prefix}.#",
                    "queue://mqtt.to.{client_id}", "queue://mqtt.to.{client_id}"),
}


def _answers(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=2):
            return True
    except OSError:
        return False


def _need_java_client() -> None:
    ok = javaclient.available()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{ok.reason} (CI runs scripts/test, whose bootstrap provides it)")
        pytest.skip(ok.reason)


@pytest.fixture(scope="module")
def made_on_rabbitmq():
    """Test prefixes used on RabbitMQ; at the end, the queues they left
    (the receivers' server-named queues bound under the prefix, which
    RabbitMQ 3.x keeps, and the clients' ``mqtt.to.<prefix>...`` queues)
    are deleted. Best effort, once for the module (rabbitmqctl is slow)."""
    prefixes: list[str] = []
    yield prefixes
    ctl = rabbitmqctl()
    if not prefixes or ctl is None:
        return
    run = lambda *a: subprocess.run([ctl, "-q", *a], capture_output=True, text=True, timeout=60)  # noqa: E731
    doomed = set()
    for line in run("list_bindings", "destination_name", "routing_key").stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and any(parts[1].startswith(f"{p}.") for p in prefixes):
            doomed.add(parts[0])
    doomed.update(n for n in run("list_queues", "name").stdout.split() if any(p in n for p in prefixes))
    for name in doomed:
        run("delete_queue", name)


@pytest.fixture(params=sorted(PEERS))
def peer(request) -> Peer:
    _need_java_client()
    p = PEERS[request.param]
    if p.name == "rabbitmq":
        request.getfixturevalue("rabbitmq")  # tests/conftest.py: fails (or skips, opted in) when down
        request.getfixturevalue("made_on_rabbitmq")
    elif not _answers(ARTEMIS):
        pytest.skip(f"no AMQP peer answers on {ARTEMIS[0]}:{ARTEMIS[1]} (ActiveMQ Artemis: scripts/services "
                    "starts it; ARTEMIS_PORT names another port)")
    return p


@dataclass
class Walk:
    peer: Peer
    prefix: str
    edge: EdgeThread

    @property
    def hub(self):
        return self.edge.server.downlink

    def topic_address(self, topic: str) -> str:
        return self.peer.topic.format(routing_key=routing_key(topic))


def attached(edge: EdgeThread, address: str) -> bool:
    """The edge's receiving link on ``address`` is attached at the peer too:
    the receiver lists a link from its own attach on, and what is sent to a
    topic before the peer has bound the link's queue reaches no one."""
    link = edge.server.downlink.rx.links.get(address)
    return link is not None and bool(link.state & Endpoint.REMOTE_ACTIVE)


def edge_config(peer: Peer, data_dir, prefix: str, container_id: str):
    """``lakegate edge`` with forwarding and the downlink on ``peer``, the
    topic link on this test's prefix only."""
    cfg = load_config(None, [
        f"data_dir={data_dir}", "edge.port=0", "capture.fsync_interval_ms=2", "log_level=WARNING",
        f"amqp.url={peer.url}", f"amqp.peer={peer.name}", "amqp.forward_by=edge", "amqp.downlink=true",
        f"amqp.downlink_topic_address={peer.wildcard.format(prefix=prefix)}",
        f"amqp.container_id={container_id}",
        "amqp.retry_backoff_s=0.1", "amqp.disposition_timeout_s=10",
    ], env={})
    # amqp.peer alone gives the address forms (bridge/peers.py, the docs' "settings that work")
    assert (cfg.amqp.address_template, cfg.amqp.client_address_template) == (peer.topic, peer.client_link)
    return cfg


@pytest.fixture
def walk(peer, tmp_path, request):
    """The edge with live forwarding and the downlink on, for ``peer``.
    A container-id of the test's own: on Artemis the edge's topic link is a
    subscription named after it: two tests' edges never share one."""
    prefix = f"jc{uuid.uuid4().hex[:8]}"
    if peer.name == "rabbitmq":
        request.getfixturevalue("made_on_rabbitmq").append(prefix)
    cfg = edge_config(peer, tmp_path / "data", prefix, container_id=prefix)
    edge = EdgeThread(cfg).start()
    live = LiveForwarder(cfg)  # what bridge/commands/edge.py does with forward_by = "edge"
    live.attach(edge.server.log)
    live.start()
    try:
        wait_for(lambda: attached(edge, peer.wildcard.format(prefix=prefix)), 15, "the edge's topic link")
        yield Walk(peer, prefix, edge)
    finally:
        edge.stop()
        live.stop(drain_s=0)


class Mqtt5:
    """A paho MQTT 5 client on the edge; what it receives is in ``got``."""

    def __init__(self, port: int, client_id: str) -> None:
        self.got: list[Any] = []
        self.granted: list[Any] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.c.on_message = lambda _c, _u, m: self.got.append(m)
        self.c.on_subscribe = lambda _c, _u, _mid, codes, _p: self.granted.extend(codes)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self.c.subscribe(topic_filter, qos=qos)
        wait_for(lambda: self.granted, 10, "the SUBACK")
        assert [int(g.value) for g in self.granted] == [qos]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def mqtt_properties(msg) -> dict[str, Any]:
    """Every MQTT 5 property a received PUBLISH carries, by paho's name."""
    p = msg.properties
    if p is None:
        return {}
    return {n.replace(" ", ""): getattr(p, n.replace(" ", "")) for n in p.names
            if hasattr(p, n.replace(" ", ""))}


# ---------------------------------------------------------------- MQTT -> AMQP


def test_a_publish_from_mqtt5_arrives_as_protonj2_decodes_it(walk):
    """The forward mapping's fields (docs/amqp.md, "Mapping, profile seed") as a
    Java client decodes them, types included."""
    prefix, peer = walk.prefix, walk.peer
    topic, reply = f"{prefix}/devices/7/telemetry", f"{prefix}/devices/7/reply"
    payload = b'{"t": 21.5}'
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "application/json"
    props.CorrelationData = b"\x00\x01corr"
    props.ResponseTopic = reply
    props.UserProperty = [("site", "north"), ("unit", "C"), ("site", "south")]  # a key twice
    props.PayloadFormatIndicator = 1
    props.MessageExpiryInterval = 3600

    with javaclient.receive(peer.url, peer.wildcard.format(prefix=prefix), 1) as got:
        device = Mqtt5(walk.edge.port, f"{prefix}-dev7")
        try:
            info = device.c.publish(topic, payload, qos=1, retain=True, properties=props)
            info.wait_for_publish(10)  # PUBACK: captured
        finally:
            device.close()
    (m,) = got.messages

    header = m["header"]
    assert header["durable"] is True  # QoS 1
    assert 3_590_000 <= header["ttl"] <= 3_600_000  # Message Expiry Interval, remaining ms
    assert header["delivery_count"] in (None, 0)  # DUP 0
    assert header["priority"] is None

    p = m["properties"]
    assert p["subject"] == "publish"
    assert p["to"] == topic  # verbatim
    assert p["message_id"] == typed("ulong", info.mid)  # the packet identifier
    assert p["content_type"] == "application/json"
    assert p["correlation_id"] == typed("binary", b"\x00\x01corr")
    assert p["reply_to"] == walk.topic_address(reply)
    assert p["absolute_expiry_time"] is None  # ttl holds the lifetime
    assert (p["user_id"], p["content_encoding"], p["group_id"]) == (None, None, None)

    ann = m["message_annotations"] or {}
    lakegates = {k: v for k, v in ann.items() if k in ("x-qos", "x-retain") or k.startswith("x-opt-mqtt-")}
    pair = lambda k, v: typed("list", [typed("string", k), typed("string", v)])  # noqa: E731
    assert lakegates == {
        "x-qos": typed("int", 1),
        "x-retain": typed("boolean", True),
        "x-opt-mqtt-payload-format-indicator": typed("ubyte", 1),
        # a key repeats: every User Property, in order, as a list of [key, value] lists
        "x-opt-mqtt-user-properties": typed("list", [pair("site", "north"), pair("unit", "C"),
                                                     pair("site", "south")]),
    }

    app = dict(m["application_properties"] or {})
    lid = app.pop("lakegate-id")
    assert lid["type"] == "string" and lid["value"].startswith("mqtt-frames/")
    assert app == {"site": typed("string", "north"), "unit": typed("string", "C")}  # each key's first value

    assert [s["kind"] for s in m["body"]] == ["data"] and body_bytes(m) == payload

    # the edge's topic link got it too, and dropped it (loop suppression)
    wait_for(lambda: walk.hub.stats["own"] >= 1, 15, "the forwarded message dropped as the edge's own")


# ---------------------------------------------------------------- AMQP -> MQTT

COMMANDS = {
    # to the topic address: correlation-id binary, message-id ulong
    "topic": dict(correlation=typed("binary", b"\x07req-42"), correlation_data=b"\x07req-42",
                  message_id=typed("ulong", 42)),
    # to the client's own address: correlation-id and message-id strings, as JMS-minded back ends send
    "client": dict(correlation=typed("string", "req-43"), correlation_data=b"req-43",
                   message_id=typed("string", "cmd-43")),
}


@pytest.mark.parametrize("route", sorted(COMMANDS))
def test_a_command_from_protonj2_reaches_an_mqtt5_subscriber_exactly(walk, route):
    """Sent with typed application properties (uint, boolean, string),
    content-type, correlation-id and reply-to: the subscriber gets those as
    the reverse mapping says, nothing else, once; the sender sees accepted."""
    prefix, peer, hub = walk.prefix, walk.peer, walk.hub
    cid = f"{prefix}-dev7"
    topic, reply = f"{prefix}/devices/7/cmd", f"{prefix}/devices/7/reply"
    case = COMMANDS[route]
    device = Mqtt5(walk.edge.port, cid)
    try:
        device.subscribe(topic, 1)
        if route == "client":
            own = peer.client_link.format(client_id=cid)
            wait_for(lambda: attached(walk.edge, own), 15, f"the edge's link on {own}")
            address = peer.client_send.format(client_id=cid)
        else:
            wait_for(lambda: walk.edge.server.router.count(cid), 10, "the subscription")
            address = walk.topic_address(topic)
        command = {
            "header": {"durable": True},
            "properties": {"message_id": case["message_id"], "to": topic, "content_type": "text/plain",
                           "correlation_id": case["correlation"], "reply_to": walk.topic_address(reply)},
            "message_annotations": {"x-qos": typed("int", 1)},
            "application_properties": {"attempt": typed("uint", 7), "urgent": typed("boolean", True),
                                       "who": typed("string", "ops")},
            "body": data(b"reboot"),
        }

        assert javaclient.send(peer.url, address, command) == {"outcome": "accepted"}

        try:
            (msg,) = wait_for(lambda: device.got, 15, "the command at the subscriber")
        except AssertionError as exc:  # what the edge saw says where it went
            raise AssertionError(f"{exc}; the edge's downlink: {hub.stats}, its receiver: {hub.rx.stats}") from None
        assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"reboot", 1, False)
        assert mqtt_properties(msg) == {
            "ContentType": "text/plain",
            "CorrelationData": case["correlation_data"],
            "ResponseTopic": reply,
            "UserProperty": [("attempt", "7"), ("urgent", "true"), ("who", "ops")],
        }
        # the edge accepts its delivery at the PUBACK (paho sends it at once); nothing comes again
        wait_for(lambda: hub.rx.stats["accepted"] >= 1, 10, "the edge's delivery accepted")
        holds_for(lambda: len(device.got) == 1 and hub.stats["rejected"] == 0, 0.5,
                  "the command delivered once, nothing rejected")
    finally:
        device.close()


# ---------------------------------------------------------------- found on the way


@pytest.fixture
def artemis() -> Peer:
    if not _answers(ARTEMIS):
        pytest.skip(f"no AMQP peer answers on {ARTEMIS[0]}:{ARTEMIS[1]} (ActiveMQ Artemis)")
    return PEERS["artemis"]


def test_the_topic_link_attaches_for_an_edge_started_after_another_stopped(artemis, tmp_path):
    """Two edges of one container-id, one after the other in one process,
    each with its own topic address (as after a restart with a narrower
    ``amqp.downlink_topic_address``): the second one's topic link attaches.
    It did not, for three defects together: the topic link's terminus was
    durable on Artemis (a durable subscription named after the link, kept
    for ever; now volatile for the peer's ``subscription_prefixes``); a
    stop closed the connection and stopped the container in one turn, so
    the close never left (now it waits for the peer's answer, at most
    ``STOP_GRACE_S``); and the refusal that followed was ignored (``is not``
    between two proton wrappers of one link; now ``!=``, which compares the
    C link): no log, no count, never attached again."""
    container_id = f"jc{uuid.uuid4().hex[:8]}"
    for n in range(2):
        prefix = f"jc{uuid.uuid4().hex[:8]}"
        edge = EdgeThread(edge_config(artemis, tmp_path / f"data{n}", prefix, container_id)).start()
        try:
            wait_for(lambda: attached(edge, artemis.wildcard.format(prefix=prefix)), 5,
                     f"edge {n + 1}'s topic link (refused: {edge.server.downlink.rx.stats['refused']})")
        finally:
            edge.stop()
