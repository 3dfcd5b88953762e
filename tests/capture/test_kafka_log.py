"""The capture log on Kafka (capture.backend = "kafka"): KafkaCaptureLog and
KafkaLogReader against the real one-node Kafka, each test on a topic of its own."""

from __future__ import annotations

import fcntl
import threading
import time
import uuid

import pytest

from bridge.capture import (
    Ack,
    BackPressureTimeout,
    CaptureLog,
    CaptureWriteError,
    LogMismatchError,
    LogReader,
    LogUnavailableError,
    RecordTooLargeError,
    open_capture_log,
    open_reader,
    partition_for,
)
from bridge.capture.kafka_conf import client_conf, printable
from bridge.capture.kafka_log import KafkaCaptureLog
from bridge.capture.kafka_reader import KafkaLogReader
from bridge.config import load_config
from tests.capture.util import frame, headers, key
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

PARTS = 3
MADE: list[str] = []  # every topic name this module used, deleted at its end


@pytest.fixture(autouse=True, scope="module")
def _delete_topics():
    yield
    from tests.conftest import KAFKA, delete_kafka_topics

    delete_kafka_topics(f"{KAFKA[0]}:{KAFKA[1]}", MADE)


def _config(kafka, tmp_path, *extra, topic=None):
    topic = topic or f"t-{uuid.uuid4().hex[:12]}"
    MADE.append(topic)
    return load_config(None, ["capture.backend=kafka", f"kafka.bootstrap_servers={kafka}", f"kafka.topic={topic}",
                              "kafka.create_topic=true", f"capture.partitions={PARTS}", f"data_dir={tmp_path}",
                              *extra], env={})


def _create(cfg, partitions, **topic_config):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_conf(cfg, "admin"))
    nt = NewTopic(cfg.kafka_topic, num_partitions=partitions, replication_factor=-1,
                  config={k.replace("_", "."): str(v) for k, v in topic_config.items()})
    admin.create_topics([nt])[cfg.kafka_topic].result(timeout=20)
    wait_for(lambda: len(admin.list_topics(cfg.kafka_topic, timeout=5).topics[cfg.kafka_topic].partitions)
             == partitions, what="the new topic's partitions")


def _ts(i):
    return 1_700_000_000_000_000 + i * 1000  # whole milliseconds: Kafka keeps ms


def _append(log, start, stop):
    return [log.append(f"edge:{i % 7}", key(i), frame(i), headers(i), timestamp_us=_ts(i)) for i in range(start, stop)]


def _rows(batches):
    return [row for b in batches for row in b.to_pylist()]


def test_append_acks_with_predicted_offsets_and_reader_reads_them_back(kafka, tmp_path):
    cfg = _config(kafka, tmp_path)
    log = open_capture_log(cfg)
    assert isinstance(log, KafkaCaptureLog)
    try:
        assert log.next_offsets() == [0] * PARTS and log.next_seq == 0
        assert log.root == cfg.capture_dir and log.root.is_dir()
        fired = threading.Event()
        log.on_durable.append(fired.set)
        acks = _append(log, 0, 50)
        acks.append(log.append("big", b"", b"\x30" + b"v" * 5000, [("origin", b"will")], timestamp_us=_ts(50)))
        assert all(type(a) is Ack for a in acks)
        assert [a.seq for a in acks] == list(range(51))
        for p in range(PARTS):  # dense offsets per partition, in append order
            mine = [a.offset for a in acks if a.partition == p]
            assert mine == list(range(len(mine)))
        assert all(a.partition == partition_for(f"edge:{i % 7}", PARTS) for i, a in enumerate(acks[:50]))
        for a in acks:
            a.wait(20)
        assert fired.wait(5)
        assert log.durable_offsets() == log.next_offsets()
        log.flush(10)
    finally:
        log.close()

    reader = open_reader(cfg)
    assert isinstance(reader, KafkaLogReader)
    try:
        assert reader.durable_offsets() == log.next_offsets() and reader.earliest_offsets() == [0] * PARTS
        got = {}
        for p in range(PARTS):
            for r in reader.records(p, 0, reader.durable_offsets()[p]):
                got[r.seq] = r
        assert sorted(got) == list(range(51))
        for i in range(50):
            r = got[i]
            assert (r.partition, r.offset) == (acks[i].partition, acks[i].offset)
            assert (r.key, r.value, list(r.stored_headers), r.timestamp_us) == (key(i), frame(i), headers(i), _ts(i))
            assert r.headers[-1] == ("seq", str(i).encode())
        assert got[50].key == b"" and got[50].value == b"\x30" + b"v" * 5000
        stats = reader.stats()
        assert [s.next_offset for s in stats] == log.next_offsets()
    finally:
        reader.close()


def test_arrow_batches_equal_the_local_logs_for_the_same_records(kafka, tmp_path):
    cfg = _config(kafka, tmp_path / "k")
    with KafkaCaptureLog.open(cfg) as klog:
        kacks = _append(klog, 0, 300)
        klog.flush(20)
    local_cfg = load_config(None, [f"capture.partitions={PARTS}", f"data_dir={tmp_path / 'l'}"], env={})
    with open_capture_log(local_cfg) as llog:
        assert isinstance(llog, CaptureLog)
        lacks = _append(llog, 0, 300)
        llog.flush()
    assert [(a.partition, a.offset, a.seq) for a in kacks] == [(a.partition, a.offset, a.seq) for a in lacks]
    local = open_reader(local_cfg)
    assert isinstance(local, LogReader)
    with KafkaLogReader(cfg) as kreader:
        assert kreader.durable_offsets() == local.durable_offsets()
        for p in range(PARTS):
            end = local.durable_offsets()[p]
            for s, e in ((0, end), (5, min(end, 60))):
                kb = list(kreader.arrow_batches(p, s, e, batch_records=17))
                lb = list(local.arrow_batches(p, s, e, batch_records=17))
                assert all(b.schema.equals(lb[0].schema) for b in kb)
                krows, lrows = _rows(kb), _rows(lb)
                assert len(krows) == len(lrows) == e - s
                for kr, lr in zip(krows, lrows):
                    assert kr.pop("topic") == cfg.kafka_topic and lr.pop("topic") == "mqtt-frames"
                    assert kr == lr


def test_close_and_reopen_continue_offsets_and_seq(kafka, tmp_path):
    cfg = _config(kafka, tmp_path)
    with KafkaCaptureLog.open(cfg) as log:
        _append(log, 0, 20)
        log.flush(20)
        ends, seq = log.next_offsets(), log.next_seq
    assert seq == 20
    with KafkaCaptureLog.open(cfg) as log:
        assert log.next_offsets() == ends and log.next_seq == 20
        acks = _append(log, 20, 40)
        for a in acks:
            a.wait(20)
        assert acks[0].seq == 20
        assert acks[0].offset == ends[acks[0].partition]
    with KafkaLogReader(cfg) as reader:
        seqs = sorted(r.seq for p in range(PARTS) for r in reader.records(p, 0, reader.durable_offsets()[p]))
        assert seqs == list(range(40))


def test_LG_capture_kafka_too_large_is_refused_without_producing_and_the_log_stays_healthy(kafka, tmp_path):
    cfg = _config(kafka, tmp_path, "kafka.create_topic=false")
    _create(cfg, PARTS, max_message_bytes=4096)
    with KafkaCaptureLog.open(cfg) as log:
        assert log.max_record_bytes == 4096
        before = log.next_offsets(), log.next_seq
        with pytest.raises(RecordTooLargeError, match="LG-capture-kafka-too-large") as ei:
            log.append("c", b"k", b"x" * 5000)
        assert ei.value.rule == "LG-capture-kafka-too-large" and ei.value.limit == 4096
        with pytest.raises(RecordTooLargeError):
            log.append_many("c", b"k", [(b"x" * 5000, [])])
        assert (log.next_offsets(), log.next_seq) == before and log.failed is None
        # small records still go, many of them batched together under the topic's limit
        acks = [log.append("c", b"k", b"y" * 900) for _ in range(40)]
        for a in acks:
            a.wait(20)
        assert log.failed is None
        assert [a.seq for a in acks] == list(range(40))


def test_missing_topic_without_create_is_a_clear_error(kafka, tmp_path):
    cfg = _config(kafka, tmp_path, "kafka.create_topic=false")
    with pytest.raises(LogMismatchError) as ei:
        KafkaCaptureLog.open(cfg)
    msg = str(ei.value)
    assert "\n" not in msg and repr(cfg.kafka_topic) in msg and "kafka.create_topic" in msg
    with pytest.raises(LogMismatchError, match="kafka.create_topic"):
        KafkaLogReader(cfg)


def test_LG_capture_kafka_partitions_fewer_partitions_is_a_clear_error(kafka, tmp_path):
    cfg = _config(kafka, tmp_path)
    _create(cfg, 2)
    with pytest.raises(LogMismatchError, match=r"has 2 partitions, fewer than capture.partitions = 3 "
                                               r"\[LG-capture-kafka-partitions\]"):
        KafkaCaptureLog.open(cfg)


def test_unreachable_bootstrap_servers_fail_within_bounded_time(tmp_path):
    cfg = load_config(None, ["capture.backend=kafka", "kafka.bootstrap_servers=127.0.0.1:1",
                             f"data_dir={tmp_path}", "kafka.sasl_password=hunter2"], env={})
    t0 = time.monotonic()
    with pytest.raises(LogUnavailableError, match="kafka.bootstrap_servers = '127.0.0.1:1'") as ei:
        KafkaCaptureLog.open(cfg)
    assert time.monotonic() - t0 < 15
    assert "hunter2" not in str(ei.value)
    # the data_dir's writer lock is released
    with open(cfg.capture_dir / "writer.lock", "rb+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_client_conf_masks_the_password():
    cfg = load_config(None, ["kafka.security_protocol=sasl_ssl", "kafka.sasl_username=u",
                             "kafka.sasl_password=hunter2"], env={})
    conf = client_conf(cfg, "producer")
    assert conf["sasl.password"] == "hunter2" and conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["max.in.flight.requests.per.connection"] <= 5
    assert "hunter2" not in repr(printable(conf))


def test_LG_capture_kafka_offset_another_producer_fails_the_log_and_later_appends(kafka, tmp_path):
    from confluent_kafka import Producer

    cfg = _config(kafka, tmp_path)
    log = KafkaCaptureLog.open(cfg)
    try:
        ack = log.append("edge:1", b"k", b"v1")
        ack.wait(20)
        p = ack.partition
        other = Producer(client_conf(cfg, "admin", logger=False))
        other.produce(cfg.kafka_topic, value=b"intruder", partition=p)
        assert other.flush(20) == 0
        bad = log.append("edge:1", b"k", b"v2")
        assert bad.offset == 1  # predicted; Kafka puts it at 2
        with pytest.raises(CaptureWriteError, match="LG-capture-kafka-offset") as ei:
            bad.wait(20)
        assert "another producer" in str(ei.value) and "nothing depending on them may be acknowledged" in str(ei.value)
        assert not bad.durable() and log.failed is not None
        with pytest.raises(CaptureWriteError, match="LG-capture-kafka-offset"):
            log.append("edge:2", b"k", b"v3")
        with pytest.raises(CaptureWriteError):
            log.flush(5)
        assert log.durable_offsets()[p] == 1
    finally:
        log.close()


def test_acks_share_one_future_per_group_and_each_resolves_only_once_its_record_is_in_kafka(kafka, tmp_path):
    """Records appended between two turns of the poller share one future (one
    hop to the edge's loop per group, as a local group commit); every ack
    resolves, and none before its own record is confirmed."""
    cfg = _config(kafka, tmp_path)
    with KafkaCaptureLog.open(cfg) as log:
        log.append("edge:warm", b"k", b"w").wait(20)
        acks = [log.append(f"edge:{i % 7}", b"k", b"v%d" % i) for i in range(2000)]  # faster than Kafka answers
        assert len({id(a.future) for a in acks}) < len(acks)
        for a in acks:
            a.wait(30)
            assert log.durable_offsets()[a.partition] > a.offset  # resolved only once its record is in
        assert [a.durable() for a in acks] == [True] * len(acks)
        ends = log.durable_offsets()
    reader = open_reader(cfg)
    try:
        seqs = sorted(r.seq for p in range(PARTS) for r in reader.records(p, 0, ends[p]))
    finally:
        reader.close()
    assert seqs == list(range(2001))


def test_back_pressure_waits_instead_of_dropping(kafka, tmp_path):
    # linger 500 ms: the first records stay pending long enough for the checks below
    cfg = _config(kafka, tmp_path, "capture.max_pending_bytes=20000", "kafka.linger_ms=500")
    with KafkaCaptureLog.open(cfg) as log:
        value = b"z" * 3000
        acks = [log.append("c", b"k", value) for _ in range(6)]
        assert not log.has_room(3000)  # 6 records of > 3000 bytes wait for Kafka
        with pytest.raises(BackPressureTimeout):
            log.append("c", b"k", value, timeout=0)
        acks += [log.append("c", b"k", value, timeout=20) for _ in range(29)]  # they wait for room
        assert log.stats["deliveries"] >= 35 - 6  # at most 6 records fit max_pending_bytes
        assert log.wait_for_room(5000, timeout=20)
        for a in acks:
            a.wait(20)
        assert [a.offset for a in acks] == list(range(35)) and log.failed is None
        assert log.has_room(5000)


def test_a_full_librdkafka_queue_waits_instead_of_dropping(kafka, tmp_path):
    cfg = _config(kafka, tmp_path, "kafka.linger_ms=20")
    with KafkaCaptureLog.open(cfg, producer_conf={"queue.buffering.max.messages": 5}) as log:
        acks = [log.append("c", b"k", b"r%d" % i) for i in range(60)]
        for a in acks:
            a.wait(20)
        assert log.stats["queue_full"] > 0
        assert [a.offset for a in acks] == list(range(60))
    with KafkaLogReader(cfg) as reader:
        p = acks[0].partition
        assert [r.value for r in reader.records(p, 0, 60)] == [b"r%d" % i for i in range(60)]
