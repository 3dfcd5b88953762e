"""The foreachBatch sink: forwarding from Spark executors to the real RabbitMQ."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from bridge.amqp.forwarded import ForwardedOffsets
from bridge.amqp.mapping import ID_PROPERTY
from bridge.amqp.sink import forward_batch
from bridge.config import load_config
from schemas.ddl import field_names
from schemas.spark import to_spark
from schemas.forward import FORWARD_DDL
from tests.amqp.rows import row

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def frame(rows):
    names = field_names(FORWARD_DDL)
    return [tuple(r[n] for n in names) for r in rows]


def config(rabbitmq, tmp_path, *extra):
    return load_config(None, [f"amqp.url={rabbitmq}", f"data_dir={tmp_path}", "capture.partitions=2",
                              "amqp.max_retries=1", "amqp.retry_backoff_s=0.05", *extra], env={})


def test_forward_batch_from_executors_in_capture_order(spark, consumer, rabbitmq, tmp_path):
    topic = consumer.topic("sink")
    now = time.time()
    rows = []
    for p in (0, 1):
        for off in range(100, 160):
            rows.append(row(topic, off, partition=p, qos=1, packet_id=off, payload=b"%d/%d" % (p, off),
                            receive_time=dt.datetime.fromtimestamp(now, dt.timezone.utc)))
    rows.append(row(topic, 160, partition=0, qos=0, payload=b"q0"))
    rows.append(row(topic, 161, partition=1, qos=2, packet_id=9))
    rows.append(row(topic, 162, partition=1, kind="pubrel", packet_id=9))
    rows.append(row(topic, 170, partition=0, qos=1, packet_id=1, message_expiry_interval=1,
                    receive_time=dt.datetime.fromtimestamp(now - 5, dt.timezone.utc)))
    df = spark.createDataFrame(frame(reversed(rows)), schema=to_spark(FORWARD_DDL))  # shuffled on purpose

    total = forward_batch(df, 1, config(rabbitmq, tmp_path))

    assert (total.rows, total.accepted, total.qos0, total.expired, total.unroutable) == (124, 122, 1, 1, 0)
    msgs = consumer.wait(topic, 123)
    for p in (0, 1):
        offsets = [int(m.properties[ID_PROPERTY].rsplit("/", 1)[1]) for m in msgs
                   if m.properties[ID_PROPERTY].startswith(f"mqtt-frames/{p}/") and (m.annotations or {}).get("x-qos") == 1]
        assert offsets == sorted(offsets) and len(offsets) == 60  # capture order per partition
    fo = ForwardedOffsets(tmp_path, "mqtt-frames")
    assert (fo.get(0), fo.get(1)) == (170, 162)


def test_forwarding_off_when_url_is_empty(spark, tmp_path):
    df = spark.createDataFrame(frame([row("a", 0)]), schema=to_spark(FORWARD_DDL))
    cfg = load_config(None, ["amqp.url=", f"data_dir={tmp_path}"], env={})
    assert forward_batch(df, 2, cfg).rows == 0
    assert not (tmp_path / "forwarded").exists()


def test_refused_address_fails_the_batch_with_the_address(spark, rabbitmq, tmp_path):
    df = spark.createDataFrame(frame([row("dev/1", 0, qos=1, packet_id=1)]), schema=to_spark(FORWARD_DDL))
    cfg = config(rabbitmq, tmp_path, "amqp.address_template=/exchange/lakegate-sink-missing/{routing_key}")
    with pytest.raises(Exception) as err:
        forward_batch(df, 3, cfg)
    assert ("ForwardError: AMQP peer refused the qos01 link to address "
            "'/exchange/lakegate-sink-missing/dev.1': amqp:not-found") in str(err.value)
    assert ForwardedOffsets(tmp_path).get(0) == -1  # nothing recorded for a failed task


def test_aligned_batch_from_the_source_is_forwarded_without_a_shuffle_in_capture_order(
        spark, consumer, rabbitmq, tmp_path):
    """The job's path: capture log -> source -> parse -> select_forward, whose
    Spark partitions are whole capture partitions, forwarded as they are."""
    from bridge.job.batch import partitions_aligned, select_forward
    from bridge.job.pipeline import frame_rows
    from bridge.spark.source import register
    from tests.capture.util import open_log
    from tests.job.frames import append_publish

    topic = consumer.topic("aligned")
    with open_log(tmp_path / "capture", partitions=2) as log:
        for i in range(240):
            append_publish(log, f"edge:{i % 6}", topic, b"%d" % i, qos=1, packet_id=1 + i)
    register(spark)
    rows = frame_rows(spark.read.format("lakegate").load(str(tmp_path / "capture")))
    table = rows.toArrow()
    assert partitions_aligned(rows, table)
    sc = spark.sparkContext
    sc.setJobGroup("lg-aligned", "aligned forwarding")
    try:
        total = forward_batch(select_forward(rows), 4, config(rabbitmq, tmp_path), aligned=True)
    finally:
        sc.setJobGroup("", "")
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("lg-aligned")]
    assert [len(j.stageIds) for j in jobs] == [1]  # one stage: no shuffle before forwarding
    assert (total.rows, total.accepted) == (240, 240)
    msgs = consumer.wait(topic, 240)
    for p in (0, 1):
        offsets = [int(m.properties[ID_PROPERTY].rsplit("/", 1)[1]) for m in msgs
                   if m.properties[ID_PROPERTY].startswith(f"mqtt-frames/{p}/")]
        assert offsets == sorted(offsets) and offsets  # capture order per partition


def test_small_batch_forwarded_from_the_driver_no_spark_job_capture_order_marks(
        spark, consumer, rabbitmq, tmp_path):
    """A batch with at most job.forward_on_driver_max_rows rows to forward:
    its rows are made from the frame rows already on the driver and sent
    from there, in capture order per partition, with the forwarded marks;
    no Spark job runs for it. Above the limit (and with the limit 0) the
    executors forward."""
    from bridge.job.batch import _forwardable, select_forward
    from bridge.job.pipeline import frame_rows
    from bridge.spark.source import register
    from tests.capture.util import open_log
    from tests.job.frames import append_publish

    topic = consumer.topic("driver")
    with open_log(tmp_path / "capture", partitions=2) as log:
        for i in range(120):
            append_publish(log, f"edge:{i % 6}", topic, b"%d" % i, qos=1, packet_id=1 + i)
    register(spark)
    rows = frame_rows(spark.read.format("lakegate").load(str(tmp_path / "capture"))).persist()
    try:
        table = rows.toArrow()
        n = _forwardable(table)
        sc = spark.sparkContext
        sc.setJobGroup("lg-driver", "driver forwarding")
        try:
            total = forward_batch(select_forward(rows), 5, config(rabbitmq, tmp_path), rows=n, table=table)
        finally:
            sc.setJobGroup("", "")
        assert sc.statusTracker().getJobIdsForGroup("lg-driver") == []  # no Spark job
        assert (total.rows, total.accepted) == (120, 120)
        msgs = consumer.wait(topic, 120)
        for p in (0, 1):
            offsets = [int(m.properties[ID_PROPERTY].rsplit("/", 1)[1]) for m in msgs
                       if m.properties[ID_PROPERTY].startswith(f"mqtt-frames/{p}/")]
            assert offsets == sorted(offsets) and offsets  # capture order per partition
        fo = ForwardedOffsets(tmp_path, "mqtt-frames")
        assert {fo.get(0), fo.get(1)} == {int(max(o for pp, o in zip(table["partition"].to_pylist(),
                                                                      table["offset"].to_pylist()) if pp == p))
                                          for p in (0, 1)}
        sc.setJobGroup("lg-executors", "executor forwarding")
        try:
            again = forward_batch(select_forward(rows), 6,
                                  config(rabbitmq, tmp_path, "job.forward_on_driver_max_rows=0"),
                                  rows=n, table=table)
        finally:
            sc.setJobGroup("", "")
        assert sc.statusTracker().getJobIdsForGroup("lg-executors")  # limit 0: the executors
        assert again.accepted == 120
        consumer.wait(topic, 240)
    finally:
        rows.unpersist()


def test_cached_forwarders_are_closed_at_exit_before_protons_cleanup(rabbitmq, tmp_path):
    # A forwarder thread still running when proton cleans up at exit aborts the
    # interpreter. The child registers its check first, so it runs last (atexit
    # is last in, first out) and sees what the sink's own handler left.
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import atexit
from bridge.amqp.sink import forwarder_for
from bridge.config import load_config
from tests.amqp.rows import row

fwd = None
atexit.register(lambda: print("thread alive at exit:", fwd._thread.is_alive()))
cfg = load_config(None, ["amqp.url={rabbitmq}"], env={{}}).amqp
fwd = forwarder_for(cfg)
fwd.forward([row("lakegate/test/exit", 0, payload=b"x")])
print("thread alive after forwarding:", fwd._thread.is_alive())
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["thread alive after forwarding: True", "thread alive at exit: False"]


def test_lg_amqp_unforwardable_rows_come_back_to_the_driver_and_the_batch_goes_on(spark, consumer, rabbitmq,
                                                                                   tmp_path):
    topic = consumer.topic("sink-unforwardable")
    rows = [row(topic, 10, partition=0, qos=1, packet_id=1, payload=b"a"),
            row(topic, 11, partition=0, qos=1, packet_id=-1, payload=b"b"),  # no message-id can hold it
            row(topic, 12, partition=1, qos=1, packet_id=-2, payload=b"c"),
            row(topic, 13, partition=1, qos=1, packet_id=2, payload=b"d")]
    df = spark.createDataFrame(frame(rows), schema=to_spark(FORWARD_DDL))

    total = forward_batch(df, 1, config(rabbitmq, tmp_path))  # raised (and so for ever) before

    assert (total.rows, total.accepted, total.unforwardable) == (4, 2, 2)
    assert sorted((f.partition, f.offset, f.rule) for f in total.failures) == [
        (0, 11, "LG-amqp-unforwardable"), (1, 12, "LG-amqp-unforwardable")]
    assert all(f.error == "[LG-amqp-unforwardable] AssertionError: initializing ulong with negative value"
               for f in total.failures)
    assert sorted(bytes(m.body) for m in consumer.wait(topic, 2)) == [b"a", b"d"]
    fo = ForwardedOffsets(tmp_path, "mqtt-frames")
    assert (fo.get(0), fo.get(1)) == (11, 13)
