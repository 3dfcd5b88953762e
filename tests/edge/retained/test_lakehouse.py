"""Retained messages served to new subscribers from the lakehouse, against a
real ``lakegate run`` (edge + job, forwarding off) with paho-mqtt and
``mosquitto_sub``: set, replaced, cleared, expired, RETAIN 0 after a
retained message, Retain Handling 0/1/2, wildcards with ``#`` and
``$``-topics, a client that publishes retained and subscribes at once,
a restart, a table compacted and vacuumed meanwhile; and, with the edge
alone (no job ever ran), the same from its capture log only. The module
runs twice: on the local capture log, and on Kafka (the one-node Kafka of
``scripts/services``, a topic of the module's own): the edge's overlay then
comes from the topic after the table's coverage, in Kafka offsets.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from bridge.tables.deltars import DeltaRsEngine
from tests.conftest import delete_kafka_topics
from tests.edge.test_subscribers import Client
from tests.job.test_run import Run
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.slow]
MOSQ = shutil.which("mosquitto_sub")


@pytest.fixture(scope="module", params=["local", "kafka"])
def capture(request):
    """The capture log of the module's ``lakegate run``: the settings for it."""
    if request.param == "local":
        yield []
        return
    bootstrap = request.getfixturevalue("kafka")
    topic = f"lg-lakehouse-{uuid.uuid4().hex[:10]}"
    yield ["capture.backend=kafka", f"kafka.bootstrap_servers={bootstrap}", f"kafka.topic={topic}",
           "kafka.create_topic=true"]
    delete_kafka_topics(bootstrap, [topic])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, capture):
    return tmp_path_factory.mktemp("lakehouse") / "data"


@pytest.fixture(scope="module")
def run(data_dir, capture):
    r = Run(data_dir, "amqp.url=", "edge.retained_refresh_s=0.5", *capture)
    yield r
    assert r.stop() == 0, "".join(r.err)[-2000:]


@pytest.fixture
def clients(run):
    made: list[Client] = []

    def make(level: int, client_id: str, port: int | None = None, **kw) -> Client:
        c = Client(port or run.port, level, client_id, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def in_table(data_dir, topics: dict[str, bytes | None], timeout: float = 60) -> None:
    """Wait until the job's retained table holds ``topics`` (None: a tombstone)."""
    engine = DeltaRsEngine(data_dir / "tables")

    def check():
        try:
            rows = {r["topic"]: r for r in engine.arrow("retained").to_pylist()}
        except Exception:
            return None
        for t, want in topics.items():
            r = rows.get(t)
            if r is None or (want is None) != bool(r["deleted"]) or (want is not None and r["payload"] != want):
                return None
        return rows
    wait_for(check, timeout, f"the job's retained table to hold {sorted(topics)}")


def retained_of(c: Client, n: int) -> dict[str, bytes]:
    got = c.wait_count(n)
    assert all(m.retain for m in got[:n])
    return {m.topic: m.payload for m in got}


def test_mqtt_3_3_1_5_to_8_set_replaced_cleared_and_retain_0_from_the_table(run, data_dir, clients):
    pub = clients(4, "t1-pub")
    for topic, payload, retain in [("t1/a", b"v1", True), ("t1/a", b"v2", True),
                                   ("t1/b", b"x", True), ("t1/b", b"", True),
                                   ("t1/c", b"kept", True), ("t1/c", b"live only", False)]:
        pub.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
    in_table(data_dir, {"t1/a": b"v2", "t1/b": None, "t1/c": b"kept"})
    sub = clients(4, "t1-sub")
    assert sub.subscribe(("t1/#", 1)) == [1]
    got = retained_of(sub, 2)
    # replaced [MQTT-3.3.1-5], cleared [MQTT-3.3.1-6/-7], RETAIN 0 stored nothing [MQTT-3.3.1-8 (5.0)]
    assert got == {"t1/a": b"v2", "t1/c": b"kept"}
    sub.publish("t1/a", b"live", qos=1)
    msgs = sub.wait_for_payload(b"live")
    assert len(msgs) == 3 and not msgs[-1].retain  # a live message: RETAIN 0 [MQTT-3.3.1-9 (3.1.1)]


@pytest.mark.skipif(not MOSQ, reason="mosquitto_sub not installed (scripts/services up installs it)")
def test_mqtt_3_3_1_8_mosquitto_sub_gets_them_with_the_retain_flag(run, clients):
    pub = clients(4, "t2-pub")
    pub.publish("t2/x", b"forty-two", qos=1, retain=True).wait_for_publish(10)
    out = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(run.port), "-t", "t2/#",
                          "-C", "1", "-W", "20", "-q", "1", "-F", "%t|%p|%r|%q"],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == ["t2/x|forty-two|1|1"], out.stderr


def test_mqtt_3_3_2_5_an_expired_retained_message_is_not_sent(run, clients):
    pub = clients(5, "t3-pub")
    props = PahoProperties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 1
    pub.publish("t3/short", b"gone soon", qos=1, retain=True, props=props).wait_for_publish(10)
    pub.publish("t3/long", b"stays", qos=1, retain=True).wait_for_publish(10)
    t0 = time.monotonic()
    wait_for(lambda: time.monotonic() - t0 > 2.2, 5, "the 1 s Message Expiry Interval to pass")
    sub = clients(5, "t3-sub")
    sub.subscribe(("t3/#", 1))
    got = sub.wait_for_payload(b"stays")
    assert [m.topic for m in got] == ["t3/long"]


def test_mqtt_3_3_1_9_to_11_retain_handling(run, clients):
    pub = clients(5, "t4-pub")
    pub.publish("t4/r", b"r", qos=1, retain=True).wait_for_publish(10)
    sub = clients(5, "t4-sub")
    for rh, pid_expect in ((0, 1), (0, 2), (1, 2), (2, 2)):
        sub.subscribe(("t4/#", SubscribeOptions(qos=1, retainHandling=rh)))
        wait_for(lambda: len(sub.messages()) >= pid_expect, 10, f"retain handling {rh}")
    sub.subscribe(("t4/other/#", SubscribeOptions(qos=1, retainHandling=1)))  # new: would send
    sub.subscribe(("t4/+", SubscribeOptions(qos=1, retainHandling=1)))  # new: sends t4/r
    got = sub.wait_count(3)
    assert [m.topic for m in got] == ["t4/r"] * 3 and all(m.retain for m in got)
    sub2 = clients(5, "t4-sub2")
    sub2.subscribe(("t4/#", SubscribeOptions(qos=1, retainHandling=2)))  # [MQTT-3.3.1-11]
    sub2.publish("t4/mark", b"m", qos=1)
    assert [m.payload for m in sub2.wait_for_payload(b"m")] == [b"m"]


def test_mqtt_4_7_2_1_wildcards_and_dollar_topics(run, clients):
    pub = clients(4, "t5-pub")
    for t in ("$t5/sys", "t5/a/b", "t5"):
        pub.publish(t, t.encode(), qos=1, retain=True).wait_for_publish(10)
    sub = clients(4, "t5-sub")
    sub.subscribe(("+/a/b", 1))
    assert retained_of(sub, 1) == {"t5/a/b": b"t5/a/b"}
    sub2 = clients(4, "t5-sub2")
    sub2.subscribe(("$t5/#", 1), ("t5/#", 1))  # "t5/#" matches "t5" too [MQTT-4.7.1-1]
    assert retained_of(sub2, 3) == {"$t5/sys": b"$t5/sys", "t5/a/b": b"t5/a/b", "t5": b"t5"}
    sub3 = clients(4, "t5-sub3")
    sub3.subscribe(("#", 1))
    got = sub3.wait_for_payload(b"t5/a/b")
    assert not any(m.topic.startswith("$") for m in got)  # [MQTT-4.7.2-1]


def test_a_client_that_publishes_retained_and_subscribes_at_once_gets_it(run, clients):
    c = clients(5, "t6-both")
    c.publish("t6/now", b"mine", qos=1, retain=True)  # no wait for the PUBACK
    c.subscribe(("t6/#", 1))
    got = c.wait_for_payload(b"mine")
    assert got[0].retain and got[0].topic == "t6/now"


def test_a_table_compacted_and_vacuumed_meanwhile(run, data_dir, clients):
    pub = clients(4, "t7-pub")
    for i in range(20):
        pub.publish(f"t7/{i}", b"v%d" % i, qos=1, retain=True).wait_for_publish(10)
    in_table(data_dir, {f"t7/{i}": b"v%d" % i for i in range(20)})
    engine = DeltaRsEngine(data_dir / "tables")
    engine.compact()
    engine.vacuum(0)  # every file the compaction replaced is gone
    before = len(run.lines) + len(run.err)
    wait_for(lambda: any("retained: serving table version" in x for x in (run.lines + run.err)[before:]),
             30, "the edge to serve the compacted version")
    sub = clients(4, "t7-sub")
    sub.subscribe(("t7/#", 1))
    assert retained_of(sub, 20) == {f"t7/{i}": b"v%d" % i for i in range(20)}


def test_after_a_restart_the_index_is_rebuilt_from_the_table_and_the_log(run, data_dir, capture):
    pub = Client(run.port, 4, "t8-pub")
    pub.publish("t8/late", b"just before", qos=1, retain=True).wait_for_publish(10)
    pub.close()
    assert run.stop() == 0
    again = Run(data_dir, "amqp.url=", "edge.retained_refresh_s=0.5", *capture)
    try:
        sub = Client(again.port, 4, "t8-sub")
        sub.subscribe(("t1/#", 1), ("t8/#", 1), ("t7/1", 1))
        got = retained_of(sub, 4)
        assert got == {"t1/a": b"v2", "t1/c": b"kept", "t8/late": b"just before", "t7/1": b"v1"}
        sub.close()
    finally:
        assert again.stop() == 0, "".join(again.err)[-2000:]
