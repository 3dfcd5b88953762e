"""Issue 42's "done when", end to end on the real Kafka of scripts/services:
``lakegate edge`` with ``capture.backend = "kafka"`` takes QoS 1 PUBLISHes
from paho; Kafka's own console consumer shows the records (key the client
id, value the raw frame, the edge's headers with ``seq``); and
``spark-submit jobs/process_packets.py --once`` reads them with Spark's
Kafka source into one ``messages`` row each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from bridge.tables.deltars import DeltaRsEngine
from tests.conftest import child_env

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / ".jvm" / "lib" / "kafka-server"
COUNT = 20


def _publish(port: int) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="done-pub", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [c.publish(f"done/{i % 4}", b"reading %d" % i, qos=1) for i in range(COUNT)]
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        c.disconnect()
        c.loop_stop()


def test_edge_on_kafka_console_consumer_and_spark_submit_read_the_records(kafka, kafka_topic, tmp_path):
    topic = kafka_topic("lg-done")
    sets = [f"data_dir={tmp_path / 'data'}", "capture.backend=kafka", f"kafka.bootstrap_servers={kafka}",
            f"kafka.topic={topic}", "kafka.create_topic=true", "capture.partitions=2", "amqp.url=",
            "spark.master=local[2]"]
    args = [a for s in sets for a in ("--set", s)]
    edge = subprocess.Popen([sys.executable, "-m", "bridge", "edge", "--port", "0", *args], cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r"mqtt://127\.0\.0\.1:(\d+)", edge.stdout.readline())
        assert m, edge.stderr.read()[-3000:] if edge.poll() is not None else "no listening line"
        _publish(int(m.group(1)))
    finally:
        edge.terminate()
        assert edge.wait(60) == 0

    # Kafka's own console consumer: the CONNECT, the PUBLISHes and the DISCONNECT as the edge captured
    # them, key the client id, the edge's headers then seq
    out = subprocess.run(
        ["java", "-cp", f"{LIBS}/*", "org.apache.kafka.tools.consumer.ConsoleConsumer",
         "--bootstrap-server", kafka, "--topic", topic, "--from-beginning", "--timeout-ms", "15000",
         "--formatter-property", "print.key=true", "--formatter-property", "print.headers=true"],
        capture_output=True, timeout=120)
    out.stdout, out.stderr = (b.decode("utf-8", "replace") for b in (out.stdout, out.stderr))  # raw frames
    # (a frame's bytes may hold a newline: records are counted, not lines)
    assert f"Processed a total of {COUNT + 2} messages" in out.stderr, out.stderr[-2000:]
    assert out.stdout.count("\tdone-pub\t") == COUNT + 2, out.stdout[-3000:]
    assert len(re.findall(r"conn_id:[^,\t]+,proto:4,remote:127\.0\.0\.1:\d+,origin:client,seq:\d+\tdone-pub\t",
                          out.stdout)) == COUNT + 2, out.stdout[-3000:]
    assert sorted(int(n) for n in re.findall(r"reading (\d+)", out.stdout)) == list(range(COUNT))

    # spark-submit with Spark's Kafka source: one messages row per PUBLISH
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**child_env(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    job = subprocess.run([str(submit), "--properties-file", "conf/spark-defaults.conf", "--master", "local[2]",
                          "jobs/process_packets.py", "--once", *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    said = "\n".join(x for x in (job.stdout + job.stderr).splitlines() if " INFO " not in x)
    assert job.returncode == 0, said[-4000:]
    rows = DeltaRsEngine(tmp_path / "data" / "tables").arrow("messages").to_pylist()
    assert sorted(r["payload"] for r in rows) == sorted(b"reading %d" % i for i in range(COUNT))
    # the stream column is the Kafka topic's name, as Spark's Kafka source gives it
    assert {r["stream"] for r in rows} == {topic} and {r["client_id"] for r in rows} == {"done-pub"}
