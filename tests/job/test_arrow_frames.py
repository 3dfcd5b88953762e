"""Frame rows built without Spark (``bridge.rows.arrow_frames``, the live
forwarder's) equal the job's (``bridge.job.pipeline.frame_rows``: Spark
expressions plus the pandas UDF) on the same capture log: every column,
every kind of record the edge writes."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from bridge.capture import CaptureLog, LogReader
from bridge.config import load_config
from bridge.rows.arrow_frames import frame_row_schema, frame_rows_arrow
from bridge.job.pipeline import frame_rows
from bridge.mqtt import Properties
from tests.job.frames import append_publish, append_pubrel, append_raw, headers


def _fill(cfg) -> None:
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    props = Properties(payload_format_indicator=1, message_expiry_interval=30, content_type="text/plain",
                       response_topic="r/1", correlation_data=b"\x01", user_properties=[("k", "v")])
    acks = [
        append_publish(log, "c1", "a/1", b"one", qos=1, packet_id=1, props=props),
        append_publish(log, "c2", "b/2", b"two", qos=0, proto=4, username="u"),
        append_publish(log, "c1", "a/3", b"three", qos=2, packet_id=3, retain=True),
        append_pubrel(log, "c1", 3, "a/3"),
        append_publish(log, "c1", "a/3", b"three", qos=2, packet_id=3, dup="1"),
        append_publish(log, "c2", "refused", b"x", qos=1, packet_id=4, reject="MQTT-3.3.2-2",
                       reject_code="144", reject_error="bad topic"),
        append_publish(log, "c2", "", b"aliased", qos=1, packet_id=6, alias_topic="t/alias"),
        append_publish(log, "c4", "tap/t", b"from a broker", qos=0, origin="tap"),
        append_publish(log, "c4", "w/t", b"will", qos=0, origin="will"),
        append_raw(log, "c3", b"\x30\x7f\x00"),  # not a valid frame
        append_publish(log, "c3", "c/4", b"", qos=1, packet_id=5, proto=3),
        # a run of a subscriber's PUBACKs: no frame row
        log.append("c6", b"c6", b"\x40\x02\x00\x01", headers("c6", ack_refs="0:1")),
        log.append("c7", b"c7", b"\x30\x05\x00\x01x", []),  # no headers at all
    ]
    for a in acks:
        a.wait(10)
    log.close()


def test_arrow_frame_rows_equal_the_jobs_frame_rows(spark, tmp_path):
    from bridge.spark.source import register

    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=3"], env={})
    _fill(cfg)
    register(spark)
    theirs = frame_rows(spark.read.format("lakegate").load(str(cfg.capture_dir))).toArrow()
    reader = LogReader(cfg.capture_dir)
    ours = frame_rows_arrow(b for p, end in enumerate(reader.durable_offsets())
                            for b in reader.arrow_batches(p, 0, end))
    assert ours.schema == frame_row_schema()
    key = [("partition", "ascending"), ("offset", "ascending")]
    theirs = theirs.sort_by(key).to_pylist()
    mine = ours.sort_by(key).to_pylist()
    assert len(mine) == 12  # 13 records, the PUBACK run left out
    for a, b in zip(mine, theirs):
        for col in a:
            x, y = a[col], b[col]
            if isinstance(x, dt.datetime) and isinstance(y, dt.datetime):  # Spark's are naive UTC
                x, y = x.replace(tzinfo=None), y.replace(tzinfo=None)
            assert x == y, (col, a["partition"], a["offset"], x, y)
    assert mine and {r["origin"] for r in mine} == {"client", "tap", "will"}


def test_arrow_frame_rows_of_nothing_is_an_empty_table_of_the_schema():
    assert frame_rows_arrow([]) == frame_row_schema().empty_table()
    empty = pa.RecordBatch.from_pylist([], schema=__import__("bridge.capture.reader", fromlist=["x"])
                                       .capture_arrow_schema())
    assert frame_rows_arrow([empty]).num_rows == 0


def test_a_header_given_twice_reads_as_its_first_value_as_sparks_array_position_does():
    from bridge.capture.reader import capture_arrow_schema
    from bridge.mqtt import Publish, encode

    frame = encode(Publish(qos=0, topic="t", payload=b"x"), 4)
    rows = [{"key": b"c", "value": frame, "topic": "s", "partition": 0, "offset": i, "timestamp": None,
             "timestampType": 1, "headers": h}
            for i, h in enumerate([
                [{"key": "proto", "value": b"4"}, {"key": "conn_id", "value": b"first"},
                 {"key": "conn_id", "value": b"second"}],
                [],
                [{"key": "proto", "value": b"4"}, {"key": "reject", "value": b"R"}, {"key": "reject", "value": b"S"}],
            ])]
    out = frame_rows_arrow([pa.RecordBatch.from_pylist(rows, schema=capture_arrow_schema())]).to_pylist()
    assert [r["conn_id"] for r in out] == ["first", None, None]
    assert [r["edge_rule"] for r in out] == [None, None, "R"]
    assert [r["protocol_level"] for r in out] == [4, None, 4]
    assert [r["origin"] for r in out] == ["client"] * 3
