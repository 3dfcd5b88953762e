"""Retained messages with no job at all (no table yet): the edge serves its
own captures, at once and after a restart (rebuilt from its capture log),
and a slow subscriber to ``#`` over many topics neither stalls the others
nor grows the edge's memory without bound."""

from __future__ import annotations

import socket

import pytest

from bridge.mqtt import Subscribe, Subscription, encode
from tests.edge.conftest import RawClient
from tests.edge.test_subscribers import Client
from tests.waiting import wait_for

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

pytestmark = [pytest.mark.subprocess]


def test_mqtt_3_3_1_8_served_at_once_and_after_a_restart_from_the_log(run_edge, edge_config):
    cfg = edge_config()
    e1 = run_edge(config=cfg)
    c = Client(e1.port, 5, "both")
    c.publish("eo/now", b"mine", qos=1, retain=True)
    c.subscribe(("eo/#", 1))
    assert [(m.topic, m.retain) for m in c.wait_for_payload(b"mine")] == [("eo/now", True)]
    c.publish("eo/now", b"", qos=1, retain=True).wait_for_publish(10)   # cleared
    c.publish("eo/kept", b"k", qos=0, retain=True).wait_for_publish(10)
    c.close()
    e1.stop()
    e2 = run_edge(config=cfg)
    s = Client(e2.port, 4, "after")
    s.subscribe(("eo/#", 1))
    got = s.wait_for_payload(b"k")
    assert [(m.topic, m.retain, m.qos) for m in got] == [("eo/kept", True, 0)]
    s.close()


def test_a_subscriber_to_hash_that_does_not_read_stalls_no_one(run_edge):
    edge = run_edge("edge.max_inflight_messages=5")
    pub = Client(edge.port, 4, "many-pub")
    infos = [pub.publish(f"slow/{i}", b"x" * 8000, qos=1, retain=True) for i in range(3000)]
    for i in infos:
        i.wait_for_publish(30)
    # a subscriber with a tiny receive buffer that never reads nor acknowledges
    slow = RawClient(edge.port)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(4, client_id="slow")
    slow.send(encode(Subscribe(1, [Subscription("#", 0)]), 4))  # QoS 0: no window
    # another client is served as usual meanwhile
    other = Client(edge.port, 4, "other")
    other.subscribe(("slow/7", 1))
    assert [m.topic for m in other.wait_count(1)] == ["slow/7"]
    other.publish("slow/live", b"now", qos=1)
    other.subscribe(("slow/live", 0))
    assert other.wait_for_payload(b"now")
    # the edge stopped writing to it at its transport's limit: the replay is
    # not done, and what it handed out stays bounded (24 MB of payloads in all)
    box = wait_for(lambda: getattr(edge.server.router.sessions.get("slow"), "outbox", None), 10,
                   "the slow subscriber's outbox")
    assert box.replays == 1 and len(box.queue) <= 1 + 100
    other.close()
    pub.close()
    slow.close()
