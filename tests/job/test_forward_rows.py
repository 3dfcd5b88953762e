"""The driver path's forward rows (``bridge.rows.forward_rows``) equal the
executor path's Spark projection (``bridge.job.batch.select_forward``) on
the same batch: every kind of frame row, both filters, every column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.job.batch import _forwardable, select_forward
from bridge.rows.forward_rows import forward_rows_of
from bridge.job.pipeline import frame_rows
from bridge.mqtt import Properties
from tests.job.frames import append_publish, append_pubrel, append_raw


def test_driver_forward_rows_equal_select_forward_on_the_same_batch(spark, tmp_path):
    from bridge.spark.source import register

    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    props = Properties(payload_format_indicator=1, message_expiry_interval=30, content_type="text/plain",
                       response_topic="r/1", correlation_data=b"\x01", user_properties=[("k", "v")])
    acks = [
        append_publish(log, "c1", "a/1", b"one", qos=1, packet_id=1, props=props),
        append_publish(log, "c2", "b/2", b"two", qos=0, proto=4),
        append_publish(log, "c1", "a/3", b"three", qos=2, packet_id=3, retain=True),
        append_pubrel(log, "c1", 3, "a/3"),
        append_publish(log, "c1", "a/3", b"three", qos=2, packet_id=3, dup="1"),  # edge-marked duplicate
        append_publish(log, "c2", "refused", b"x", qos=1, packet_id=4, reject="MQTT-3.3.2-2"),
        append_pubrel(log, "c2", 9, ""),
        append_raw(log, "c3", b"\x30\x7f\x00"),  # not a valid frame
        append_publish(log, "c3", "c/4", b"", qos=1, packet_id=5, proto=3),
    ]
    for a in acks:
        a.wait(10)
    log.close()
    register(spark)
    frames = frame_rows(spark.read.format("lakegate").load(str(cfg.capture_dir))).persist()
    try:
        table = frames.toArrow()
        spark_rows = select_forward(frames).toArrow()
        spark_rows = spark_rows.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
        ours = forward_rows_of(table)
    finally:
        frames.unpersist()
    # 4 PUBLISHes and 2 PUBRELs; not the duplicate, the refused one, the invalid frame
    assert len(spark_rows) == _forwardable(table) == 6, spark_rows
    # receive_time: epoch seconds on the driver path, a datetime from Spark; the same instant
    for r in spark_rows:
        r["receive_time"] = r["receive_time"].timestamp()
    assert all(isinstance(r["receive_time"], float) for r in ours)
    assert ours == spark_rows
    assert [r["kind"] for r in ours].count("pubrel") == 2
    assert forward_rows_of(table.slice(0, 0)) == []
    assert isinstance(table, pa.Table)


@pytest.mark.parametrize("values, typ", [
    ([1, 2, 3], pa.int32()), ([1, None, 3], pa.int64()), ([None, None], pa.int32()),
    ([True, False], pa.bool_()), ([1.5, 2.25], pa.float64()),
    (["a/1", "b", "a/1", "ü"], pa.string()), (["a", None], pa.string()), ([None, None], pa.string()),
    ([b"x", b""], pa.binary()), ([[{"key": "k", "value": "v"}], None], pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))),
])
def test_pylist_gives_what_to_pylist_gives(values, typ):
    from bridge.rows.forward_rows import _pylist

    arr = pa.array(values, typ)
    chunked = pa.chunked_array([arr.slice(0, 1), arr.slice(1)], typ)
    for col in (arr, chunked):
        got = _pylist(col)
        assert got == col.to_pylist()
        assert [type(v) for v in got] == [type(v) for v in col.to_pylist()]
