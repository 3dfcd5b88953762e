"""The job reads the capture log from Kafka with Spark's own Kafka source
(``capture.backend = "kafka"``, bridge/spark/kafka_source.py): the same
records give the same table rows as over the local log, the retained
table's coverage names Kafka offsets, a record that is not a capture record
is quarantined, and the checkpoint's Kafka offsets make a second run read
only what is new."""

from __future__ import annotations

import uuid

import pytest

from bridge.capture import CaptureLog, LogReader
from bridge.config import load_config
from bridge.spark.kafka_source import NOT_A_RECORD, describe, kafka_options, partition_offsets
from bridge.tables.coverage import covered_offsets
from bridge.tables.deltars import DeltaRsEngine
from tests.job.frames import append_publish, append_pubrel, append_raw, headers, run_once

PARTITIONS = 2
MADE: list[str] = []  # every topic this module made, deleted at its end


@pytest.fixture(autouse=True, scope="module")
def _delete_topics():
    yield
    from tests.conftest import KAFKA, delete_kafka_topics

    delete_kafka_topics(f"{KAFKA[0]}:{KAFKA[1]}", MADE)


# ------------------------------------------------------------------ helpers
def _topic(kafka: str, partitions: int = PARTITIONS) -> str:
    """A fresh topic of its own for one test."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"lakegate-test-{uuid.uuid4().hex[:12]}"
    MADE.append(name)
    admin = AdminClient({"bootstrap.servers": kafka})
    for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        fut.result(30)
    return name


def _producer(kafka: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": kafka, "enable.idempotence": True, "linger.ms": 1})


def _local_records(cfg) -> list[dict]:
    """Every record of a local capture log, as Spark's rows (dicts), in (partition, offset) order."""
    reader = LogReader(cfg.capture_dir)
    out = []
    for p, end in enumerate(reader.durable_offsets()):
        for batch in reader.arrow_batches(p, 0, end):
            out += batch.to_pylist()
    return out


def _produce(kafka: str, topic: str, records: list[dict]) -> None:
    """The records into ``topic``, each to its own partition, with its key,
    value, headers (``seq`` included) and receive time (ms), as the edge's
    Kafka writer produces them."""
    producer = _producer(kafka)
    for r in records:
        ts_ms = int(r["timestamp"].timestamp() * 1000)
        producer.produce(topic, key=r["key"], value=r["value"], partition=r["partition"], timestamp=ts_ms,
                         headers=[(h["key"], h["value"]) for h in r["headers"]])
    assert producer.flush(30) == 0


def _write_some(cfg, tag: str) -> None:
    """A few connections' PUBLISHes (retained ones among them), a QoS 2 PUBREL, and a bad frame."""
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    try:
        for c in range(4):
            conn = f"{tag}-c{c}"
            append_raw(log, conn, b"\x10\x00")  # stands in for the CONNECT: not parsed as one, quarantined
            append_publish(log, conn, f"t/{tag}/{c}", f"hello {c}".encode(), qos=1, packet_id=c + 1)
            append_publish(log, conn, f"r/{tag}/{c}", f"kept {c}".encode(), qos=1, retain=True, packet_id=c + 10)
            append_publish(log, conn, f"q2/{tag}/{c}", b"two", qos=2, packet_id=c + 20, proto=4)
            append_pubrel(log, conn, c + 20, f"q2/{tag}/{c}")
    finally:
        log.close()


def _config(tmp_path, name: str, topic: str, *extra: str, kafka: str | None = None):
    over = [f"data_dir={tmp_path / name}", f"capture.partitions={PARTITIONS}", f"capture.stream={topic}", "amqp.url="]
    if kafka is not None:
        over += ["capture.backend=kafka", f"kafka.bootstrap_servers={kafka}"]
    return load_config(None, over + list(extra), env={})


def _rows(cfg, table: str) -> list[dict]:
    """A table's rows in capture order, timestamps to the millisecond (Kafka's precision)."""
    import datetime as dt

    rows = DeltaRsEngine(cfg.tables_dir).arrow(table).to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, dt.datetime):
                r[k] = v.replace(microsecond=v.microsecond // 1000 * 1000)
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


# ------------------------------------------------------------------ options
def test_kafka_options_map_the_kafka_section_and_never_show_the_password(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = load_config(None, ["capture.backend=kafka", "kafka.bootstrap_servers=b1:9093,b2:9093",
                             "kafka.topic=frames", "kafka.security_protocol=sasl_ssl",
                             "kafka.sasl_mechanism=SCRAM-SHA-512", "kafka.sasl_username=edge",
                             'kafka.sasl_password=s3"cret', f"kafka.ssl_ca_location={ca}"], env={})
    opts = kafka_options(cfg)
    assert opts["kafka.bootstrap.servers"] == "b1:9093,b2:9093"
    assert opts["subscribe"] == "frames"
    assert (opts["includeHeaders"], opts["startingOffsets"], opts["failOnDataLoss"]) == ("true", "earliest", "true")
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="edge" password="s3\\"cret";')
    assert (opts["kafka.ssl.truststore.type"], opts["kafka.ssl.truststore.location"]) == ("PEM", str(ca))
    shown = describe(opts)
    assert "s3" not in repr(shown) and shown["kafka.sasl.jaas.config"] == "***"

    plain = kafka_options(load_config(None, ["kafka.security_protocol=sasl_plaintext", "kafka.sasl_username=u",
                                             "kafka.sasl_password=p"], env={}))
    assert plain["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule")
    assert "kafka.ssl.truststore.location" not in plain
    default = kafka_options(load_config(None, [], env={}))
    assert default["kafka.security.protocol"] == "PLAINTEXT" and "kafka.sasl.jaas.config" not in default
    assert default["subscribe"] == "mqtt-frames"  # capture.stream


def test_partition_offsets_flatten_the_kafka_sources_offsets():
    assert partition_offsets({"frames": {"1": 7, "0": 3}}) == {"0": 3, "1": 7}
    assert partition_offsets({"0": 3, "1": 7}) == {"0": 3, "1": 7}  # the lakegate source's, unchanged


# ------------------------------------------------------------------ with Spark and Kafka
@pytest.mark.spark
@pytest.mark.broker
def test_the_kafka_stream_has_the_lakegate_sources_schema(spark, kafka, tmp_path):
    from bridge.spark.kafka_source import read_capture_stream
    from bridge.spark.source import register
    from schemas.capture import CAPTURE_RECORD_DDL

    topic = _topic(kafka)
    local = _config(tmp_path, "local", topic)
    CaptureLog.open(local.capture_dir, local.capture).close()
    register(spark)
    lakegate = spark.readStream.format("lakegate").schema(CAPTURE_RECORD_DDL).load(str(local.capture_dir))
    on_kafka = read_capture_stream(spark, _config(tmp_path, "kafka", topic, kafka=kafka))
    assert on_kafka.isStreaming
    assert on_kafka.schema == lakegate.schema  # names, order, types, nullability


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("parse_on", ["driver", "executors"])
def test_the_job_over_kafka_writes_the_rows_it_writes_over_the_local_log(spark, kafka, tmp_path, parse_on):
    from bridge.job.batch import batch_records
    from bridge.job.pipeline import checkpoint_path

    topic = _topic(kafka)
    placement = [] if parse_on == "driver" else ["job.parse_on_driver_max_rows=0"]
    local = _config(tmp_path, "local", topic, *placement)
    _write_some(local, "a")
    records = _local_records(local)
    _produce(kafka, topic, records)
    on_kafka = _config(tmp_path, "kafka", topic, *placement, kafka=kafka)

    run_once(spark, local)
    run_once(spark, on_kafka)

    for table in ("messages", "retained", "quarantine"):
        want, got = _rows(local, table), _rows(on_kafka, table)
        assert got == want, table
    messages = _rows(on_kafka, "messages")
    assert len(messages) == 12 and {r["stream"] for r in messages} == {topic}
    # the batch's size is known from the Kafka offsets in the offset log: the driver may parse it
    assert batch_records(checkpoint_path(on_kafka), 0) == len(records)
    assert sorted(r["topic"] for r in _rows(on_kafka, "retained")) == [f"r/a/{c}" for c in range(4)]


@pytest.mark.spark
@pytest.mark.broker
def test_retained_coverage_records_the_kafka_offsets(spark, kafka, tmp_path):
    topic = _topic(kafka)
    local = _config(tmp_path, "local", topic)
    _write_some(local, "cov")
    records = _local_records(local)
    _produce(kafka, topic, records)
    cfg = _config(tmp_path, "kafka", topic, kafka=kafka)

    run_once(spark, cfg)

    ends = {}
    for r in records:
        ends[r["partition"]] = max(ends.get(r["partition"], 0), r["offset"] + 1)
    history = DeltaRsEngine(cfg.tables_dir).history("retained")
    assert covered_offsets(history, topic) == ends  # the topic's next offset per partition
    assert covered_offsets(history, "mqtt-frames") is None


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize("parse_on", ["driver", "executors"])
def test_lg_capture_not_a_record_a_foreign_record_is_quarantined_and_the_job_goes_on(spark, kafka, tmp_path,
                                                                                   parse_on):
    from bridge.mqtt import Publish, encode

    topic = _topic(kafka, partitions=1)
    placement = [] if parse_on == "driver" else ["job.parse_on_driver_max_rows=0"]
    cfg = _config(tmp_path, "kafka", topic, *placement, kafka=kafka)
    frame = encode(Publish(qos=0, retain=False, topic="ok/t", packet_id=None, payload=b"fine"), 4)
    ok = headers("c1", proto=4)
    producer = _producer(kafka)
    sends = [
        (b"c1", frame, ok + [("seq", b"1")]),                             # 0: a capture record
        (None, b"not json, not mqtt", None),                              # 1: no headers at all
        (b"c1", frame, [("conn_id", b"c1"), ("proto", b"4")]),            # 2: no seq
        (b"c1", frame, ok + [("seq", b"abc")]),                           # 3: seq not a number
        (b"c1", frame, [("conn_id", b"c1"), ("proto", b"x4"), ("seq", b"4")]),  # 4: proto not a number
        (b"c1", frame, [("proto", b"4"), ("seq", b"5")]),                 # 5: no conn_id
        (b"c1", b"\xf0\x00garbage", ok + [("seq", b"6")]),                # 6: a capture record, garbage frame
        (b"c1", None, ok + [("seq", b"7")]),                              # 7: a tombstone
        (b"c1", frame, ok + [("seq", b"8")]),                             # 8: a capture record
    ]
    for key, value, hdrs in sends:
        producer.produce(topic, key=key, value=value, headers=hdrs, partition=0)
    assert producer.flush(30) == 0

    run_once(spark, cfg)

    engine = DeltaRsEngine(cfg.tables_dir)
    assert [r["offset"] for r in _rows(cfg, "messages")] == [0, 8]
    q = {r["offset"]: r for r in _rows(cfg, "quarantine")}
    assert sorted(q) == [1, 2, 3, 4, 5, 6, 7]
    for offset in (1, 2, 3, 4, 5):
        assert q[offset]["rule"] == NOT_A_RECORD, q[offset]
        assert q[offset]["error"].startswith("not a capture record: ")
    assert "no seq header" in q[2]["error"] and "no conn_id header" in q[1]["error"]
    assert "header seq is not a decimal number" in q[3]["error"] and q[3]["seq"] is None
    assert "header proto is not a decimal number" in q[4]["error"] and q[4]["seq"] == 4
    assert q[5]["parser_rule"] is None and q[5]["seq"] == 5  # the frame itself is a fine PUBLISH
    assert q[6]["rule"] not in (None, NOT_A_RECORD) and q[7]["rule"] == "LG-truncated"
    assert covered_offsets(engine.history("retained"), topic) == {0: 9}


@pytest.mark.spark
@pytest.mark.broker
def test_the_checkpoint_holds_kafka_offsets_and_a_second_run_reads_only_new_records(spark, kafka, tmp_path):
    from bridge.job.batch import offset_log_entry
    from bridge.job.pipeline import checkpoint_path

    topic = _topic(kafka)
    local = _config(tmp_path, "local", topic)
    _write_some(local, "one")
    first = _local_records(local)
    _produce(kafka, topic, first)
    cfg = _config(tmp_path, "kafka", topic, kafka=kafka)

    run_once(spark, cfg)
    assert len(_rows(cfg, "messages")) == 12

    _write_some(local, "two")
    everything = _local_records(local)
    seen = {(r["partition"], r["offset"]) for r in first}
    new = [r for r in everything if (r["partition"], r["offset"]) not in seen]
    assert len(new) == len(first)
    _produce(kafka, topic, new)

    run_once(spark, cfg)

    messages = _rows(cfg, "messages")
    coords = [(r["partition"], r["offset"]) for r in messages]
    assert len(coords) == len(set(coords)) == 24  # each record once
    assert sorted(r["topic"] for r in messages if r["retain"]) == sorted(
        [f"r/one/{c}" for c in range(4)] + [f"r/two/{c}" for c in range(4)])
    # Spark's offset log: the Kafka source's {"<topic>": {"<partition>": n}} per batch
    cp = checkpoint_path(cfg)
    batches = sorted(int(p.name) for p in (cp / "offsets").iterdir() if p.name.isdigit())
    raw = (cp / "offsets" / str(batches[-1])).read_text().splitlines()[2]
    assert topic in raw
    ends = {}
    for r in everything:
        ends[str(r["partition"])] = max(ends.get(str(r["partition"]), 0), r["offset"] + 1)
    assert offset_log_entry(cp, batches[-1]) == ends
    assert covered_offsets(DeltaRsEngine(cfg.tables_dir).history("retained"), topic) == {
        int(p): o for p, o in ends.items()}
