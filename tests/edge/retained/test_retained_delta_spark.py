"""The edge's retained loader over tables delta-spark writes (issue 41,
"what the edge reads"): the job's writes (MERGE with upserts, tombstones
and a late record, the expiry UPDATE, coverage in ``userMetadata``) served
exactly as the same batches written by delta-rs; a table with deletion
vectors or column mapping refused in one line naming the feature, never
misread; a table whose deletion vectors were dropped (the line's remedy)
served again."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time

import pyarrow.parquet as pq
import pytest

from bridge.edge.retained.store import RetainedStore
from bridge.mqtt import decode_packet
from bridge.tables.coverage import coverage_metadata
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import publish, table

pytestmark = pytest.mark.spark

STREAM = "mqtt-frames"


@pytest.fixture
def spark_engine(spark, tmp_path):
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    if not delta_spark_available(spark):
        pytest.skip(f"delta-spark JVM classes ({DELTA_CLASS}) are not on the classpath: "
                    "scripts/bootstrap fetches them into .jvm/lib/delta/")
    from bridge.spark.deltaspark import DeltaSparkEngine

    e = DeltaSparkEngine(tmp_path / "spark" / "tables", spark)
    e.ensure()
    return e


def batches(now: dt.datetime) -> list[tuple[list[dict], dict[int, int]]]:
    """The job's batches: (PUBLISH rows, coverage after the batch)."""
    old = now - dt.timedelta(seconds=100)
    return [
        ([publish("r/a", b"a1", seq=1, at=now),
          publish("r/b", b"b1", seq=2, at=now, qos=2),
          publish("r/c", b"c1", seq=3, at=old, expiry=60),  # expired by the expiry UPDATE
          publish("r/d", b"d1", seq=4, at=now, expiry=3600),
          publish("r/e", b"e1", seq=5, at=now, qos=0, content_type="text/plain",
                  user_properties=[("k", "v"), ("k", "w")])], {0: 6}),
        ([publish("r/a", b"", seq=10, at=now),  # a tombstone [MQTT-3.3.1-6]
          publish("r/b", b"b2", seq=11, at=now),
          publish("r/e", b"e0", seq=1, at=now),  # older than the table's: no change
          publish("r/f", b"f1", seq=12, at=now)], {0: 13}),
        # only a late record: the MERGE changes nothing, the batch commits its transaction
        ([publish("r/b", b"late", seq=7, at=now, offset=13)], {0: 14}),
    ]


def write_like_the_job(engine, now: dt.datetime) -> None:
    for i, (rows, covered) in enumerate(batches(now)):
        engine.merge_retained(retained_changes(table(rows)), "q", i,
                              coverage_metadata(STREAM, covered, "q", i))
    assert engine.expire_retained(int(now.timestamp() * 1e6)) == 1


def loaded(path) -> RetainedStore:
    store = RetainedStore(path, STREAM, 0.0, 1 << 20)
    store.swap(store.load())
    return store


def drain(replay) -> list:
    out = []
    while replay is not None and not replay.done:
        out += replay.take(1000)
    return out


def served(store: RetainedStore) -> list[tuple]:
    """What ``#`` gets: topic, payload, QoS, properties as they go out (whether
    with an expiry interval)."""
    out = []
    for d in drain(store.replay("#", 2, (), time.time())):
        p, _ = decode_packet(d.msg.frame(5, d.qos, 1 if d.qos else None, retain=True, now=time.time()),
                             5, from_client=False)
        left = p.properties.message_expiry_interval
        assert left is None or 0 < left <= 3600
        out.append((p.topic, p.payload, p.qos, p.properties.content_type, p.properties.user_properties,
                    left is not None))
    return sorted(out)


def rows(store: RetainedStore) -> dict[str, tuple[bool, int]]:
    """The version's rows, tombstones too: topic -> (deleted, seq)."""
    s = store.snapshot
    return {t: (bool(s.deleted[i]), int(s.seq[i])) for i, t in enumerate(s.topics.to_pylist())}


def log_actions(path, kind: str) -> list[dict]:
    out = []
    for f in sorted((path / "_delta_log").glob("*.json")):
        out += [a[kind] for a in map(json.loads, f.read_text().splitlines()) if kind in a]
    return out


def test_a_table_delta_spark_writes_serves_what_the_same_batches_through_delta_rs_serve(
        spark_engine, tmp_path):
    now = dt.datetime.now(dt.timezone.utc)
    rs = DeltaRsEngine(tmp_path / "rs" / "tables")
    rs.ensure()
    write_like_the_job(rs, now)
    write_like_the_job(spark_engine, now)
    by_rs = loaded(tmp_path / "rs" / "tables" / "retained")
    by_spark = loaded(spark_engine.path("retained"))
    protocol = log_actions(spark_engine.path("retained"), "protocol")
    assert by_spark.error is None and by_spark.snapshot is not None, (by_spark.error, protocol)
    expect_rows = {"r/a": (True, 10), "r/b": (False, 11), "r/c": (True, 3), "r/d": (False, 4),
                   "r/e": (False, 5), "r/f": (False, 12)}
    assert rows(by_spark) == rows(by_rs) == expect_rows  # r/c: the expiry UPDATE's tombstone
    assert by_spark.snapshot.covered == by_rs.snapshot.covered == {0: 14}
    got = served(by_spark)
    assert got == served(by_rs)
    assert got == [("r/b", b"b2", 1, None, [], False),
                   ("r/d", b"d1", 1, None, [], True),
                   ("r/e", b"e1", 0, "text/plain", [("k", "v"), ("k", "w")], False),
                   ("r/f", b"f1", 1, None, [], False)]


@pytest.mark.slow  # DROP FEATURE: a rewrite and five commits, minutes on a busy machine
def test_deletion_vectors_are_refused_in_one_line_never_served_as_live_and_served_once_dropped(
        spark_engine, spark, caplog):
    path = spark_engine.path("retained")
    now = dt.datetime.now(dt.timezone.utc)
    spark_engine.merge_retained(
        retained_changes(table([publish(f"d/{i}", b"p%d" % i, seq=i, at=now) for i in range(1, 5)])),
        "q", 0, coverage_metadata(STREAM, {0: 5}, "q", 0))
    before = loaded(path)
    assert before.error is None and sorted(before.snapshot.topics.to_pylist()) == ["d/1", "d/2", "d/3", "d/4"]
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors'='true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE topic = 'd/2'")
    assert any(a.get("deletionVector") for a in log_actions(path, "add")), "no deletion vector was written"
    # what reading the listed files as they are would serve: d/2, deleted, as live
    from deltalake import DeltaTable

    listed = [t for f in DeltaTable(str(path)).file_uris()
              for t in pq.read_table(f, columns=["topic"])["topic"].to_pylist()]
    assert "d/2" in listed

    with caplog.at_level(logging.ERROR, logger="bridge.edge"):
        fresh = loaded(path)
        assert before.newer()
        before.swap(before.load())
        fresh.load()  # again: no second line
    assert fresh.snapshot is None and drain(fresh.replay("#", 1, (), time.time())) == []
    for err in (fresh.error, before.error):
        assert err is not None and "\n" not in err
        assert err.startswith(f"retained table {path}: needs reader feature deletionVectors (")
        assert err.endswith(f"ALTER TABLE delta.`{path}` DROP FEATURE deletionVectors")
    assert "own captures only" in fresh.error
    assert f"still serving table version {before.snapshot.version} " in before.error
    # one line from each store (each an edge's)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == \
        [fresh.error, before.error]

    # the remedy the line gives
    spark.sql(f"ALTER TABLE delta.`{path}` DROP FEATURE deletionVectors")
    assert before.newer()
    before.swap(before.load())
    assert before.error is None
    assert [t for t, *_ in served(before)] == ["d/1", "d/3", "d/4"]
    assert before.snapshot.covered == {0: 5}


def test_column_mapping_is_refused_in_one_line(spark_engine, spark, caplog):
    path = spark_engine.path("retained")
    spark_engine.merge_retained(retained_changes(table([publish("m/a", b"x", seq=1)])), "q", 0)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode'='name')")
    with caplog.at_level(logging.ERROR, logger="bridge.edge"):
        store = loaded(path)
    assert store.snapshot is None and store.error is not None and "\n" not in store.error
    assert store.error.startswith(f"retained table {path}: needs reader feature columnMapping "
                                  "(delta.columnMapping.mode = name: ")
    assert store.error.endswith(f"ALTER TABLE delta.`{path}` DROP FEATURE columnMapping")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [store.error]
