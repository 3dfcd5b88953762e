"""Edges of one cluster on the real Kafka of scripts/services, in this
process (``EdgeThread``; the tests of whole ``lakegate edge`` processes are
in ``tests/edge/cluster/test_processes.py``)."""

from __future__ import annotations

import time

import pytest

from bridge.mqtt import Connack, Properties, Publish, Subscribe, encode
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.subscribe import Subscription
from tests.edge.conftest import RawClient
from tests.edge.util import publish


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


def slow_feed(edge, seconds: float) -> None:
    """Make ``edge`` (an EdgeThread of a cluster) read the other edges'
    records ``seconds`` late (each batch handed to its loop after a sleep
    on the feed's thread)."""
    import time

    feed = edge.server.feed
    hand = feed.on_records

    def late(records):
        time.sleep(seconds)
        hand(records)

    feed.on_records = late


KEEP = Properties(session_expiry_interval=600)


def connect_session(port: int, level: int, cid: str, clean: bool = False) -> tuple[RawClient, bool]:
    c = RawClient(port, timeout=20)
    fields = {"client_id": cid, "clean_start": clean}
    if level == 5:
        fields["properties"] = KEEP
    ack, _n = decode_packet(c.connect(level, **fields), level, from_client=False)
    assert isinstance(ack, Connack) and ack.reason_code == 0, ack
    return c, ack.session_present


def publish_each(port: int, level: int, topic: str, payloads, qos: int = 1, cid: str = "pub") -> None:
    p = RawClient(port)
    p.connect(level, client_id=cid)
    for i, body in enumerate(payloads):
        p.send(publish(level, topic=topic, payload=body, qos=qos, packet_id=i + 1))
        pkt = p.packet()
        if qos == 2:
            assert pkt[0] == 0x50
            p.send(bytes((0x62, 2, (i + 1) >> 8, (i + 1) & 0xFF)))
            pkt = p.packet()
            assert pkt[0] == 0x70
        elif qos == 1:
            assert pkt[0] == 0x40
    p.send(bytes((0xE0, 0)))
    p.close()


def publishes(c: RawClient, level: int, want: int, ack: bool = True, timeout: float = 10) -> list[Publish]:
    got: list[Publish] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        p = receive(c, level)
        assert p is not None, f"closed after {len(got)} of {want}"
        if isinstance(p, Publish):
            got.append(p)
            if ack and p.qos == 1:
                c.send(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
            elif ack and p.qos == 2:
                c.send(bytes((0x50, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
        elif p.packet_type == 6 and ack:  # PUBREL
            c.send(bytes((0x70, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
    return got


def quiet(c: RawClient, seconds: float = 0.7) -> list[bytes]:
    """Packets that arrive within ``seconds`` (none expected)."""
    c.sock.settimeout(seconds)
    out = []
    try:
        while True:
            pkt = c.packet()
            if not pkt:
                break
            out.append(pkt)
    except OSError:
        pass
    c.sock.settimeout(10)
    return out


def leave(client) -> None:
    """A normal DISCONNECT (reason 0x00), then the connection closed."""
    client.send(bytes((0xE0, 0)))
    client.close()
