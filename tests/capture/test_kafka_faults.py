"""The capture log on Kafka under faults (issue 42, deliverable 5), against
the real Kafka: a real ``lakegate edge`` subprocess (``capture.backend =
"kafka"``, a topic of each test's own) with QoS 1 publishers on raw sockets.

* the edge SIGKILLed at five points of the append / delivery / ack path
  (on the one-node Kafka and on the three-node cluster) and started again
  at once on the same data_dir and topic: every PUBACKed
  message is in the topic once, in its client's partition, in publish
  order; the restart predicts its offsets right [LG-capture-kafka-offset];
  and the job run once over the topic writes one ``messages`` row per
  capture record;
* a three-node cluster (replication factor 3, min.insync.replicas 2): the
  leader of a partition SIGKILLed under QoS 1 load, and every PUBACKed
  message is there after, the edge never failing [LG-capture-kafka-offset];
* Kafka entirely down: no PUBACK / PUBREC while it is, one warning line
  naming kafka.bootstrap_servers, ``lakegate status`` says so, the edge
  resumes when Kafka returns within kafka.delivery_timeout_ms and exits 1
  with one line naming it when Kafka stays away longer; wrong bootstrap
  servers at start are one line naming them.

Every load loop is bounded in count and time; every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from bridge.capture.kafka_reader import KafkaLogReader
from bridge.capture.record import partition_for
from bridge.config import load_config
from bridge.mqtt import Properties
from tests.conftest import child_env, free_port, free_port_block, kafka_node
from tests.edge.conftest import RawClient
from tests.edge.util import connect
from tests.waiting import holds_for, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SCRIPT = str(ROOT / "scripts" / "kafka")
PARTS = 3
PAYLOAD = re.compile(rb"lgk:(\d+):(\d+):(\d+)$")  # run, publisher, message number


# ------------------------------------------------------------------ helpers
def _overrides(servers: str, topic: str, data_dir: Path, *extra: str) -> list[str]:
    return ["capture.backend=kafka", f"kafka.bootstrap_servers={servers}", f"kafka.topic={topic}",
            "kafka.create_topic=true", f"capture.partitions={PARTS}", f"data_dir={data_dir}", "amqp.url=",
            *extra]


def _config(servers: str, topic: str, data_dir: Path, *extra: str):
    return load_config(None, _overrides(servers, topic, data_dir, *extra), env={})


def _healthz(port: int) -> tuple[int, dict]:
    """(status, body) of the edge's /healthz on ``port``."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Edge:
    """``lakegate edge`` in a subprocess; stderr to a file."""

    def __init__(self, tmp: Path, servers: str, topic: str, data_dir: Path, *extra: str,
                 failpoints: str = "", name: str = "edge") -> None:
        self.errpath = tmp / f"{name}-{uuid.uuid4().hex[:6]}.err"
        args = [sys.executable, "-m", "bridge", "edge", "--port", "0"]
        for o in _overrides(servers, topic, data_dir, "log_level=INFO", *extra):
            args += ["--set", o]
        env = child_env(**({"LAKEGATE_FAILPOINTS": failpoints} if failpoints else {}))
        with open(self.errpath, "w") as err:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        self.port = None
        line = self.proc.stdout.readline()  # the listening line, or "" when it exited
        m = re.search(r"mqtt://127\.0\.0\.1:(\d+)", line)
        if m is None:
            self.proc.wait(30)
            raise AssertionError(f"the edge printed no listening line (exit {self.proc.returncode}):\n"
                                 + self.stderr()[-3000:])
        self.port = int(m.group(1))

    def stderr(self) -> str:
        return self.errpath.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(60)


def _edge_start(*args, **kw) -> Edge:
    """An Edge; the start line read with a deadline (a hung start fails the test, not the run)."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(_try(Edge, *args, **kw)), daemon=True)
    t.start()
    t.join(90)
    assert box, "the edge did not print its listening line within 90 s"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _try(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except BaseException as exc:  # handed to the caller's thread
        return exc


class Publisher(threading.Thread):
    """A QoS 1 publisher (MQTT 3.1.1, clean session) on a raw socket: at most
    ``window`` PUBLISHes awaiting PUBACK, ``count`` messages at most, at
    most ``rate`` messages a second, for ``seconds`` at most. ``acked``:
    the message numbers PUBACKed, in order; ``sent``: those sent. Stops at
    the first closed connection (the edge was killed) or at its bounds."""

    def __init__(self, port: int, run: int, pub: int, count: int, *, window: int = 20, rate: float = 0,
                 seconds: float = 60, qos: int = 1) -> None:
        super().__init__(daemon=True)
        self.port, self.run_no, self.pub, self.count = port, run, pub, count
        self.window, self.rate, self.seconds, self.qos = window, rate, seconds, qos
        self.client_id = f"pub-{run}-{pub}"
        self.acked: list[int] = []
        self.sent: list[int] = []
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self.stop_flag = threading.Event()

    def payload(self, i: int) -> bytes:
        return f"lgk:{self.run_no}:{self.pub}:{i}".encode()

    def run(self) -> None:
        from tests.edge.conftest import RawClient
        from tests.edge.util import publish

        try:
            c = RawClient(self.port, timeout=0.5)
            c.send(connect(4, client_id=self.client_id))
            pkt = self._packet(c, time.monotonic() + max(10.0, self.seconds))  # (waits for Kafka too)
            if not pkt or pkt[0] != 0x20 or pkt[3] != 0:
                return
            self.connected.set()
            t0 = time.monotonic()
            deadline = t0 + self.seconds
            waiting: dict[int, int] = {}  # packet id -> message number
            i = 0
            while time.monotonic() < deadline and not self.stop_flag.is_set():
                while i < self.count and len(waiting) < self.window and (
                        not self.rate or i < (time.monotonic() - t0) * self.rate):
                    pid = i % 65000 + 1
                    waiting[pid] = i
                    self.sent.append(i)
                    c.send(publish(4, topic=f"lgk/{self.pub}", payload=self.payload(i), qos=self.qos,
                                   packet_id=pid))
                    i += 1
                if i >= self.count and not waiting:
                    return
                pkt = self._packet(c, time.monotonic() + 0.05)
                if pkt is None:
                    continue
                if not pkt:
                    return  # closed
                if pkt[0] == 0x40:  # PUBACK
                    self.acked.append(waiting.pop((pkt[2] << 8) | pkt[3]))
                elif pkt[0] == 0x50:  # PUBREC (QoS 2): counted as acknowledged, PUBREL sent
                    pid = (pkt[2] << 8) | pkt[3]
                    self.acked.append(waiting.pop(pid))
                    c.send(bytes([0x62, 2, pkt[2], pkt[3]]))
            c.close()
        except OSError:
            return
        except BaseException as exc:
            self.error = exc

    @staticmethod
    def _packet(c, deadline: float) -> bytes | None:
        """The next packet; b"" when closed; None when none came before ``deadline``."""
        from bridge.mqtt import frame_length

        while True:
            total = frame_length(c.buf, from_client=False) if c.buf else None
            if total is not None and len(c.buf) >= total:
                pkt, c.buf = c.buf[:total], c.buf[total:]
                return pkt
            if time.monotonic() >= deadline:
                return None
            try:
                chunk = c.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return b""
            if not chunk:
                return b""
            c.buf += chunk


def _topic_records(cfg) -> list:
    """Every record of the capture topic, (partition, offset) order (the reader checks offsets are dense)."""
    reader = KafkaLogReader(cfg)
    try:
        ends = reader.durable_offsets()
        return [r for p in range(PARTS) for r in reader.records(p, 0, ends[p])]
    finally:
        reader.close()


def _published(records) -> dict[tuple[int, int, int], list]:
    """(run, publisher, message number) -> the records of that PUBLISH."""
    out: dict[tuple[int, int, int], list] = {}
    for r in records:
        m = PAYLOAD.search(r.value)
        if m:
            out.setdefault(tuple(int(x) for x in m.groups()), []).append(r)
    return out


def _check_acked_in_topic(records, pubs: list[Publisher]) -> int:
    """Every PUBACKed message of ``pubs`` is in the topic exactly once, in
    the partition of its client, after the client's earlier messages; no
    message is there twice. Returns the number of acknowledged messages."""
    found = _published(records)
    twice = {k: [(r.partition, r.offset) for r in v] for k, v in found.items() if len(v) > 1}
    assert not twice, f"messages captured more than once: {dict(list(twice.items())[:5])}"
    n = 0
    for pub in pubs:
        part = partition_for(_partition_key(records, pub.client_id), PARTS)
        offsets = []
        for i in pub.acked:
            recs = found.get((pub.run_no, pub.pub, i))
            assert recs, f"{pub.client_id}: message {i} was PUBACKed but is not in the topic"
            assert recs[0].partition == part, (pub.client_id, i, recs[0].partition, part)
            offsets.append(recs[0].offset)
        assert offsets == sorted(offsets), f"{pub.client_id}: acknowledged messages out of publish order"
        n += len(pub.acked)
    return n


def _partition_key(records, client_id: str) -> str:
    """The partition key of a client's connection: its records' conn_id header."""
    for r in records:
        if r.key == client_id.encode():
            return dict(r.stored_headers)["conn_id"].decode()
    raise AssertionError(f"no record of client {client_id}")


def _delete_topic(servers: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": servers}).delete_topics([topic])[topic].result(30)
    except Exception:
        pass


# ------------------------------------------------ 1. SIGKILL of the edge
#: where each run of the edge dies: a failpoint of bridge/capture/kafka_log.py
#: (at the capture sequence BASE + this many records past the run's start) or
#: a SIGKILL from the test once this many messages are PUBACKed
KILLS = [
    ("failpoint", "capture-kafka-before-produce", 120),  # a record not produced, earlier ones in flight
    ("failpoint", "capture-kafka-after-produce", 140),   # produced, in librdkafka's queue or on the wire
    ("failpoint", "capture-kafka-delivered", 160),       # in Kafka, its PUBACK not sent
    ("failpoint", "capture-kafka-acked", 180),           # in Kafka, its PUBACK maybe sent
    ("sigkill", "", 150),                                # the test's SIGKILL under load, PUBACKs flowing
]
PUBS = 3
PER_PUB = 150


@pytest.mark.spark
@pytest.mark.timeout(600)
@pytest.mark.parametrize("brokers", ["one-node", "three-node"])
def test_lg_capture_kafka_offset_edge_sigkilled_at_five_points_loses_no_acked_message_nor_duplicates_a_row(
        brokers, request, spark, tmp_path):
    """On the one-node Kafka, and on the three-node cluster with replication
    factor 3 (acks=all waits for min.insync.replicas = 2 of them)."""
    from bridge.tables.deltars import DeltaRsEngine
    from tests.job.frames import run_once

    if brokers == "one-node":
        kafka, extra = request.getfixturevalue("kafka"), ()
    else:
        kafka, extra = request.getfixturevalue("kafka_cluster")[0], ("kafka.replication_factor=3",)
    topic = f"lg-faults-{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    cfg = _config(kafka, topic, data, *extra)
    pubs: list[Publisher] = []
    try:
        for run, (how, point, at) in enumerate(KILLS):
            fp = ""
            if how == "failpoint":
                ends = sum(_ends(cfg)) if run else 0
                fp = f"{point}@{ends + at}"  # next seq >= the records in the topic; dies after `at` more
            edge = _edge_start(tmp_path, kafka, topic, data, *extra, failpoints=fp, name=f"run{run}")
            try:
                assert "next offsets" in edge.stderr()
                mine = [Publisher(edge.port, run, k, PER_PUB, window=10) for k in range(PUBS)]
                for p in mine:
                    p.start()
                if how == "sigkill":
                    wait_for(lambda: sum(len(p.acked) for p in mine) >= at, 60, "PUBACKs under load")
                    edge.kill()
                else:
                    wait_for(lambda: edge.proc.poll() is not None, 60, f"the edge to die at {fp}")
                for p in mine:
                    p.join(30)
                    assert not p.is_alive() and p.error is None, p.error
                pubs += mine
                assert edge.proc.wait(30) == -signal.SIGKILL, edge.stderr()[-3000:]
                assert sum(len(p.acked) for p in mine) < PUBS * PER_PUB, "the kill came after the load"
            finally:
                edge.kill()
            # the next run starts at once: right after the kill [LG-capture-kafka-offset]
        edge = _edge_start(tmp_path, kafka, topic, data, *extra, name="last")
        try:
            last = [Publisher(edge.port, len(KILLS), k, 40, window=10) for k in range(PUBS)]
            for p in last:
                p.start()
            for p in last:
                p.join(60)
                assert p.acked == list(range(40)), (p.client_id, len(p.acked))
            pubs += last
            assert edge.stop() == 0, edge.stderr()[-3000:]
        finally:
            edge.kill()
        assert "LG-capture-kafka-offset" not in edge.stderr()
        records = _topic_records(cfg)
        acked = _check_acked_in_topic(records, pubs)
        assert acked >= len(KILLS) * 100
        seqs = [r.seq for r in records]
        assert len(set(seqs)) == len(seqs), "a capture sequence number given twice"

        run_once(spark, cfg)
        rows = DeltaRsEngine(cfg.tables_dir).arrow("messages").to_pylist()
        at = {}
        for r in rows:
            at.setdefault((r["partition"], r["offset"]), []).append(r)
        dup = {k: len(v) for k, v in at.items() if len(v) > 1}
        assert not dup, f"capture records with more than one messages row: {dup}"
        got = {(m.groups()) for r in rows if (m := PAYLOAD.search(r["payload"] or b""))}
        for p in pubs:
            for i in p.acked:
                assert (str(p.run_no).encode(), str(p.pub).encode(), str(i).encode()) in got, (p.client_id, i)
    finally:
        _delete_topic(kafka, topic)


def _ends(cfg) -> list[int]:
    reader = KafkaLogReader(cfg)
    try:
        return reader.durable_offsets()
    finally:
        reader.close()


#: a writer of the capture topic that appends as fast as it may (its bytes
#: in flight bounded by capture.max_pending_bytes) and prints
#: ``i partition offset`` once each append is confirmed; SIGKILLed by the test
WRITER = r"""
import sys
from bridge.capture.kafka_log import KafkaCaptureLog
from bridge.config import load_config
cfg = load_config(None, sys.argv[1:], env={})
log = KafkaCaptureLog.open(cfg)
print("ready", flush=True)
pending, i = [], 0
while True:
    for _ in range(64):
        pending.append((i, log.append(f"w{i % 11}", b"k%d" % i, b"v%d" % i + b"." * 200)))
        i += 1
    done = 0
    for j, ack in pending:
        if not ack.done():
            break
        ack.wait(0)
        done += 1
    if done:
        sys.stdout.write("".join(f"{j} {a.partition} {a.offset}\n" for j, a in pending[:done]))
        sys.stdout.flush()
        del pending[:done]
"""


@pytest.mark.timeout(300)
def test_lg_capture_kafka_offset_a_log_reopened_right_after_its_writer_was_sigkilled_predicts_its_offsets(
        kafka, tmp_path):
    """The writer SIGKILLed with records in flight, the log opened again at
    once (the late records of the dead producer must not land after the
    new one's prediction): every confirmed record is where its ack said,
    the new appends are confirmed at their predicted offsets. Five rounds."""
    _reopen_after_kill(kafka, tmp_path)


def _reopen_after_kill(servers: str, tmp_path: Path, *extra: str, rounds: int = 5) -> None:
    from bridge.capture.kafka_log import KafkaCaptureLog

    topic = f"lg-faults-{uuid.uuid4().hex[:10]}"
    over = _overrides(servers, topic, tmp_path / "data", "kafka.linger_ms=20", "capture.max_pending_bytes=4000000",
                      *extra)
    cfg = load_config(None, over, env={})
    try:
        for rnd in range(rounds):
            child = subprocess.Popen([sys.executable, "-c", WRITER, *over], cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True, env=child_env())
            try:
                lines, reading = _read_lines(child, 2000 + 500 * rnd, 60)
            finally:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(30)
            reading.join(30)
            log = KafkaCaptureLog.open(cfg)  # at once
            try:
                acks = [log.append(f"n{k}", b"n", f"new-{rnd}-{k}".encode()) for k in range(60)]
                log.flush(60)
                assert log.failed is None
            finally:
                log.close()
            at = {(r.partition, r.offset): r.value for r in _topic_records(cfg)}
            for k, a in enumerate(acks):
                assert at[(a.partition, a.offset)] == f"new-{rnd}-{k}".encode(), (rnd, k)
            for line in lines:
                i, p, o = map(int, line.split())
                assert at[(p, o)] == b"v%d" % i + b"." * 200, (rnd, i, p, o)
    finally:
        _delete_topic(servers, topic)


def _read_lines(child: subprocess.Popen, n: int, timeout: float) -> tuple[list[str], threading.Thread]:
    """Lines of a writer child after its ``ready``, until at least ``n`` (with a deadline)."""
    out: list[str] = []
    done = threading.Event()

    def read() -> None:  # to the end: every line printed before the kill is a confirmed record
        for line in child.stdout:
            if line.endswith("\n") and line.strip() != "ready":  # not the last, cut short by the kill
                out.append(line)
            if len(out) >= n:
                done.set()
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert done.wait(timeout), f"the writer confirmed {len(out)} records of {n} within {timeout} s"
    assert child.poll() is None, "the writer exited"
    return out, t


# ------------------------------------------- 2. a broker of three SIGKILLed
def _leader(servers: str, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": servers}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[partition].leader


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lg_capture_kafka_offset_a_partition_leader_sigkilled_under_qos1_load_loses_no_acked_message(
        kafka_cluster, tmp_path):
    """Replication factor 3, min.insync.replicas 2, acks=all: the leader of
    a publisher's partition SIGKILLed a third into a bounded QoS 1 load;
    librdkafka's idempotent producer re-sends to the new leader and the
    offsets stay dense: the edge never fails [LG-capture-kafka-offset],
    every PUBACKed message is in the topic once, in publish order."""
    servers, args = kafka_cluster
    topic = f"lg-faults3-{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    cfg = _config(servers, topic, data, "kafka.replication_factor=3")
    killed = None
    try:
        edge = _edge_start(tmp_path, servers, topic, data, "kafka.replication_factor=3",
                           "kafka.delivery_timeout_ms=60000")
        try:
            pubs = [Publisher(edge.port, 0, k, 3000, window=20, rate=150, seconds=60) for k in range(4)]
            for p in pubs:
                p.start()
            wait_for(lambda: sum(len(p.acked) for p in pubs) >= 1500, 60, "a third of the load PUBACKed")
            part = partition_for(_partition_key(_topic_records(cfg), pubs[0].client_id), PARTS)
            killed = _leader(servers, topic, part)
            kafka_node("kill", killed, args)
            n_at_kill = len(pubs[0].acked)
            for p in pubs:
                p.join(120)
                assert not p.is_alive() and p.error is None, (p.client_id, p.error)
            assert edge.proc.poll() is None, edge.stderr()[-3000:]
            assert len(pubs[0].acked) > n_at_kill, "no PUBACK after the kill"
            assert [len(p.acked) for p in pubs] == [3000] * 4, "a publisher was cut off"
            assert _leader(servers, topic, part) not in (killed, -1)
            assert edge.stop() == 0, edge.stderr()[-3000:]
        finally:
            edge.kill()
        err = edge.stderr()
        assert "LG-capture-kafka-offset" not in err and "capture log failed" not in err, err[-3000:]
        records = _topic_records(cfg)
        assert _check_acked_in_topic(records, pubs) == 12000
    finally:
        if killed is not None:
            kafka_node("start", killed, args)
        _delete_topic(servers, topic)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lg_capture_kafka_offset_reopened_right_after_a_kill_on_three_replicas_predicts_its_offsets(
        kafka_cluster, tmp_path):
    """As on one node, with replication factor 3: the high watermark the
    reopened log starts from trails the leader's log end until the
    followers have the dead producer's last records."""
    servers, _args = kafka_cluster
    _reopen_after_kill(servers, tmp_path, "kafka.replication_factor=3")


# ------------------------------------------------ 3. Kafka entirely down
@pytest.fixture(scope="module")
def solo(tmp_path_factory):
    """A one-node Kafka of this module's own on free ports (broker P, controller P+100), stopped after."""
    base = free_port_block((0, 100))
    d = tmp_path_factory.mktemp("kafka1")
    args = ["--nodes", "1", "--port", str(base), "--dir", str(d)]
    up = subprocess.run([KAFKA_SCRIPT, "up", *args], capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        if "not started" in up.stdout:
            pytest.skip(up.stdout.strip())
        yield f"127.0.0.1:{base}", args
    finally:
        subprocess.run([KAFKA_SCRIPT, "down", *args], capture_output=True, timeout=120)


def _lakegate(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=tmp_path)


def _no_ack_while_down(edge: Edge, run: int) -> list[Publisher]:
    """A QoS 1 and a QoS 2 publisher that connect and get no CONNACK (the
    CONNECT's record waits for Kafka like any other), so no PUBACK / PUBREC,
    for 3 s."""
    pubs = [Publisher(edge.port, run, 0, 5, window=5, seconds=120, qos=1),
            Publisher(edge.port, run, 1, 5, window=5, seconds=120, qos=2)]
    for p in pubs:
        p.start()
    holds_for(lambda: all(not p.acked for p in pubs), 3, "no PUBACK or PUBREC while Kafka is down")
    return pubs


def _connect_waiting(port: int) -> RawClient:
    """A client whose CONNECT gets no CONNACK for 2 s (Kafka is down: the
    CONNECT is not durable, so the session it starts is not acknowledged)."""
    c = RawClient(port)
    c.send(connect(5, client_id="waits-for-kafka", clean_start=True,
                   properties=Properties(session_expiry_interval=300)))
    assert not select.select([c.sock], [], [], 2)[0], "an answer to a CONNECT Kafka does not have"
    c.sock.settimeout(90)
    return c


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lg_edge_capture_failed_kafka_down_acks_nothing_says_so_and_everything_resumes_when_it_returns(
        solo, tmp_path):
    """Kafka SIGKILLed under a running edge: QoS 1 / 2 publishers get no
    PUBACK / PUBREC; the edge says why in one line naming
    kafka.bootstrap_servers; ``lakegate status`` says the capture log on
    Kafka does not answer; Kafka back within kafka.delivery_timeout_ms:
    the waiting messages are acknowledged, the edge never stopped, and
    every PUBACKed message is in the topic."""
    servers, args = solo
    topic = f"lg-down-{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    cfg = _config(servers, topic, data)
    metrics = free_port()
    edge = _edge_start(tmp_path, servers, topic, data, "kafka.delivery_timeout_ms=120000", "log_level=WARNING",
                       f"metrics.port={metrics}")
    killed = False
    try:
        before = Publisher(edge.port, 0, 9, 20)
        before.start()
        before.join(30)
        assert before.acked == list(range(20))
        assert _healthz(metrics)[0] == 200
        kafka_node("kill", 1, args)
        killed = True
        pubs = _no_ack_while_down(edge, 1)
        waiting = _connect_waiting(edge.port)
        line = wait_for(lambda: [x for x in edge.stderr().splitlines() if "no broker answers" in x], 30,
                        "the edge's line saying Kafka does not answer")
        assert len(line) == 1 and f"kafka.bootstrap_servers = '{servers}'" in line[0], line
        assert "nothing is acknowledged" in line[0]
        status = _lakegate(tmp_path, "status", *[a for o in _overrides(servers, topic, data) for a in ("--set", o)])
        assert "capture log on Kafka" in status.stderr and f"kafka.bootstrap_servers = '{servers}'" in \
            status.stderr, status.stderr
        # /healthz fails once a record has waited STALL_S for Kafka, saying so
        code, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_healthz(metrics)), 30, "/healthz 503")
        assert "waiting" in body["checks"]["capture_log"]["detail"], body
        assert edge.proc.poll() is None
        kafka_node("start", 1, args)
        killed = False
        for p in pubs:
            p.join(90)
            assert p.acked == list(range(5)), (p.client_id, p.acked, edge.stderr()[-2000:])
        assert "acknowledging resumes" in edge.stderr()
        assert waiting.packet()[:1] == b"\x20"  # the CONNACK, now that the CONNECT is in Kafka
        assert wait_for(lambda: _healthz(metrics)[0] == 200, 30, "/healthz 200 again")
        assert edge.proc.poll() is None
        assert edge.stop() == 0, edge.stderr()[-3000:]
    finally:
        edge.kill()
        if killed:
            kafka_node("start", 1, args)
    _check_acked_in_topic(_topic_records(cfg), [before, *pubs])
    _delete_topic(servers, topic)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lg_edge_capture_failed_kafka_down_longer_than_the_delivery_timeout_stops_the_edge_with_one_line(
        solo, tmp_path):
    """Kafka away longer than kafka.delivery_timeout_ms: nothing is
    acknowledged, the capture log fails and ``lakegate edge`` exits 75 (try
    again later: what ``lakegate run`` starts its edge again on) with one line
    naming kafka.bootstrap_servers; started again once Kafka is
    back, on the same data_dir and topic, it acknowledges again and what it
    acknowledged before is in the topic."""
    servers, args = solo
    topic = f"lg-down-{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    cfg = _config(servers, topic, data)
    edge = _edge_start(tmp_path, servers, topic, data, "kafka.delivery_timeout_ms=4000", "log_level=WARNING")
    killed = False
    try:
        before = Publisher(edge.port, 0, 9, 20)
        before.start()
        before.join(30)
        assert before.acked == list(range(20))
        kafka_node("kill", 1, args)
        killed = True
        pubs = _no_ack_while_down(edge, 1)
        assert edge.proc.wait(60) == 75  # EXIT_UNAVAILABLE
        for p in pubs:
            p.join(30)
            assert not p.acked, p.client_id
        err = edge.stderr()
        last = [x for x in err.splitlines() if x.startswith("lakegate:")]
        assert len(last) == 1, err[-3000:]
        assert last[0].startswith("lakegate: edge stopped: capture log failed: ")
        assert "Message timed out" in last[0] and f"kafka.bootstrap_servers = '{servers}' up?" in last[0], last[0]
        assert "Traceback" not in err
    finally:
        edge.kill()
        if killed:
            kafka_node("start", 1, args)
    edge = _edge_start(tmp_path, servers, topic, data, "log_level=WARNING", name="again")
    try:
        after = Publisher(edge.port, 2, 0, 20)
        after.start()
        after.join(30)
        assert after.acked == list(range(20)), edge.stderr()[-3000:]
        assert edge.stop() == 0
    finally:
        edge.kill()
    _check_acked_in_topic(_topic_records(cfg), [before, after])
    _delete_topic(servers, topic)


@pytest.mark.timeout(120)
def test_wrong_kafka_bootstrap_servers_at_start_is_one_line_naming_them_and_exit_75(tmp_path):
    """No broker at kafka.bootstrap_servers: ``lakegate edge`` waits about
    10 s, then one line on stderr naming the setting and its value, no
    traceback, exit 75 (try again later: a wrong address cannot be told from
    Kafka being down)."""
    port = free_port()  # nothing listens there
    r = _lakegate(tmp_path, "edge", "--port", "0",
                  *[a for o in _overrides(f"127.0.0.1:{port}", "lg-nowhere", tmp_path / "data") for a in ("--set", o)])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines == [f"lakegate: capture log on Kafka: no broker answered at kafka.bootstrap_servers = "
                     f"'127.0.0.1:{port}' within 10 s (Failed to get metadata: Local: Broker transport failure)"], \
        r.stderr
    assert r.returncode == 75  # EXIT_UNAVAILABLE
    assert "listening" not in r.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lg_capture_kafka_offset_an_edge_started_right_after_its_leader_died_starts_once_another_is_elected(
        kafka_cluster, tmp_path):
    """The edge (re)started while the leader of one of its partitions is
    dead and not yet replaced (Kafka fences it after
    broker.session.timeout.ms, 9 s): the log's open waits for the new
    leader (it used to give up after 10 s, LogUnavailableError, exit 1),
    predicts its offsets right, and the edge acknowledges."""
    servers, args = kafka_cluster
    topic = f"lg-faults3-{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    cfg = _config(servers, topic, data, "kafka.replication_factor=3")
    killed = None
    try:
        edge = _edge_start(tmp_path, servers, topic, data, "kafka.replication_factor=3", name="first")
        try:
            first = Publisher(edge.port, 0, 0, 50)
            first.start()
            first.join(30)
            assert first.acked == list(range(50))
            assert edge.stop() == 0
        finally:
            edge.kill()
        killed = _leader(servers, topic, partition_for(_partition_key(_topic_records(cfg), first.client_id), PARTS))
        kafka_node("kill", killed, args)
        t0 = time.monotonic()
        edge = _edge_start(tmp_path, servers, topic, data, "kafka.replication_factor=3", name="second")
        try:
            took = time.monotonic() - t0
            second = Publisher(edge.port, 1, 0, 50)
            second.start()
            second.join(60)
            assert second.acked == list(range(50)), edge.stderr()[-3000:]
            assert edge.stop() == 0
        finally:
            edge.kill()
        assert "LG-capture-kafka-offset" not in edge.stderr()
        _check_acked_in_topic(_topic_records(cfg), [first, second])
        assert took < 60
    finally:
        if killed is not None:
            kafka_node("start", killed, args)
        _delete_topic(servers, topic)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reader_made_before_a_partition_leader_was_sigkilled_reads_offsets_and_records_after(
        kafka_cluster, tmp_path):
    """A long-lived KafkaLogReader (the edge's, the live forwarder's) whose
    consumer knows the leader that died: durable_offsets asks a new
    consumer (it used to ask the dead leader until librdkafka's metadata
    refresh, minutes), and records read from the new leader."""
    from bridge.capture.kafka_log import KafkaCaptureLog

    servers, args = kafka_cluster
    topic = f"lg-faults3-{uuid.uuid4().hex[:10]}"
    cfg = _config(servers, topic, tmp_path / "data", "kafka.replication_factor=3")
    killed = None
    try:
        log = KafkaCaptureLog.open(cfg)
        try:
            acks = [log.append(f"c{k}", b"k", b"v%d" % k) for k in range(60)]
            log.flush(30)
        finally:
            log.close()
        reader = KafkaLogReader(cfg)
        try:
            ends = reader.durable_offsets()
            assert sum(ends) == 60
            killed = _leader(servers, topic, 1)
            kafka_node("kill", killed, args)
            t0 = time.monotonic()
            assert reader.durable_offsets() == ends
            assert time.monotonic() - t0 < 40
            got = {(r.partition, r.offset): r.value for p in range(PARTS) for r in reader.records(p, 0, ends[p])}
            assert got == {(a.partition, a.offset): b"v%d" % k for k, a in enumerate(acks)}
        finally:
            reader.close()
    finally:
        if killed is not None:
            kafka_node("start", killed, args)
        _delete_topic(servers, topic)
