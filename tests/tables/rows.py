"""Test helpers: table-shaped Arrow rows from short descriptions, and the two
table engines every table-engine test runs on."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from schemas.ddl import to_arrow
from schemas.tables import FRAME_ROW_DDL, MESSAGES_DDL, PARSED_RENAMES

MESSAGES_SCHEMA = to_arrow(MESSAGES_DDL)
FRAME_ROW_SCHEMA = to_arrow(FRAME_ROW_DDL)
T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.timezone.utc)


def publish(topic: str, payload: bytes = b"x", *, retain: bool = True, seq: int, qos: int = 1,
            partition: int = 0, offset: int | None = None, duplicate: bool = False, origin: str = "client",
            expiry: int | None = None, client_id: str = "dev-1", at: dt.datetime | None = None,
            user_properties=None, content_type=None) -> dict:
    at = at or (T0 + dt.timedelta(seconds=seq))
    return {
        "stream": "mqtt-frames", "partition": partition, "offset": seq if offset is None else offset, "seq": seq,
        "receive_time": at, "receive_date": at.date(), "conn_id": "c1", "client_id": client_id, "username": None,
        "protocol_level": 5, "origin": origin, "duplicate": duplicate, "dup": False, "qos": qos, "retain": retain,
        "topic": topic, "topic_alias": None, "packet_id": 1 if qos else None, "payload": payload,
        "payload_size": len(payload), "payload_format_indicator": None, "message_expiry_interval": expiry,
        "response_topic": None, "correlation_data": None, "user_properties": user_properties or [],
        "subscription_identifiers": [], "content_type": content_type,
    }


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=MESSAGES_SCHEMA)


def frame_rows(records: list[dict]) -> pa.Table:
    """Frame rows as the job builds them (``FRAME_ROW_DDL``): capture context
    plus the real parser's columns; each record has ``frame`` and may
    override any column (``edge_rule``, ``partition``, ...)."""
    from bridge.parse import parse_frames

    parsed = parse_frames([r["frame"] for r in records], [r.get("protocol_level", 5) for r in records])
    rows = []
    for i, (rec, p) in enumerate(zip(records, parsed.to_pylist())):
        row = {PARSED_RENAMES.get(k, k): v for k, v in p.items()}
        row.update(stream="mqtt-frames", partition=0, offset=i, seq=i, receive_time=T0, receive_date=T0.date(),
                   conn_id="c1", client_id="dev-1", protocol_level=5, origin="client", duplicate=False)
        row.update(rec)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=FRAME_ROW_SCHEMA)


# -- the two engines ---------------------------------------------------------

#: ``engine`` fixture parameters: every table-engine test runs on both
ENGINES = ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.spark)]


def open_engine(kind: str, tables_dir, request):
    """A ``kind`` engine over ``tables_dir`` (not ensured); delta-spark on the
    session-scoped ``spark`` fixture, skipped (saying why) without its classes."""
    if kind == "delta-rs":
        from bridge.tables.deltars import DeltaRsEngine

        return DeltaRsEngine(tables_dir)
    spark = request.getfixturevalue("spark")
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    if not delta_spark_available(spark):
        pytest.skip(f"delta-spark JVM classes ({DELTA_CLASS}) are not on the classpath: run scripts/bootstrap")
    from bridge.spark.deltaspark import DeltaSparkEngine

    return DeltaSparkEngine(tables_dir, spark)


def sorted_rows(t: pa.Table) -> list[dict]:
    """Every row, every column, in one order whatever the files' order."""
    return sorted(t.to_pylist(), key=lambda r: repr(sorted(r.items())))
