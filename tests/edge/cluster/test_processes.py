"""A cluster as separate processes (issue 43, item 7 and "done when"):
``lakegate edge`` processes on loopback sharing a Kafka topic, SIGKILLed
under load, clients moving to the surviving edges.

* the newcomer's path: ``mosquitto_sub`` (persistent session, QoS 1) on
  edge A, ``mosquitto_pub`` on edge B; edge A is SIGKILLed; more messages
  are published; ``mosquitto_sub`` reconnects to edge B and receives what
  was queued;
* three edges on the three-node Kafka: a publisher on edge 0 at QoS 2, a
  QoS 2 subscriber on edge 2; edge 2 is
  SIGKILLed and one Kafka broker is SIGKILLed meanwhile; the QoS 2
  subscriber resumes on edge 1: every acknowledged message arrives, the
  QoS 2 ones exactly once (the client keeps the MQTT receiver's state:
  Packet Identifiers awaiting PUBREL), nothing is delivered twice at QoS 2.
"""

from __future__ import annotations

import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge.mqtt import Publish, Subscribe, encode
from bridge.mqtt.codec import decode_packet
from bridge.mqtt.subscribe import Subscription
from tests.conftest import kafka_node
from tests.edge.conftest import RawClient
from tests.edge.util import connect as connect_frame
from tests.edge.util import publish

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[3]
#: the lease of the one-node Kafka tests (no broker fails there)
LEASE_S = 3.0
#: the lease of the three-node test: half of it must exceed Kafka's fail-over after a
#: broker's SIGKILL (broker.session.timeout.ms 9 s plus elections; 12 s and more seen here
#: under load), or every edge closes its connections while the partitions' leaders move
LEASE_3_S = 40.0


class Edge:
    """``lakegate edge`` as a subprocess of a cluster; its log in ``data_dir/edge.log``."""

    def __init__(self, data_dir: Path, kafka: str, topic: str, edge_id: int, edges: int, *sets: str,
                 lease_s: float = LEASE_S) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.args = [sys.executable, "-m", "bridge", "edge", "--port", "0",
                     "--set", f"data_dir={data_dir}", "--set", "capture.backend=kafka",
                     "--set", f"kafka.bootstrap_servers={kafka}", "--set", f"kafka.topic={topic}",
                     "--set", "kafka.create_topic=true", "--set", f"capture.partitions={2 * edges}",
                     "--set", f"cluster.edges={edges}", "--set", f"cluster.edge_id={edge_id}",
                     "--set", f"cluster.lease_s={lease_s}", "--set", "amqp.url="]
        for kv in sets:
            self.args += ["--set", kv]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "Edge":
        log = open(self.data_dir / "edge.log", "ab")
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        if not select.select([self.proc.stdout], [], [], 90)[0]:
            self.proc.kill()
            raise AssertionError(f"edge printed no listening line in 90 s: {self.log_tail()}")
        line = self.proc.stdout.readline()
        m = re.search(r"mqtt://127\.0\.0\.1:(\d+)", line)
        if m is None:
            self.proc.kill()
            raise AssertionError(f"no listening line: {line!r} {self.log_tail()}")
        self.port = int(m.group(1))
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self) -> str:
        try:
            return (self.data_dir / "edge.log").read_text()[-3000:]
        except OSError:
            return ""


@pytest.fixture
def edges(tmp_path):
    made: list[Edge] = []

    def make(kafka: str, topic: str, n: int, *sets: str, lease_s: float = LEASE_S) -> list[Edge]:
        out = [Edge(tmp_path / f"edge{i}", kafka, topic, i, n, *sets, lease_s=lease_s) for i in range(n)]
        for e in out:
            made.append(e.start())
        return out

    yield make
    for e in made:
        e.stop()


def _mosquitto(tool: str, port: int, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([tool, "-h", "127.0.0.1", "-p", str(port), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _lines(proc: subprocess.Popen, want: int, timeout: float) -> list[str]:
    """The next ``want`` lines of ``proc``'s output (fewer after ``timeout``):
    read by a thread, since lines a readline buffered are not seen by select."""
    got: queue.Queue = getattr(proc, "_lines", None)
    if got is None:
        got = proc._lines = queue.Queue()

        def pump() -> None:
            for line in proc.stdout:
                got.put(line.strip())
        threading.Thread(target=pump, daemon=True).start()
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        try:
            out.append(got.get(timeout=0.2))
        except queue.Empty:
            pass
    return out


def test_done_when_sub_on_a_pub_on_b_kill_a_resume_on_b(kafka, kafka_topic, edges):
    """The issue's "done when", with the Mosquitto clients."""
    a, b = edges(kafka, kafka_topic("lg-cl-done"), 2)
    sub = _mosquitto("mosquitto_sub", a.port, "-t", "plant/#", "-q", "1", "-c", "-i", "reader", "-V", "mqttv311")
    try:
        time.sleep(1.0)  # subscribed
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(b.port), "-t", "plant/1", "-q", "1",
                        "-m", "before", "-V", "mqttv311"], check=True, timeout=30)
        assert _lines(sub, 1, 15) == ["before"]
        a.kill()  # SIGKILL: the subscriber's connection dies with it
        sub.kill()  # (mosquitto_sub would retry edge A for ever)
        sub.wait(15)
        for i in range(5):
            subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(b.port), "-t", f"plant/{i}", "-q", "1",
                            "-m", f"queued{i}", "-V", "mqttv311"], check=True, timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
    again = _mosquitto("mosquitto_sub", b.port, "-t", "plant/#", "-q", "1", "-c", "-i", "reader", "-V", "mqttv311")
    try:
        got = _lines(again, 6, 30)
    finally:
        again.kill()
    # "before" may come again (QoS 1: its PUBACK to edge A may have died with A, DUP 1)
    assert [x for x in got if x != "before"] == [f"queued{i}" for i in range(5)], (got, b.log_tail())
    assert got.count("before") <= 1


class Qos2Receiver:
    """An MQTT 5 subscriber that keeps the receiver's QoS 2 state across
    connections (the Packet Identifiers awaiting PUBREL: a PUBLISH with one
    of them is not delivered again) and moves to the next edge when its
    connection ends."""

    def __init__(self, ports: list[int], cid: str) -> None:
        self.ports = ports
        self.cid = cid
        self.awaiting: set[int] = set()
        self.delivered: list[bytes] = []  # QoS 2, as the application gets them
        self.delivered_qos1: list[bytes] = []
        self.duplicates_seen = 0
        self.moves = 0
        self.stop = threading.Event()
        self.conn: RawClient | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def connect(self, port: int) -> None:
        c = RawClient(port, timeout=60)
        from bridge.mqtt import Properties
        c.send(connect_frame(5, client_id=self.cid, clean_start=False,
                             properties=Properties(session_expiry_interval=3600)))
        pkt = c.packet()
        if not pkt:  # closed before CONNACK (the edge's connect time-out while a dead edge's lease runs)
            raise OSError("closed before CONNACK")
        ack, _ = decode_packet(pkt, 5, from_client=False)
        assert ack.reason_code == 0, ack
        self.conn = c
        return ack.session_present

    def subscribe(self, tf: str) -> None:
        self.conn.send(encode(Subscribe(1, [Subscription(tf, 2)]), 5))
        assert self.conn.packet()[0] == 0x90

    def _run(self) -> None:
        try:
            i = 0
            while not self.stop.is_set():
                c = self.conn
                if not c.buf and not select.select([c.sock], [], [], 0.5)[0]:
                    continue  # nothing to read (RawClient.packet takes a time-out for a close)
                try:
                    pkt = c.packet()
                    if pkt:
                        self._handle(c, pkt)
                except OSError:  # the edge died under a send
                    pkt = b""
                if not pkt:  # the edge died or closed the connection: the next edge
                    deadline = time.monotonic() + 120
                    while not self.stop.is_set():
                        i += 1
                        try:
                            self.connect(self.ports[i % len(self.ports)])
                            self.moves += 1
                            break
                        except (OSError, AssertionError):
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _handle(self, c: RawClient, pkt: bytes) -> None:
        p, _ = decode_packet(pkt, 5, from_client=False)
        if isinstance(p, Publish) and p.qos == 1:
            self.delivered_qos1.append(p.payload)
            c.send(bytes((0x40, 2, p.packet_id >> 8, p.packet_id & 0xFF)))  # PUBACK
        elif isinstance(p, Publish):
            if p.packet_id not in self.awaiting:
                self.delivered.append(p.payload)
                self.awaiting.add(p.packet_id)
            else:
                self.duplicates_seen += 1
            c.send(bytes((0x50, 2, p.packet_id >> 8, p.packet_id & 0xFF)))  # PUBREC
        elif p.packet_type == 6:  # PUBREL
            self.awaiting.discard(p.packet_id)
            c.send(bytes((0x70, 2, p.packet_id >> 8, p.packet_id & 0xFF)))


def test_sigkill_of_an_edge_and_a_broker_under_load_loses_nothing_and_qos2_stays_once(kafka_cluster, tmp_path,
                                                                                      edges):
    servers, kargs = kafka_cluster
    import uuid
    topic = f"lg-cl-kill-{uuid.uuid4().hex[:8]}"
    e0, e1, e2 = edges(servers, topic, 3, "kafka.replication_factor=3", lease_s=LEASE_3_S)
    rx = Qos2Receiver([e2.port, e1.port, e0.port], "q2-reader")
    assert not rx.connect(e2.port)
    rx.subscribe("load/#")
    rx.thread.start()
    pub = RawClient(e0.port, timeout=60)
    pub.connect(5, client_id="loader")
    acked: list[bytes] = []
    n = 600
    t0 = time.monotonic()
    killed_edge = killed_broker = False
    try:
        for i in range(n):
            body = b"m%05d" % i
            pid = i % 65535 + 1
            pub.send(publish(5, topic=f"load/{i % 7}", payload=body, qos=2, packet_id=pid))
            rec = pub.packet()
            assert rec[0] == 0x50 and (len(rec) == 4 or rec[4] == 0), rec  # PUBREC: captured
            acked.append(body)
            pub.send(bytes((0x62, 2, pid >> 8, pid & 0xFF)))
            assert pub.packet()[0] == 0x70
            if i == n // 3 and not killed_edge:
                e2.kill()  # the subscriber's edge, with deliveries in flight
                killed_edge = True
            if i == n // 2 and not killed_broker:
                kafka_node("kill", 2, kargs)
                killed_broker = True
            time.sleep(max(0.0, t0 + (i + 1) / 150 - time.monotonic()))  # about 150 msg/s
    finally:
        if killed_broker:
            kafka_node("start", 2, kargs)
    deadline = time.monotonic() + 120
    while len(set(rx.delivered)) < len(acked) and time.monotonic() < deadline and rx.error is None:
        time.sleep(0.2)
    time.sleep(1.0)  # anything more would be a duplicate
    rx.stop.set()
    rx.thread.join(5)
    assert rx.error is None, rx.error
    missing = sorted(set(acked) - set(rx.delivered))
    assert not missing, (f"{len(missing)} acknowledged messages never delivered, e.g. {missing[:5]}; "
                         f"edge 1 log: {e1.log_tail()}")
    dup = len(rx.delivered) - len(set(rx.delivered))
    assert dup == 0, f"{dup} QoS 2 messages delivered twice to the application"
    assert rx.moves >= 1


def _haproxy_config(tmp: Path, port: int, edges: list[Edge]) -> Path:
    """conf/cluster/haproxy.cfg with this test's addresses: its own front port, the edges'."""
    text = (ROOT / "conf" / "cluster" / "haproxy.cfg").read_text()
    text = re.sub(r"bind :\d+", f"bind 127.0.0.1:{port}", text)
    servers = "\n".join(f"    server edge{i} 127.0.0.1:{e.port}" for i, e in enumerate(edges))
    text = re.sub(r"(    server edge\d+ \S+\n?)+", servers + "\n", text)
    text = text.replace("global\n", f"global\n    pidfile {tmp / 'haproxy.pid'}\n")
    text = re.sub(r"maxconn \d+", "maxconn 4000", text)  # (100,000 needs 200,000 descriptors; a test has 20,000)
    path = tmp / "haproxy.cfg"
    path.write_text(text)
    return path


def _status(edges: list[Edge]) -> dict:
    """``lakegate status --format json`` with the first edge's settings."""
    import json

    sets = [a for i, a in enumerate(edges[0].args) if i and edges[0].args[i - 1] == "--set"]
    args = [sys.executable, "-m", "bridge", "status", "--format", "json"]
    for kv in sets:
        args += ["--set", kv]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_behind_haproxy_a_client_whose_edge_dies_resumes_through_the_same_address(kafka, kafka_topic, edges,
                                                                                  tmp_path):
    """The README's deployment: HAProxy (conf/cluster/haproxy.cfg) in front of
    two edges. mosquitto_sub keeps one address; its edge is SIGKILLed; it
    reconnects through HAProxy to the other edge, its session moves there,
    and it gets what was published meanwhile. ``lakegate status`` shows the
    members, and the dead one."""
    import shutil

    from tests.conftest import free_port

    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (scripts/services up installs it)")
    a, b = edges(kafka, kafka_topic("lg-cl-ha"), 2)
    front = free_port()
    ha = subprocess.Popen(["haproxy", "-db", "-f", str(_haproxy_config(tmp_path, front, [a, b]))],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sub = None
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket_ok = RawClient(front, timeout=2)
                socket_ok.close()
                break
            except OSError:
                time.sleep(0.2)
        sub = _mosquitto("mosquitto_sub", front, "-t", "ha/#", "-q", "1", "-c", "-i", "ha-reader",
                         "-V", "mqttv311")
        time.sleep(1.5)
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(front), "-t", "ha/1", "-q", "1", "-m",
                        "first", "-V", "mqttv311"], check=True, timeout=30)
        assert _lines(sub, 1, 15) == ["first"]
        time.sleep(1.0)  # beats with the connection counts
        members = _status([a, b])["cluster"]["members"]
        assert {k: m["alive"] for k, m in members.items()} == {"0": True, "1": True}
        holder = a if members["0"]["info"]["connections"] == 1 else b
        holder.kill()
        for i in range(3):
            subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(front), "-t", f"ha/{i}", "-q", "1",
                            "-m", f"later{i}", "-V", "mqttv311"], check=True, timeout=30)
        got: list[str] = []  # mosquitto_sub reconnects by itself, through HAProxy
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not {f"later{i}" for i in range(3)} <= set(got):
            got += _lines(sub, 1, 1)
        assert [x for x in got if x != "first"] == [f"later{i}" for i in range(3)], got
        members = _status([a, b])["cluster"]["members"]
        dead = "0" if holder is a else "1"
        assert members[dead]["alive"] is False and members[str(1 - int(dead))]["alive"] is True
    finally:
        if sub is not None:
            sub.kill()
        ha.terminate()
        ha.wait(10)
