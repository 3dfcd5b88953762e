"""The edge server over real sockets: durability before acknowledgement,
wills, take-over, keep-alive, authentication, limits, TLS, restart with
persistent sessions, graceful shutdown, and its log lines."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess

import pytest

from bridge.edge.auth import hash_password, write_password_file
from bridge.mqtt import Properties, Will
from bridge.mqtt.codec import decode_packet
from bridge.ports import free_loopback_port as _free_port
from tests.edge.conftest import RawClient, wait_for, wait_records
from tests.edge.util import connect, headers_of, publish, read_log

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

CONNACK_OK = b"\x20\x02\x00\x00"


def test_puback_only_after_the_record_is_durable(edge, raw):
    c = raw()
    assert c.connect(4, client_id="d1") == CONNACK_OK
    c.publish(4, topic="t", payload=b"p1", qos=1, packet_id=3)
    assert c.packet() == b"\x40\x02\x00\x03"
    # The PUBACK is out, so the record is durable: a reader sees it right now.
    recs = [r for r in read_log(edge.config) if r.key == b"d1"]
    assert [r.value[0] for r in recs] == [0x10, 0x32]


def test_many_acknowledgements_in_order(edge, raw):
    c = raw()
    c.connect(5, client_id="burst")
    c.send(b"".join(publish(5, topic=f"t/{i}", qos=1 + i % 2, packet_id=i + 1) for i in range(500)))
    got = b"".join(c.packet() for _ in range(500))
    assert got == b"".join(bytes((0x40 if i % 2 == 0 else 0x50, 2)) + (i + 1).to_bytes(2, "big")
                           for i in range(500))


def test_will_is_captured_when_the_connection_drops(edge, raw):
    c = raw()
    will = Will("dev/w", b"gone", 1, True, Properties(content_type="text/plain"))
    c.connect(5, client_id="wd", will=will)
    c.close()
    (w,) = wait_records(edge.config, lambda r: headers_of(r).get("origin") == b"will", 1)
    p, _ = decode_packet(w.value, 5)
    assert (p.topic, p.payload, p.qos, p.retain) == ("dev/w", b"gone", 1, True)
    assert p.properties.content_type == "text/plain" and w.key == b"wd"


def test_will_delay_is_cancelled_when_the_session_resumes(edge, raw):
    props = Properties(will_delay_interval=2)
    c = raw()
    c.connect(5, client_id="wdelay", clean_start=False, will=Will("w/t", b"x", 0, False, props),
              properties=Properties(session_expiry_interval=60))
    c.close()
    c2 = raw()
    ack = c2.connect(5, client_id="wdelay", clean_start=False,
                     properties=Properties(session_expiry_interval=60))
    assert ack[2] == 1  # Session Present
    c2.send(b"\xc0\x00")
    assert c2.packet() == b"\xd0\x00"
    edge.call(lambda: None)
    assert not edge.server.pending_wills  # the resumed session cancelled it
    assert not [r for r in read_log(edge.config) if headers_of(r).get("origin") == b"will"]


def test_mqtt_3_1_4_3_session_taken_over(edge, raw):
    a = raw()
    a.connect(5, client_id="same", will=Will("w", b"old", 0, False, Properties()))
    b = raw()
    assert b.connect(5, client_id="same")[3] == 0
    assert a.packet() == b"\xe0\x01\x8e" and a.closed()
    wait_records(edge.config, lambda r: headers_of(r).get("origin") == b"will", 1)
    b.send(b"\xc0\x00")
    assert b.packet() == b"\xd0\x00"


def test_keep_alive_timeout_closes(edge, raw):
    c = raw(timeout=5)
    c.connect(5, client_id="sleepy", keepalive=1)
    assert c.packet() == b"\xe0\x01\x8d"  # after 1.5 s without a packet
    assert c.closed()


def test_second_connect_and_malformed_frames_close_and_are_recorded(edge, raw):
    c = raw()
    c.connect(4, client_id="bad")
    c.send(bytes.fromhex("300E00052B6F7069637061796C6F6164"))  # wildcard in the topic
    assert c.closed()
    (r,) = wait_records(edge.config, lambda r: "reject" in headers_of(r), 1)
    h = headers_of(r)
    assert h["reject"] == b"MQTT-3.3.2-2" and h["reject_code"] == b"129"
    assert h["reject_error"].startswith(b"[MQTT-3.3.2-2] ") and r.key == b"bad"


def test_mqtt_3_3_2_3_a_subscriber_gets_the_message_as_published(edge, raw):
    c = raw()
    c.connect(4, client_id="sub")
    c.send(bytes.fromhex("8206000100016101"))  # SUBSCRIBE "a" QoS 1
    assert c.packet() == b"\x90\x03\x00\x01\x01"
    p = raw()
    p.connect(4, client_id="pub")
    p.send(bytes.fromhex("3207000161" "0007" "6869"))  # PUBLISH "a" QoS 1 id 7 "hi", RETAIN 0
    assert p.packet() == b"\x40\x02\x00\x07"
    assert c.packet() == bytes.fromhex("3207000161" "0001" "6869")  # QoS 1, the edge's id 1


def test_persistent_qos2_state_survives_a_graceful_restart(run_edge, edge_config, tmp_path):
    cfg = edge_config()
    e1 = run_edge(config=cfg)
    c = RawClient(e1.port)
    c.connect(4, client_id="durable", clean_start=False)
    c.publish(4, topic="q2/topic", qos=2, packet_id=77)
    assert c.packet() == b"\x50\x02\x00\x4d"
    c.close()
    e1.stop()
    e2 = run_edge(config=edge_config())
    c2 = RawClient(e2.port)
    assert c2.connect(4, client_id="durable", clean_start=False) == b"\x20\x02\x01\x00"
    c2.send(b"\x62\x02\x00\x4d")
    assert c2.packet() == b"\x70\x02\x00\x4d"
    rel = wait_records(cfg, lambda r: r.value[:1] == b"\x62", 1)[0]
    assert headers_of(rel)["rel_topic"] == b"q2/topic"
    c2.close()


def test_graceful_shutdown_disconnects_v5_with_0x8b(run_edge):
    e = run_edge()
    c5 = RawClient(e.port)
    c5.connect(5, client_id="s5", will=Will("w", b"w", 0, False, Properties()))
    c4 = RawClient(e.port)
    c4.connect(4, client_id="s4")
    c5.publish(5, qos=1, packet_id=1)
    assert c5.packet() == b"\x40\x02\x00\x01"
    e.stop()
    assert c5.packet() == b"\xe0\x01\x8b" and c5.closed()
    assert c4.closed()
    recs = read_log(e.config)
    assert any(headers_of(r).get("origin") == b"will" for r in recs)
    assert (e.config.edge_state_dir / "sessions.json").exists()


@pytest.fixture
def passwords(tmp_path):
    path = tmp_path / "passwd"
    write_password_file(path, {"alice": hash_password(b"wonderland", ln=4)})
    return path


@pytest.mark.parametrize("level, good, bad, anonymous", [
    (4, CONNACK_OK, b"\x20\x02\x00\x04", b"\x20\x02\x00\x05"),
    (5, None, b"\x20\x03\x00\x86\x00", b"\x20\x03\x00\x87\x00"),
])
def test_mqtt_3_1_4_2_password_file(run_edge, passwords, level, good, bad, anonymous, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge(f"edge.password_file={passwords}", "edge.allow_anonymous=false")
    ok = RawClient(e.port).connect(level, client_id="a1", username="alice", password=b"wonderland")
    assert ok[3] == 0 and (good is None or ok == good)
    assert RawClient(e.port).connect(level, client_id="a2", username="alice",
                                     password=b"guess") == bad
    assert RawClient(e.port).connect(level, client_id="a3", username="mallory",
                                     password=b"wonderland") == bad
    assert RawClient(e.port).connect(level, client_id="a4") == anonymous
    wait_for(lambda: len([r for r in read_log(e.config) if "reject" in headers_of(r)])
             == 3, what="3 refused CONNECT records")
    for r in read_log(e.config):
        assert b"wonderland" not in r.value and b"guess" not in r.value
    e.stop()
    text = caplog.text
    assert "wonderland" not in text and "guess" not in text
    assert "MQTT-3.1.4-2" in text


def test_lg_edge_busy_at_max_connections(run_edge):
    e = run_edge("edge.max_connections=2")
    a, b = RawClient(e.port), RawClient(e.port)
    assert a.connect(4, client_id="m1") == CONNACK_OK
    assert b.connect(4, client_id="m2") == CONNACK_OK
    assert RawClient(e.port).connect(5, client_id="m3") == b"\x20\x03\x00\x89\x00"
    a.close()
    wait_for(lambda: len(e.server.conns) < 2, what="the first connection to end")
    assert RawClient(e.port).connect(4, client_id="m4") == CONNACK_OK


def test_back_pressure_keeps_every_acknowledged_message(run_edge):
    e = run_edge("capture.max_pending_bytes=4096", "capture.fsync_interval_ms=20")
    c = RawClient(e.port, timeout=20)
    c.connect(4, client_id="bp")
    n = 2000
    c.send(b"".join(publish(4, topic="bp", payload=b"x" * 200, qos=1, packet_id=i % 65535 + 1)
                    for i in range(n)))
    assert len(b"".join(c.packet() for _ in range(n))) == 4 * n
    recs = wait_records(e.config, lambda r: r.key == b"bp" and r.value[0] == 0x32, n)
    assert len(recs) == n


def test_log_lines_one_open_one_close_without_payloads(edge, raw, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    c = raw()
    c.connect(5, client_id="logme", username="bob", password=b"topsecret")
    c.publish(5, topic="t", payload=b"PAYLOAD-BYTES", qos=1)
    c.packet()
    c.send(b"\xe0\x00")
    assert c.closed()
    wait_for(lambda: "close" in caplog.text and "logme" in caplog.text, what="close line")
    lines = [r.getMessage() for r in caplog.records if "logme" in r.getMessage()]
    opens = [ln for ln in lines if ln.startswith("open ")]
    closes = [ln for ln in lines if ln.startswith("close ")]
    assert len(opens) == 1 and len(closes) == 1
    assert "v=5" in opens[0] and "remote=127.0.0.1:" in opens[0]
    assert "reason=client DISCONNECT" in closes[0]
    assert "PAYLOAD" not in caplog.text and "topsecret" not in caplog.text


@pytest.fixture
def tls_files(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_listener(run_edge, tls_files):
    cert, key = tls_files
    e = run_edge(f"edge.tls_port={_free_port()}", f"edge.tls_cert_file={cert}",
                 f"edge.tls_key_file={key}")
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", e.tls_port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(connect(4, client_id="tls-dev") + publish(4, qos=1, packet_id=2))
            data = b""
            while len(data) < 8:
                chunk = t.recv(64)
                assert chunk
                data += chunk
            assert data == CONNACK_OK + b"\x40\x02\x00\x02"
    recs = wait_records(e.config, lambda r: r.key == b"tls-dev", 2)
    assert recs[0].value[0] == 0x10


def test_snapshot_carries_the_wills_a_crash_would_leave_owed(edge, raw):
    from bridge.edge.persist import load_snapshot

    open_ = raw()
    open_.connect(4, client_id="snap-open", will=Will("st/open", b"off", 0, False, Properties()))
    left = raw()
    left.connect(5, client_id="snap-delay", will=Will("st/delay", b"off", 0, False,
                                                    Properties(will_delay_interval=60)),
                 properties=Properties(session_expiry_interval=120))
    bye = raw()
    bye.connect(4, client_id="snap-bye", will=Will("st/bye", b"off", 0, False, Properties()))
    bye.send(b"\xe0\x00")
    assert bye.closed()
    left.close()  # its Will is pending for 60 s
    wait_for(lambda: "snap-delay" in edge.server.pending_wills, 5, "the pending Will")
    edge.call(edge.server.snapshot)
    wills = load_snapshot(edge.config.edge_state_dir).wills
    assert sorted(wills) == ["snap-delay", "snap-open"]
    assert wills["snap-delay"].delay_s == 60 and wills["snap-open"].delay_s == 0
    assert dict(wills["snap-open"].headers)["origin"] == b"will"
