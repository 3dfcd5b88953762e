"""Order across QoS levels: messages of one MQTT connection (one capture
partition, in capture order) to one topic reach the AMQP peer in that order,
although QoS 0/1 and QoS 2 travel on two links per address (the seed's
design). MQTT 5.0 section 4.6 asks only for order per topic and QoS level
[MQTT-4.6.0-5] (every topic ordered by default, [MQTT-4.6.0-6]);
lakegate keeps order per topic across QoS levels, not across topics (resends
excepted; see docs/amqp.md, Order)."""

from __future__ import annotations

import pytest

from bridge.amqp.mapping import ID_PROPERTY
from bridge.amqp.sender import Forwarder
from bridge.config import load_config
from tests.amqp.peer import FakePeer
from tests.amqp.rows import row


def mixed(topics: list[str], n: int) -> list[dict]:
    """One connection's PUBLISHes cycling QoS 0, 1, 2 (each QoS 2 followed by its PUBREL) over ``topics``."""
    out, off = [], 0
    for i in range(n):
        topic, qos = topics[i % len(topics)], i % 3
        out.append(row(topic, off, qos=qos, packet_id=None if qos == 0 else i % 65535 + 1, payload=b"%d" % i))
        off += 1
        if qos == 2:
            out.append(row(topic, off, kind="pubrel", packet_id=i % 65535 + 1))
            off += 1
    return out


def ids(rows: list[dict]) -> list[str]:
    return [f"{r['stream']}/{r['partition']}/{r['offset']}" for r in rows]


def per_topic(keys: list[str], rows: list[dict]) -> dict[str, list[str]]:
    topic_of = {f"{r['stream']}/{r['partition']}/{r['offset']}": r["topic"] for r in rows}
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(topic_of[k], []).append(k)
    return out


def test_mqtt_4_6_0_5_mixed_qos_messages_of_a_topic_go_out_on_the_wire_in_the_order_given():
    batch = mixed(["a/b", "c"], 300)
    later = [dict(r, offset=r["offset"] + 10000, seq=r["seq"] + 10000) for r in mixed(["a/b", "c"], 30)]
    with FakePeer() as peer:
        cfg = load_config(None, [f"amqp.url={peer.url}", "amqp.max_retries=1"], env={}).amqp
        with Forwarder(cfg) as fwd:
            res = fwd.forward(batch)
            assert res.accepted + res.qos0 == len(batch)
            assert peer.wait(lambda p: len(p.messages) == len(batch))
            fwd.forward(later)  # links already attached: the same
            assert peer.wait(lambda p: len(p.messages) == len(batch) + len(later))
    got = [m["message"].properties[ID_PROPERTY] for m in peer.messages]
    assert per_topic(got, batch + later) == per_topic(ids(batch + later), batch + later)
    assert len({m["link"] for m in peer.messages}) == 4  # still two links per address


@pytest.mark.broker
def test_mqtt_4_6_0_5_a_rabbitmq_consumer_receives_a_topics_mixed_qos_messages_in_publish_order(consumer, make_config):
    topic = consumer.topic("order")
    batch = mixed([topic], 600)
    with Forwarder(make_config()) as fwd:
        fwd.forward(batch)
    got = [m.properties[ID_PROPERTY] for m in consumer.wait(topic, len(batch))]
    assert got == ids(batch)
