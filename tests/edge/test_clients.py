"""Real clients against a running edge: paho-mqtt (MQTT 3.1, 3.1.1, 5 at QoS 0,
1 and 2, with retained publishes, topic aliases, user properties and message
expiry) and mosquitto_pub. Every message appears exactly once in the capture
log, with the right headers."""

from __future__ import annotations

import shutil
import subprocess

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from bridge.mqtt import Publish
from bridge.mqtt.codec import decode_packet
from tests.edge.conftest import wait_for, wait_records
from tests.edge.util import headers_of, read_log

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

PROTOCOLS = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}


def _client(port: int, level: int, client_id: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=PROTOCOLS[level])
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def _publishes(records, client_id: bytes):
    out = []
    for r in records:
        if r.key == client_id and r.value[0] >> 4 == 3 and headers_of(r).get("origin") == b"client":
            level = int(headers_of(r)["proto"])
            out.append((r, decode_packet(r.value, level)[0]))
    return out


@pytest.mark.parametrize("level", [3, 4, 5])
def test_paho_every_message_once_with_headers(edge, level):
    cid = f"paho-{level}"
    c = _client(edge.port, level, cid)
    sent = {}
    infos = []
    for i in range(30):
        qos = i % 3
        payload = f"m{level}-{i}".encode()
        props = None
        if level == 5:
            props = PahoProperties(PacketTypes.PUBLISH)
            props.UserProperty = [("seq", str(i)), ("k", "v")]
            props.MessageExpiryInterval = 120
        infos.append(c.publish(f"dev/{level}/{i % 4}", payload, qos=qos, retain=i % 5 == 0,
                               properties=props))
        sent[payload] = (qos, i % 5 == 0, f"dev/{level}/{i % 4}")
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published()
    c.disconnect()
    c.loop_stop()
    log = edge.config  # the test's capture log (local or Kafka)
    recs = wait_records(log, lambda r: r.key == cid.encode() and r.value[0] == 0xE0, 1)
    pubs = _publishes(wait_records(log, lambda r: True, 32), cid.encode())
    got = {p.payload: (p.qos, p.retain, p.topic) for _r, p in pubs}
    assert got == sent
    assert len(pubs) == len(sent)  # exactly once
    conn_ids = {headers_of(r)["conn_id"] for r, _p in pubs} | {headers_of(recs[0])["conn_id"]}
    assert len(conn_ids) == 1
    for r, p in pubs:
        h = headers_of(r)
        assert h["proto"] == str(level).encode() and h["origin"] == b"client"
        assert h["remote"].startswith(b"127.0.0.1:") and "reject" not in h and "dup" not in h
        if level == 5:
            i = int(p.payload.decode().rsplit("-", 1)[1])
            assert p.properties.user_properties == [("seq", str(i)), ("k", "v")]
            assert p.properties.message_expiry_interval == 120
    # the QoS 2 PUBRELs name the released PUBLISH
    rels = [r for r in read_log(log) if r.key == cid.encode() and r.value[0] == 0x62]
    assert len(rels) == 10
    by_seq = {r.seq: p for r, p in pubs}
    for rel in rels:
        h = headers_of(rel)
        target = by_seq[int(h["rel_seq"])]
        assert target.qos == 2 and h["rel_topic"] == target.topic.encode()
        assert target.packet_id == (rel.value[2] << 8 | rel.value[3])


def test_paho_v5_topic_aliases_resolve_into_alias_topic(edge):
    c = _client(edge.port, 5, "alias-client")
    infos = []
    for i in range(4):
        props = PahoProperties(PacketTypes.PUBLISH)
        props.TopicAlias = 3
        topic = "very/long/topic/name" if i == 0 else ""
        infos.append(c.publish(topic, f"a{i}".encode(), qos=1, properties=props))
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published()
    c.disconnect()
    c.loop_stop()
    pubs = _publishes(wait_records(edge.config,
                                   lambda r: r.key == b"alias-client" and r.value[0] >> 4 == 3, 4),
                      b"alias-client")
    assert [p.payload for _r, p in pubs] == [b"a0", b"a1", b"a2", b"a3"]
    assert [p.topic for _r, p in pubs] == ["very/long/topic/name", "", "", ""]  # frames stay raw
    assert all(headers_of(r)["alias_topic"] == b"very/long/topic/name" for r, _p in pubs)


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto_pub not installed")
@pytest.mark.parametrize("version, level", [("mqttv31", 3), ("mqttv311", 4), ("mqttv5", 5)])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_pub(edge, version, level, qos):
    cid = f"mp-{level}-{qos}"
    args = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(edge.port), "-V", version, "-i", cid,
            "-q", str(qos), "-t", f"mp/{qos}", "-r", "-m", f"hello {cid}"]
    if level == 5:
        args += ["-D", "publish", "user-property", "a", "b"]
    subprocess.run(args, check=True, timeout=20, capture_output=True)
    recs = wait_records(edge.config, lambda r: r.key == cid.encode(), 2)
    pubs = _publishes(recs, cid.encode())
    assert len(pubs) == 1
    r, p = pubs[0]
    assert (p.payload, p.qos, p.retain, p.topic) == (f"hello {cid}".encode(), qos, True,
                                                     f"mp/{qos}")
    assert headers_of(r)["proto"] == str(level).encode()
    if level == 5:
        assert p.properties.user_properties == [("a", "b")]
    assert isinstance(p, Publish)
    wait_for(lambda: any(x.value[0] == 0xE0 for x in read_log(edge.config)
                         if x.key == cid.encode()), what="DISCONNECT record")
