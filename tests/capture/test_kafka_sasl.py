"""The capture log on a Kafka that asks for credentials (issue 42: "TLS/SASL
settings passed through"): a one-node Kafka of the module's own
(``scripts/kafka up --sasl USER:PASSWORD``: a SASL_PLAINTEXT listener,
mechanism PLAIN), reached with ``kafka.security_protocol = "sasl_plaintext"``
by both clients lakegate uses -- librdkafka (the edge's log, the readers)
and the Java client (Spark's Kafka source, the job) -- and refused, with
one line naming the rule and never the password, when the password is
wrong [LG-capture-kafka-auth]."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bridge.capture.errors import CaptureError
from bridge.config import load_config
from tests.conftest import child_env, free_port_block

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "lakegate", "s3cret-pw"


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory):
    """(plain bootstrap servers, SASL_PLAINTEXT bootstrap servers) of a one-node Kafka of the module's own."""
    base = free_port_block((0, 100, 200))
    args = ["--nodes", "1", "--port", str(base), "--dir", str(tmp_path_factory.mktemp("kafka-sasl"))]
    script = str(ROOT / "scripts" / "kafka")
    up = subprocess.run([script, "up", *args, "--sasl", f"{USER}:{PASSWORD}"], capture_output=True, text=True,
                        timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        if "not started" in up.stdout:
            pytest.skip(up.stdout.strip())
        yield f"127.0.0.1:{base}", f"127.0.0.1:{base + 200}"
    finally:
        subprocess.run([script, "down", *args], capture_output=True, timeout=120)


def _sets(sasl_servers: str, topic: str, data_dir: Path, password: str = PASSWORD) -> list[str]:
    return [f"data_dir={data_dir}", "capture.backend=kafka", "capture.partitions=2", "amqp.url=",
            f"kafka.bootstrap_servers={sasl_servers}", f"kafka.topic={topic}", "kafka.create_topic=true",
            "kafka.security_protocol=sasl_plaintext", "kafka.sasl_mechanism=PLAIN", f"kafka.sasl_username={USER}",
            f"kafka.sasl_password={password}"]


def test_the_log_and_its_reader_work_over_sasl_plaintext(sasl_kafka, tmp_path):
    from bridge.capture.kafka_log import KafkaCaptureLog
    from bridge.capture.kafka_reader import KafkaLogReader

    cfg = load_config(None, _sets(sasl_kafka[1], f"lg-sasl-{uuid.uuid4().hex[:8]}", tmp_path), env={})
    log = KafkaCaptureLog.open(cfg)
    try:
        acks = [log.append("c1", b"dev", b"frame-%d" % i, [("conn_id", b"c1")]) for i in range(10)]
        log.flush(30)
    finally:
        log.close()
    reader = KafkaLogReader(cfg)
    try:
        p = acks[0].partition
        got = [r.value for r in reader.records(p, 0, reader.durable_offsets()[p])]
    finally:
        reader.close()
    assert got == [b"frame-%d" % i for i in range(10)]


def test_lg_capture_kafka_auth_a_wrong_password_is_one_line_at_once_without_the_password(sasl_kafka, tmp_path):
    from bridge.capture.kafka_log import KafkaCaptureLog

    cfg = load_config(None, _sets(sasl_kafka[1], f"lg-sasl-{uuid.uuid4().hex[:8]}", tmp_path, "not-it"), env={})
    t0 = time.monotonic()
    with pytest.raises(CaptureError) as err:
        KafkaCaptureLog.open(cfg)
    assert time.monotonic() - t0 < 8, "a refusal is said at once, not after the brokers' timeout"
    text = str(err.value)
    assert "LG-capture-kafka-auth" in text and "kafka.sasl_username = 'lakegate'" in text, text
    assert "Authentication failed" in text and "not-it" not in text, text

    # the edge: exits 1 with that line, not 75 (try again later): a restart does not fix credentials
    args = [a for s in _sets(sasl_kafka[1], f"lg-sasl-{uuid.uuid4().hex[:8]}", tmp_path / "e", "not-it")
            for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "bridge", "edge", "--port", "0", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = [x for x in proc.stderr.splitlines() if "LG-capture-kafka-auth" in x]
    assert len(lines) == 1 and "not-it" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.spark
def test_the_job_reads_the_topic_over_sasl_with_sparks_kafka_source(sasl_kafka, spark, tmp_path):
    from bridge.capture.kafka_log import KafkaCaptureLog
    from bridge.tables.deltars import DeltaRsEngine
    from tests.edge.util import publish
    from tests.job.frames import run_once

    cfg = load_config(None, _sets(sasl_kafka[1], f"lg-sasl-{uuid.uuid4().hex[:8]}", tmp_path), env={})
    log = KafkaCaptureLog.open(cfg)
    try:
        hs = [("conn_id", b"c1"), ("proto", b"4"), ("origin", b"client")]
        for i in range(6):
            log.append("c1", b"dev", publish(4, topic=f"sasl/{i}", payload=b"v%d" % i, qos=0), hs)
        log.flush(30)
    finally:
        log.close()
    run_once(spark, cfg)
    rows = DeltaRsEngine(cfg.tables_dir).arrow("messages").to_pylist()
    assert sorted(r["payload"] for r in rows) == [b"v%d" % i for i in range(6)]
    assert {r["stream"] for r in rows} == {cfg.kafka_topic}
