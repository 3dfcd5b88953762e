"""MQTT over WebSockets (bridge/edge/websocket.py, MQTT 5.0 section 6):
paho-mqtt's own WebSocket transport against the edge, and a raw WebSocket
client (wsproto's client side, plus hand-made frames for what wsproto would
never send) for the framing rules, the handshake's refusals and the
WebSocket faults. Test names carry the rule they check."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Message, Ping, Pong,
                            RejectConnection, Request)

from bridge.mqtt import Properties, Subscribe, encode
from bridge.mqtt.subscribe import Subscription
from bridge.ports import free_loopback_port
from tests.edge.conftest import wait_records
from tests.edge.util import connect, publish
from tests.waiting import wait_for

CONNACK_OK = b"\x20\x02\x00\x00"


class WsRaw:
    """A WebSocket client on a socket: wsproto's client side for what a
    good client sends, :meth:`send_frame` for hand-made frames."""

    def __init__(self, port: int, path: str = "/mqtt", subprotocols=("mqtt",), origin: str | None = None,
                 ctx: ssl.SSLContext | None = None, headers: tuple = ()) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(sock, server_hostname="localhost") if ctx is not None else sock
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list = []
        self.data = b""
        headers = ([(b"origin", origin.encode())] if origin else []) + [(k.encode(), v.encode()) for k, v in headers]
        self.sock.sendall(self.ws.send(Request(host="localhost", target=path, subprotocols=list(subprotocols),
                                               extra_headers=headers)))
        self.answer = self._next((AcceptConnection, RejectConnection))

    def _pump(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return False
        except (ConnectionResetError, ssl.SSLError, OSError):
            chunk = b""
        self.ws.receive_data(chunk or None)
        for ev in self.ws.events():
            if isinstance(ev, BytesMessage):
                self.data += bytes(ev.data)
            elif isinstance(ev, Ping):
                self.sock.sendall(self.ws.send(ev.response()))
            else:
                self.events.append(ev)
        return bool(chunk)

    def _next(self, kinds):
        while True:
            for i, ev in enumerate(self.events):
                if isinstance(ev, kinds):
                    return self.events.pop(i)
            if not self._pump():
                for i, ev in enumerate(self.events):
                    if isinstance(ev, kinds):
                        return self.events.pop(i)
                return None

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.ws.send(Message(data=data)))

    def send_frame(self, first: int, payload: bytes, masked: bool = True) -> None:
        """One hand-made frame: ``first`` is FIN/RSV/opcode, the payload masked with key 0."""
        n = len(payload)
        head = bytes((first,)) + (bytes(((0x80 if masked else 0) | n,)) if n < 126 else
                                  bytes(((0x80 if masked else 0) | 126,)) + n.to_bytes(2, "big"))
        self.sock.sendall(head + (b"\0\0\0\0" if masked else b"") + payload)

    def read(self, n: int, timeout: float = 10) -> bytes:
        """``n`` bytes of the MQTT stream (binary messages joined)."""
        deadline = time.monotonic() + timeout
        while len(self.data) < n and time.monotonic() < deadline:
            if not self._pump():
                break
        out, self.data = self.data[:n], self.data[n:]
        return out

    def until(self, done, timeout: float = 10) -> bool:
        """Read until ``done(bytes of the MQTT stream so far)``; False at the timeout."""
        deadline = time.monotonic() + timeout
        while not done(self.data):
            if time.monotonic() > deadline or not self._pump():
                return bool(done(self.data))
        return True

    def close_code(self) -> int | None:
        """The code of the edge's Close frame (None: the connection ended without one)."""
        ev = self._next(CloseConnection)
        return None if ev is None else ev.code

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def ws_edge(run_edge):
    """A function: overrides -> an EdgeThread with a WebSocket listener (``.ws`` its port)."""
    def start(*overrides: str):
        e = run_edge(f"edge.ws_port={free_loopback_port()}", *overrides)
        e.ws = e.ws_port()
        return e
    return start


def _paho(port: int, cid: str, protocol=mqtt.MQTTv5, tls: str | None = None) -> tuple[mqtt.Client, list]:
    got: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, transport="websockets", protocol=protocol)
    c.ws_set_options(path="/mqtt")
    if tls is not None:
        c.tls_set(ca_certs=tls)
        c.tls_insecure_set(True)
    c.on_message = lambda _c, _u, m: got.append((m.topic, bytes(m.payload), m.qos, m.retain))
    connected = threading.Event()
    c.on_connect = lambda *_a: connected.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert connected.wait(10), "no CONNACK over WebSockets"
    return c, got


def _sub(c: mqtt.Client, topic: str, qos: int) -> None:
    done = threading.Event()
    c.on_subscribe = lambda *_a: done.set()
    c.subscribe(topic, qos=qos)
    assert done.wait(10), "no SUBACK"


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311])
def test_mqtt_6_0_0_4_paho_over_websockets_publishes_and_receives_at_qos_0_1_2_a_retained_one_and_tcps(
        ws_edge, protocol):
    """paho's WebSocket transport: subscribe, publish at QoS 0/1/2 and
    receive each back; a retained message published before; a message a
    TCP client published."""
    e = ws_edge()
    tcp = socket.create_connection(("127.0.0.1", e.port), timeout=10)
    tcp.sendall(connect(4, client_id="tcp-pub") + publish(4, topic="w/kept", payload=b"kept", qos=1, packet_id=1,
                                                          retain=True))
    assert tcp.recv(8) == CONNACK_OK + b"\x40\x02\x00\x01"
    c, got = _paho(e.ws, f"ws-{protocol}", protocol)
    try:
        _sub(c, "w/#", 2)
        wait_for(lambda: ("w/kept", b"kept", 1, True) in got, 10, "the retained message over WebSockets")
        for q in (0, 1, 2):
            c.publish("w/x", b"q%d" % q, qos=q).wait_for_publish(10)
        tcp.sendall(publish(4, topic="w/tcp", payload=b"from tcp", qos=1, packet_id=2))
        assert tcp.recv(4) == b"\x40\x02\x00\x02"
        wait_for(lambda: len(got) >= 5, 10, "every message over WebSockets")
        assert sorted(got) == sorted([("w/kept", b"kept", 1, True), ("w/x", b"q0", 0, False),
                                      ("w/x", b"q1", 1, False), ("w/x", b"q2", 2, False),
                                      ("w/tcp", b"from tcp", 1, False)])
    finally:
        c.disconnect()
        c.loop_stop()
        tcp.close()


def test_mqtt_6_0_0_2_and_3_a_packet_may_span_frames_and_a_frame_may_hold_several(ws_edge):
    """A CONNECT cut into three frames; then SUBSCRIBE and PUBLISH in one
    frame; then a PUBLISH cut at every point into two frames: the edge
    reads the stream, not the frames."""
    e = ws_edge()
    c = WsRaw(e.ws)
    assert isinstance(c.answer, AcceptConnection) and c.answer.subprotocol == "mqtt"  # echoed [MQTT-6.0.0-4]
    frame = connect(5, client_id="frames")
    for part in (frame[:1], frame[1:5], frame[5:]):
        c.send(part)
    assert c.until(lambda d: d[:1] == b"\x20" and len(d) >= 2 and len(d) >= 2 + d[1])
    c.data = b""
    sub = encode(Subscribe(1, [Subscription("s/#", 0)], Properties()), 5)
    c.send(sub + publish(5, topic="s/a", payload=b"one frame", qos=1, packet_id=7))
    assert c.until(lambda d: d[:1] == b"\x90" and b"one frame" in d and b"\x40\x02\x00\x07" in d)
    c.data = b""
    body = publish(5, topic="s/b", payload=b"split", qos=0)
    for cut in range(1, len(body)):
        c.send(body[:cut])
        c.send(body[cut:])
    assert c.until(lambda d: d.count(b"split") == len(body) - 1), c.data.count(b"split")
    c.close()


def test_mqtt_6_0_0_1_a_text_frame_closes_the_connection_with_1003(ws_edge, caplog):
    e = ws_edge()
    c = WsRaw(e.ws)
    c.send(connect(4, client_id="texter"))
    assert c.read(4) == CONNACK_OK
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        c.sock.sendall(c.ws.send(Message(data="not binary")))
        assert c.close_code() == 1003
        wait_for(lambda: [r for r in caplog.records if "texter" in r.getMessage() and "1003" in r.getMessage()],
                 10, "one line naming the client and the close code")
    assert "MQTT-6.0.0-1" in caplog.text


@pytest.mark.parametrize("what, first, payload, masked", [
    ("unmasked", 0x82, b"\x20", False),                 # RFC 6455 5.1: a client masks every frame
    ("fragmented control frame", 0x09, b"", True),      # 5.5: control frames are not fragmented
    ("oversized control frame", 0x89, b"p" * 126, True),  # 5.5: at most 125 bytes
    ("reserved opcode", 0x83, b"x", True),
])
def test_a_frame_that_breaks_rfc_6455_closes_with_1002_and_others_go_on(ws_edge, what, first, payload, masked):
    e = ws_edge()
    good = WsRaw(e.ws)
    good.send(connect(4, client_id="good"))
    assert good.read(4) == CONNACK_OK
    bad = WsRaw(e.ws)
    bad.send(connect(4, client_id="bad"))
    assert bad.read(4) == CONNACK_OK
    bad.send_frame(first, payload, masked)
    assert bad.close_code() == 1002, what
    good.send(publish(4, topic="g", payload=b"x", qos=1, packet_id=3))
    assert good.read(4) == b"\x40\x02\x00\x03"


@pytest.mark.parametrize("path, subprotocols, origin, status", [
    ("/other", ("mqtt",), None, 404),
    ("/mqtt", (), None, 400),
    ("/mqtt", ("chat", "wamp"), None, 400),
    ("/mqtt", ("mqtt",), "https://evil.example", 403),
    ("/mqtt", ("mqtt",), None, 403),  # a browser-only deployment: no Origin, no entry
])
def test_lg_edge_ws_handshake_refusals_answer_http_and_say_why_in_one_line(ws_edge, caplog, path, subprotocols,
                                                                           origin, status):
    e = ws_edge("edge.ws_origins=https://app.example, https://dash.example")
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        c = WsRaw(e.ws, path=path, subprotocols=subprotocols, origin=origin)
        assert isinstance(c.answer, RejectConnection) and c.answer.status_code == status
        wait_for(lambda: [r for r in caplog.records if "LG-edge-ws-handshake" in r.getMessage()], 10, "the line")
    lines = [r.getMessage() for r in caplog.records if "LG-edge-ws-handshake" in r.getMessage()]
    assert len(lines) == 1 and f"HTTP {status}" in lines[0], lines


def test_an_allowed_origin_and_the_mqttv3_1_subprotocol_are_accepted_and_echoed(ws_edge):
    e = ws_edge("edge.ws_origins=https://app.example, https://dash.example")
    c = WsRaw(e.ws, subprotocols=("mqttv3.1",), origin="https://dash.example")
    assert isinstance(c.answer, AcceptConnection) and c.answer.subprotocol == "mqttv3.1"
    c.send(connect(3, client_id="old31"))
    assert c.read(4) == CONNACK_OK


def test_lg_edge_ws_handshake_one_that_never_completes_is_aborted_after_the_connect_timeout(ws_edge, caplog):
    e = ws_edge("edge.connect_timeout_s=1")
    s = socket.create_connection(("127.0.0.1", e.ws), timeout=10)
    s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
    assert time.monotonic() - t0 < 8
    assert "did not complete" in caplog.text and "LG-edge-ws-handshake" in caplog.text
    assert e.call(lambda: e.server.ws_handshakes) == 0


def test_ping_is_answered_with_pong_and_a_close_ends_the_session_like_a_tcp_close(ws_edge):
    e = ws_edge()
    c = WsRaw(e.ws)
    c.send(connect(4, client_id="pinger"))
    assert c.read(4) == CONNACK_OK
    c.sock.sendall(c.ws.send(Ping(payload=b"hello")))
    pong = c._next(Pong)
    assert pong is not None and pong.payload == b"hello"
    c.sock.sendall(c.ws.send(CloseConnection(code=1000)))
    assert c.close_code() == 1000  # answered
    wait_for(lambda: e.call(lambda: not e.server.conns), 10, "the session's connection closed")


def test_mqtt_disconnect_from_the_edge_closes_the_websocket_with_1000(ws_edge):
    """A close the edge decides (here a second CONNECT, a Protocol Error)
    ends with a WebSocket Close, not only the TCP close."""
    e = ws_edge()
    c = WsRaw(e.ws)
    c.send(connect(4, client_id="twice"))
    assert c.read(4) == CONNACK_OK
    c.send(connect(4, client_id="twice"))
    assert c.close_code() == 1000


@pytest.mark.parametrize("trusted, shown", [("127.0.0.1", "203.0.113.7:0"), ("", "127.0.0.1:"),
                                             ("192.0.2.1", "127.0.0.1:")])
def test_x_forwarded_for_names_the_client_only_behind_a_trusted_proxy(ws_edge, caplog, trusted, shown):
    """The last X-Forwarded-For entry (what the trusted proxy appended; the
    first is the client's own word) becomes the connection's address in the
    logs and the capture record; from anyone else the header is ignored."""
    e = ws_edge(f"edge.ws_trusted_proxies={trusted}")
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        c = WsRaw(e.ws, headers=(("X-Forwarded-For", "6.6.6.6, 203.0.113.7"),))
        c.send(connect(4, client_id=f"behind-{trusted or 'none'}"))
        assert c.read(4) == CONNACK_OK
        wait_for(lambda: [r for r in caplog.records if r.getMessage().startswith("open ")], 10, "the open line")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("open "))
    assert f"remote={shown}" in line and " ws " in line, line
    assert "6.6.6.6" not in caplog.text
    (record,) = wait_records(e.server.config, lambda r: r.key == f"behind-{trusted or 'none'}".encode(), 1)
    assert dict(record.headers)["remote"].decode().startswith(shown), record.headers


@pytest.fixture
def tls_files(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=60, env={**os.environ, "RANDFILE": str(tmp_path / "r")})
    return cert, key


def test_wss_paho_over_secure_websockets(run_edge, tls_files):
    cert, key = tls_files
    port = free_loopback_port()
    run_edge(f"edge.wss_port={port}", f"edge.tls_cert_file={cert}", f"edge.tls_key_file={key}")
    c, got = _paho(port, "wss-dev", tls=str(cert))
    try:
        _sub(c, "t/#", 1)
        c.publish("t/s", b"secure", qos=1).wait_for_publish(10)
        wait_for(lambda: got, 10, "the message back over wss")
        assert got == [("t/s", b"secure", 1, False)]
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.fixture
def fuzz_edge(ws_edge):
    """One edge for every example of the fuzz test (function scope: Hypothesis runs them in one call)."""
    return ws_edge()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(level=st.sampled_from([3, 4, 5]), junk=st.binary(max_size=200), cut=st.integers(min_value=1, max_value=50),
       raw_junk=st.binary(max_size=64))
def test_fuzz_over_websockets_frames_cut_anywhere_and_junk_frames_never_break_the_edge(
        fuzz_edge, level, junk, cut, raw_junk):
    """The TCP path's fuzz (tests/edge/test_session.py) over WebSockets: a
    PUBLISH and junk cut into frames of ``cut`` bytes, then junk as raw
    WebSocket bytes; the connection is answered or closed, and the edge
    goes on serving a new client."""
    e = fuzz_edge
    c = WsRaw(e.ws)
    c.sock.settimeout(2)
    c.send(connect(level, client_id="fuzz"))
    assert c.until(lambda d: d[:1] == b"\x20", 5)
    stream = publish(level, qos=1, packet_id=1) + junk
    try:
        for i in range(0, len(stream), cut):
            c.send(stream[i:i + cut])
        c.sock.sendall(raw_junk)
    except OSError:
        pass  # closed by the edge meanwhile
    c.close()
    ok = WsRaw(e.ws)
    ok.send(connect(4, client_id="after-fuzz"))
    assert ok.read(4) == CONNACK_OK
    ok.close()
