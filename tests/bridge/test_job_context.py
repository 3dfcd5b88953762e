import datetime as dt

import pytest

from schemas.capture import CAPTURE_RECORD_DDL
from schemas.spark import to_spark
from schemas.tables import CONTEXT_DDL

pytestmark = pytest.mark.spark


def test_context_columns_from_capture_headers(spark):
    from bridge.job.context import with_context

    ts = dt.datetime(2026, 11, 22, 10, 0, 0)
    headers = [("conn_id", b"c-7"), ("proto", b"5"), ("remote", b"127.0.0.1:5000"), ("origin", b"will"),
               ("seq", b"42"), ("alias_topic", b"a/b"), ("dup", b"1"), ("reject", b"MQTT-3.3.2-9"),
               ("reject_code", b"148"), ("reject_error", b"[MQTT-3.3.2-9] alias above maximum")]
    rec = (b"dev-1", b"\x30\x00", "mqtt-frames", 3, 99, ts, 1, [{"key": k, "value": v} for k, v in headers])
    df = spark.createDataFrame([rec], to_spark(CAPTURE_RECORD_DDL))
    out = with_context(df)
    assert [(f.name, f.dataType) for f in out.schema] == [(f.name, f.dataType) for f in to_spark(CONTEXT_DDL)]
    r = out.first()
    assert (r.stream, r.partition, r.offset, r.seq) == ("mqtt-frames", 3, 99, 42)
    assert (r.conn_id, r.client_id, r.protocol_level, r.origin, r.remote) == ("c-7", "dev-1", 5, "will", "127.0.0.1:5000")
    assert r.alias_topic == "a/b" and r.duplicate is True and r.username is None
    assert (r.edge_rule, r.edge_code) == ("MQTT-3.3.2-9", 148)
    assert r.frame == b"\x30\x00" and r.receive_date == ts.date()


def test_missing_headers_default(spark):
    from bridge.job.context import with_context

    rec = (b"d", b"\xc0\x00", "s", 0, 0, dt.datetime(2026, 1, 1), 1, [])
    r = with_context(spark.createDataFrame([rec], to_spark(CAPTURE_RECORD_DDL))).first()
    assert r.origin == "client" and r.duplicate is False and r.seq is None and r.edge_rule is None


def test_the_first_of_repeated_headers_wins_and_null_headers_read_null(spark):
    """Kafka allows a key twice: the first is the one (as filter(...)[1] read it)."""
    from bridge.job.context import with_context

    t = dt.datetime(2026, 1, 1)
    recs = [
        (b"d", b"\xc0\x00", "s", 0, 0, t, 1, [{"key": "proto", "value": b"4"}, {"key": "seq", "value": b"7"},
                                                {"key": "proto", "value": b"5"}]),
        (b"d", b"\xc0\x00", "s", 0, 1, t, 1, None),                                # no headers at all
        (b"d", b"\xc0\x00", "s", 0, 2, t, 1, [{"key": "conn_id", "value": None}]),  # a header without value
    ]
    rows = with_context(spark.createDataFrame(recs, to_spark(CAPTURE_RECORD_DDL))).orderBy("offset").collect()
    assert (rows[0].protocol_level, rows[0].seq) == (4, 7)
    assert (rows[1].protocol_level, rows[1].seq, rows[1].origin) == (None, None, "client")
    assert rows[2].conn_id is None and rows[2].seq is None
