"""The AMQP downlink receiver (bridge/amqp/receiver.py) on the real
RabbitMQ 3.x: messages mapped as MQTT, each outcome as the peer sees it,
credit as the window, lakegate's own messages recognised.

With a broker in between, a producer's disposition is the broker's (given
when the message is queued); what the receiver settles is the broker's
delivery to it, so the outcomes are checked by what the broker does next:
an accepted or rejected message is gone, a released or modified one comes
again."""

from __future__ import annotations

import queue
import subprocess
import threading
import uuid

import pytest
from proton import Message, symbol
from proton.utils import BlockingConnection

from bridge.amqp.receiver import DownlinkReceiver
from bridge.amqp.reverse import OWN, ReverseMappingError
from tests.amqp.conftest import rabbitmqctl
from tests.waiting import holds_for, wait_for

pytestmark = pytest.mark.broker


class Got:
    """What the receiver handed over, with a settle policy per message."""

    def __init__(self) -> None:
        self.items: list = []
        self.lock = threading.Lock()
        self.policy = lambda result: None  # None: leave unsettled

    def __call__(self, address, result, token) -> None:
        with self.lock:
            self.items.append((address, result, token))
        outcome = self.policy(result)
        if outcome is not None:
            self.receiver.settle(token, *outcome) if isinstance(outcome, tuple) \
                else self.receiver.settle(token, outcome)

    def results(self) -> list:
        with self.lock:
            return [r for _a, r, _t in self.items]


@pytest.fixture
def got(make_config):
    g = Got()
    r = DownlinkReceiver(make_config(), g).start()
    g.receiver = r
    assert r.ready.wait(15), "the receiver did not connect"
    yield g
    r.stop()


def send(url_host, address: str, *messages: Message) -> None:
    conn = BlockingConnection(url_host, timeout=15)
    try:
        s = conn.create_sender(address)
        for m in messages:
            s.send(m)
    finally:
        conn.close()


def payload_of(r) -> bytes:
    return r.payload if hasattr(r, "payload") else b""


def test_messages_sent_to_a_topic_arrive_as_mqtt(got, rabbitmq):
    prefix = f"dl{uuid.uuid4().hex[:8]}"
    got.policy = lambda r: "accepted"
    got.receiver.attach(f"/topic/{prefix}.#")
    wait_for(lambda: got.receiver.links, 15, "the link")
    m = Message(address=f"{prefix}/dev/7", body=b"on", durable=True,
                annotations={symbol("x-qos"): 2, symbol("x-retain"): True})
    send(rabbitmq, f"/topic/{prefix}.dev.7", m)
    (d,) = wait_for(lambda: got.results() or None, 15, "the message")
    assert (d.topic, d.payload, d.qos, d.retain) == (f"{prefix}/dev/7", b"on", 2, True)


@pytest.fixture
def queue_name(rabbitmq):
    """A fresh queue address; the queue is deleted afterwards."""
    import subprocess

    from tests.amqp.conftest import rabbitmqctl

    name = f"lgdl{uuid.uuid4().hex[:8]}"
    yield name
    ctl = rabbitmqctl()
    if ctl is not None:
        subprocess.run([ctl, "-q", "delete_queue", name], capture_output=True, timeout=60)


def marked(topic: str, body: bytes) -> Message:
    return Message(address=topic, body=body, durable=True)


@pytest.mark.parametrize("outcome, again", [("accepted", False), ("rejected", False),
                                            ("released", True)])
def test_each_outcome_as_the_peer_sees_it(got, rabbitmq, queue_name, outcome, again):
    """The first message gets ``outcome``; then everything is accepted. A
    released message comes again; an accepted or rejected one does not."""
    first = [True]

    def policy(result):
        if first[0]:
            first[0] = False
            return (outcome, "amqp:decode-error", "test") if outcome == "rejected" else outcome
        return "accepted"
    got.policy = policy
    got.receiver.attach(f"/queue/{queue_name}", credit=1)
    wait_for(lambda: got.receiver.links, 15, "the link")
    send(rabbitmq, f"/queue/{queue_name}", marked("o/1", b"first"), marked("o/2", b"marker"))
    want = [b"first", b"first", b"marker"] if again else [b"first", b"marker"]

    def payloads():
        return sorted(payload_of(r) for r in got.results())
    wait_for(lambda: payloads() == want or None, 15, f"{want}")
    if not again:  # nothing more may come (a redelivery would follow at once)
        holds_for(lambda: payloads() == want, 0.5, "no redelivery")
    assert payloads() == want  # (a released message may come back before or after the marker)
    assert got.receiver.stats[outcome] >= 1


def test_credit_is_the_window_no_more_unsettled_than_it(got, rabbitmq, queue_name):
    got.policy = lambda r: None  # hold every delivery
    got.receiver.attach(f"/queue/{queue_name}", credit=2)
    wait_for(lambda: got.receiver.links, 15, "the link")
    send(rabbitmq, f"/queue/{queue_name}", *(marked(f"c/{i}", b"%d" % i) for i in range(5)))
    wait_for(lambda: len(got.results()) >= 2, 15, "two deliveries")
    holds_for(lambda: len(got.results()) == 2, 0.5, "no more than the credit arrives")
    got.receiver.settle(got.items[0][2], "accepted")
    wait_for(lambda: len(got.results()) == 3, 15, "one more after one was settled")


def test_lakegate_own_messages_and_unusable_ones_are_told_apart(got, rabbitmq, queue_name):
    got.policy = lambda r: "accepted"
    got.receiver.attach(f"/queue/{queue_name}")
    wait_for(lambda: got.receiver.links, 15, "the link")
    own = marked("x/1", b"mine")
    own.properties = {"lakegate-id": "mqtt-frames/0/7"}
    send(rabbitmq, f"/queue/{queue_name}", own, Message(body=b"no topic"))
    results = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(got.results()), 15, "both")
    assert results[0] is OWN
    assert isinstance(results[1], ReverseMappingError) and results[1].rule == "LG-amqp-no-topic"


def test_rabbitmq_3_leaves_a_topic_receivers_queue_behind_and_the_receiver_says_so(got, rabbitmq,
                                                                                  caplog):
    """The premise of the receiver's warning, checked on the real RabbitMQ
    3.x (rabbitmq-server#2588): the queue of a ``/topic/...`` receiver stays,
    still bound, after the link ends; the receiver warns with the remedy
    when such a link opens."""
    ctl = rabbitmqctl()
    if ctl is None:
        pytest.skip("rabbitmqctl not found: cannot look at RabbitMQ's queues")
    key = f"lgleft{uuid.uuid4().hex[:8]}.#"

    def bound() -> list[str]:
        out = subprocess.run([ctl, "-q", "list_bindings", "destination_name", "routing_key"],
                             capture_output=True, text=True, timeout=60).stdout
        return [ln.split("\t")[0] for ln in out.splitlines() if ln.split("\t")[-1] == key]

    r = got.receiver
    try:
        with caplog.at_level("WARNING", logger="bridge.amqp"):
            r.attach(f"/topic/{key}")
            wait_for(lambda: r.stats["leftover_queues"] == 1, 15, "the warning for the topic link")
        assert "rabbitmq-server#2588" in caplog.text and "set_policy" in caplog.text
        r.detach(f"/topic/{key}")
        wait_for(lambda: f"/topic/{key}" not in r.links, 10, "the link gone")
        holds_for(lambda: len(bound()) == 1, 0.5, "the queue still there and bound: what the warning says",
                  poll=0.25)
    finally:
        for name in bound():
            subprocess.run([ctl, "-q", "delete_queue", name], capture_output=True, timeout=60)


@pytest.mark.slow
def test_the_peer_restarted_links_attach_again_and_nothing_unsettled_is_lost(tmp_path_factory):
    """The tests' private RabbitMQ node stops and starts while a message is
    held unsettled: after the reconnection the link is attached again and
    the held message comes again (it was never accepted)."""
    from bridge.config import load_config
    from tests.amqp.rabbitnode import RabbitNode, find_rabbitmq

    if find_rabbitmq() is None:
        pytest.skip("no RabbitMQ installation to start a private node from (scripts/services up)")
    node = RabbitNode(tmp_path_factory.mktemp("rabbit-dl"))
    node.start()
    g = Got()
    cfg = load_config(None, [f"amqp.url={node.url}", "amqp.retry_backoff_s=0.2"], env={}).amqp
    r = DownlinkReceiver(cfg, g).start()
    g.receiver = r
    try:
        assert r.ready.wait(30)
        q = f"lgdl{uuid.uuid4().hex[:8]}"
        r.attach(f"/queue/{q}", durable=True)  # a durable queue: it outlives the node's restart
        wait_for(lambda: r.links, 15, "the link")
        send(node.url, f"/amq/queue/{q}", marked("r/1", b"held"))  # the declared queue
        wait_for(lambda: g.results(), 15, "the message, held unsettled")
        node.stop()
        node.start()
        g.policy = lambda res: "accepted"
        got = wait_for(lambda: (lambda x: x if len(x) >= 2 else None)(g.results()), 90,
                       "the held message again after the restart")
        assert [payload_of(x) for x in got] == [b"held", b"held"]
        assert r.stats["reconnects"] >= 1
    finally:
        r.stop()
        node.close()
