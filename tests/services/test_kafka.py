"""The real Apache Kafka the suite depends on (scripts/kafka, started by
scripts/services): one node on 127.0.0.1:9092, and a three-node cluster
(replication factor 3, min.insync.replicas 2) a test starts on ports of its
own and stops."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import kafka_node

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / ".jvm" / "lib" / "kafka-server"


def _topic(admin, name: str, partitions: int, replicas: int = -1) -> None:
    from confluent_kafka.admin import NewTopic

    for fut in admin.create_topics([NewTopic(name, partitions, replicas)]).values():
        fut.result(30)


def test_a_record_produced_with_headers_reads_back_with_kafkas_own_console_consumer(kafka, kafka_topic):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    name = kafka_topic("lg-svc")
    _topic(AdminClient({"bootstrap.servers": kafka}), name, 1)
    p = Producer({"bootstrap.servers": kafka, "enable.idempotence": True, "acks": "all"})
    reports = []
    p.produce(name, key=b"client-1", value=b"\x30\x05\x00\x01ahi", headers=[("seq", b"7")],
              on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert p.flush(30) == 0
    assert reports == [(None, 0)]
    out = subprocess.run(
        ["java", "-cp", f"{LIBS}/*", "org.apache.kafka.tools.consumer.ConsoleConsumer",
         "--bootstrap-server", kafka, "--topic", name, "--from-beginning", "--max-messages", "1",
         "--timeout-ms", "30000", "--formatter-property", "print.key=true", "--formatter-property", "print.headers=true"],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\t")[:2] == ["seq:7", "client-1"], out.stdout


@pytest.mark.slow
def test_three_node_cluster_loses_no_acknowledged_record_when_a_broker_is_sigkilled(kafka_cluster):
    """acks=all with min.insync.replicas 2: every record whose delivery report
    said delivered is there after one broker of three was SIGKILLed under load."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    servers, args = kafka_cluster
    name = "lg-svc3-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": servers})
    _topic(admin, name, 3, 3)
    p = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                  "delivery.timeout.ms": 60000})
    acked: set[bytes] = set()
    failed: list[str] = []
    lock = threading.Lock()

    def report(err, msg) -> None:
        with lock:
            if err is None:
                acked.add(msg.value())
            else:
                failed.append(str(err))

    total = 6000
    deadline = time.monotonic() + 120
    for i in range(total):  # bounded in count and time
        while True:
            try:
                p.produce(name, value=b"%08d" % i, partition=i % 3, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
        if i == total // 3:  # a third in: the leader of partition 0 goes
            leader = admin.list_topics(name, timeout=10).topics[name].partitions[0].leader
            kafka_node("kill", leader, args)
        if i % 100 == 0:
            time.sleep(0.01)  # about 5,000 records/s: the kill lands mid-stream
        assert time.monotonic() < deadline
    assert p.flush(90) == 0
    assert not failed, failed[:3]
    assert len(acked) == total
    c = Consumer({"bootstrap.servers": servers, "group.id": "lg-svc-check", "enable.auto.commit": False})
    try:
        seen: set[bytes] = set()
        c.assign([TopicPartition(name, p_, 0) for p_ in range(3)])
        end = time.monotonic() + 60
        while len(seen) < total and time.monotonic() < end:
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    seen.add(m.value())
    finally:
        c.close()
    assert acked - seen == set()
