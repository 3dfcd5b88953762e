"""A close the edge decides on ends the network connection even when the
client stopped reading (issue 38, item 4): the server "MUST disconnect the
Network Connection" [MQTT-3.1.2-22]; waiting for a write buffer that never
drains kept it ESTABLISHED, and the session queuing, for ever."""

from __future__ import annotations

import socket
import time

import pytest

from bridge.mqtt import Subscribe, Subscription, encode
from tests.edge.conftest import RawClient
from tests.edge.test_subscribers import Client
from tests.waiting import wait_for

pytestmark = [pytest.mark.subprocess]


def _stalled_subscriber(port: int, cid: str, keepalive: int) -> RawClient:
    """A client that subscribes to ``big/#`` and then never reads again."""
    c = RawClient(port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert c.connect(4, client_id=cid, keepalive=keepalive)[3] == 0
    c.send(encode(Subscribe(1, [Subscription("big/#", 0)]), 4))
    assert c.packet()[0] == 0x90
    return c


def _fill_its_buffer(srv, port: int, conn) -> None:
    pub = Client(port, 4, "filler")
    try:
        deadline = time.monotonic() + 30
        i = 0
        # QoS 0 at 16 KiB each until the edge holds bytes it cannot write
        while conn.transport is not None and conn.transport.get_write_buffer_size() < 256 << 10:
            assert time.monotonic() < deadline, "the edge's write buffer never filled"
            pub.publish("big/x", b"z" * 16384, qos=0)
            i += 1
            if i % 50 == 0:
                time.sleep(0.05)
    finally:
        pub.close()


def test_mqtt_3_1_2_22_keep_alive_expiry_aborts_a_client_that_does_not_read(run_edge):
    edge = run_edge()
    srv = edge.server
    slow = _stalled_subscriber(edge.port, "stalled", keepalive=2)
    conn = wait_for(lambda: next((c for c in list(srv.conns)
                                  if c.session.client_id == "stalled"), None), 5, "its connection")
    _fill_its_buffer(srv, edge.port, conn)
    # 1.5 x Keep Alive = 3 s after its last packet; then at most a short linger
    wait_for(lambda: conn not in srv.conns, 12, "the stalled connection removed by the edge")
    assert "keep alive timeout" in (conn.session.close_reason or "")
    slow.close()


def test_lg_edge_take_over_aborts_an_old_connection_that_does_not_read(run_edge):
    edge = run_edge()
    srv = edge.server
    old = _stalled_subscriber(edge.port, "twice", keepalive=0)
    conn = wait_for(lambda: next((c for c in list(srv.conns)
                                  if c.session.client_id == "twice"), None), 5, "its connection")
    _fill_its_buffer(srv, edge.port, conn)
    new = RawClient(edge.port)
    assert new.connect(4, client_id="twice")[3] == 0
    wait_for(lambda: conn not in srv.conns, 10, "the old connection removed by the edge")
    assert "taken over" in (conn.session.close_reason or "")
    new.close()
    old.close()
