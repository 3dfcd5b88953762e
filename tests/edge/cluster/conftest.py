"""Edges of one cluster on the real Kafka of scripts/services, in this
process (``EdgeThread``; the tests of whole ``lakegate edge`` processes are
in ``tests/edge/cluster/test_processes.py``)."""

from __future__ import annotations

import pytest

from bridge.mqtt import Properties, Subscribe, encode
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.subscribe import Subscription


def cluster_config(kafka: str, topic: str, data_dir, edge_id: int, edges: int, *extra: str):
    from bridge.config import load_config

    return load_config(None, [f"data_dir={data_dir}", "edge.port=0", "capture.backend=kafka",
                              f"kafka.bootstrap_servers={kafka}", f"kafka.topic={topic}", "kafka.create_topic=true",
                              f"capture.partitions={2 * edges}", f"cluster.edges={edges}",
                              f"cluster.edge_id={edge_id}", "amqp.url=", *extra], env={})


@pytest.fixture
def make_cluster(kafka, kafka_topic, tmp_path):
    """A function: (edges, extra --set items) -> the started EdgeThreads of one
    cluster (a topic of the test's own), stopped after the test."""
    from bridge.edge.thread import EdgeThread

    started = []

    def make(n: int = 2, *extra: str):
        topic = kafka_topic("lg-cluster")
        out = []
        for i in range(n):
            e = EdgeThread(cluster_config(kafka, topic, tmp_path / f"edge{i}", i, n, *extra)).start()
            started.append(e)
            out.append(e)
        return out

    yield make
    for e in reversed(started):
        e.stop()


def subscribe(client, level: int, *subs: tuple, packet_id: int = 1, sub_id: int | None = None) -> list[int]:
    """SUBSCRIBE (``subs``: (filter, qos) or (filter, qos, no_local, rap, rh)); the SUBACK's codes."""
    props = Properties(subscription_identifiers=[sub_id]) if sub_id else Properties()
    p = Subscribe(packet_id, [Subscription(*s) for s in subs], props)
    client.send(encode(p, level))
    ack, _n = decode_packet(client.packet(), level, from_client=False)
    return list(ack.reason_codes)


def receive(client, level: int):
    """The next packet from the edge, decoded (None: closed)."""
    pkt = client.packet()
    if not pkt:
        return None
    return decode_packet(pkt, level, from_client=False)[0]
