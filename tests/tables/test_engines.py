"""Both table engines, one behaviour: every case runs on delta-rs and on
delta-spark (the session-scoped ``spark``) and expects the same answer:
idempotent appends and MERGE, the retained rule through the MERGE, time
travel, expiry, compaction and vacuum, the coverage metadata the edge reads,
and tables the edge can read. Where a test differs per engine it says why.
"""

import datetime as dt
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge.tables.coverage import coverage_metadata, covered_offsets
from bridge.tables.engine import SCHEMAS, TABLE_PROPERTIES, AsOfError
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import ENGINES, T0, open_engine, publish, sorted_rows, table


@pytest.fixture(params=ENGINES)
def kind(request):
    return request.param


@pytest.fixture
def engine(kind, request, tmp_path):
    e = open_engine(kind, tmp_path / "tables", request)
    e.ensure()
    return e


def current(engine):
    return {r["topic"]: r for r in engine.arrow("retained").to_pylist()}


def merge(engine, rows, version, metadata=None, app="q"):
    return engine.merge_retained(retained_changes(table(rows)), app, version, metadata)


def log_actions(engine, table_name):
    """Every action of the table's log, by version."""
    out = {}
    for f in sorted((engine.path(table_name) / "_delta_log").glob("*.json")):
        out[int(f.stem)] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat()


# -- creation ------------------------------------------------------------------

def test_ensure_is_idempotent_and_creates_three_tables_the_edge_can_read(engine):
    engine.ensure()
    for t in ("messages", "retained", "quarantine"):
        assert engine.versions(t).newest == 0
        create = log_actions(engine, t)[0]
        meta = next(a["metaData"] for a in create if "metaData" in a)
        protocol = next(a["protocol"] for a in create if "protocol" in a)
        assert {k: meta["configuration"].get(k) for k in TABLE_PROPERTIES} == TABLE_PROPERTIES
        assert (protocol["minReaderVersion"], protocol.get("readerFeatures")) == (1, None), protocol
        assert meta["partitionColumns"] == ([] if t == "retained" else ["receive_date"])
        assert engine.arrow(t).schema == SCHEMAS[t]


# -- app transactions ------------------------------------------------------------

def test_append_records_the_app_transaction_and_refuses_a_replay(engine):
    rows = table([publish("a", seq=1), publish("b", seq=2)])
    assert engine.append("messages", rows, "query-1", 0) is True
    assert engine.append("messages", rows, "query-1", 0) is False  # replayed batch
    assert engine.committed_version("messages", "query-1") == 0
    assert engine.arrow("messages").num_rows == 2
    assert engine.append("messages", rows, "query-1", 1) is True
    assert engine.append("messages", rows, "query-2", 0) is True  # another query is another app
    assert engine.arrow("messages").num_rows == 6
    assert engine.versions("messages").newest == 3  # the replay committed nothing


def test_an_empty_batch_is_one_commit_recording_its_transaction(engine):
    assert engine.append("quarantine", SCHEMAS["quarantine"].empty_table(), "q", 0) is True
    assert engine.append("quarantine", SCHEMAS["quarantine"].empty_table(), "q", 0) is False
    assert (engine.versions("quarantine").newest, engine.committed_version("quarantine", "q")) == (1, 0)
    assert engine.arrow("quarantine").num_rows == 0


def test_writes_see_what_another_writer_committed_meanwhile(engine, request):
    """A replay committed through another engine object (another process)
    must still be refused, and a retained MERGE must see the other writer's rows."""
    rows = table([publish("a", seq=1)])
    assert engine.append("messages", rows, "query-1", 0) is True
    other = open_engine(engine.name, engine.tables_dir, request)
    assert other.append("messages", rows, "query-1", 1) is True
    assert engine.committed_version("messages", "query-1") == 1
    assert engine.append("messages", rows, "query-1", 1) is False  # the other writer's batch 1: a replay
    assert engine.append("messages", rows, "query-1", 2) is True
    assert engine.arrow("messages").num_rows == 3

    assert not merge(other, [publish("t", b"new", seq=5)], 0).skipped
    merge(engine, [publish("t", b"old", seq=3)], 1)  # older: must not win over the other's row
    assert current(engine)["t"]["payload"] == b"new"


def test_a_table_replaced_under_the_open_one_is_opened_afresh(engine):
    """delta-rs keeps a table open between batches, delta-spark's JVM caches
    its log: a table deleted and made again must not get a commit on top of
    the old one's version."""
    import shutil

    engine.append("messages", table([publish("a", seq=1)]), "query-1", 0)
    engine.append("messages", table([publish("a", seq=1)]), "query-1", 1)
    shutil.rmtree(engine.path("messages"))
    engine.ensure()
    assert engine.committed_version("messages", "query-1") is None
    assert engine.append("messages", table([publish("b", seq=2)]), "query-1", 0) is True
    assert [r["topic"] for r in engine.arrow("messages").to_pylist()] == ["b"]
    assert sorted(log_actions(engine, "messages")) == [0, 1]


def test_messages_are_partitioned_by_receive_date(engine):
    engine.append("messages", table([publish("a", seq=1)]), "q", 0)
    parts = list((engine.path("messages")).glob("receive_date=*"))
    assert [p.name for p in parts] == [f"receive_date={T0.date().isoformat()}"]


# -- the retained rule through the MERGE -----------------------------------------

def test_mqtt_3_3_1_5_to_7_merge_replaces_deletes_and_never_lets_an_older_record_win(engine):
    merge(engine, [publish("a", b"v1", seq=5), publish("b", b"v", seq=6)], 0)
    # a later batch carries an OLDER record for a (seq 3) and a newer delete for b
    res = merge(engine, [publish("a", b"stale", seq=3), publish("b", b"", seq=9)], 1)
    assert (res.skipped, res.upserts, res.deletes, res.applied) == (False, 1, 1, 1)
    now = current(engine)
    assert now["a"]["payload"] == b"v1" and now["a"]["seq"] == 5
    assert now["b"]["deleted"] is True and now["b"]["payload"] is None and now["b"]["seq"] == 9
    # an older record arriving after the delete does not bring b back
    res = merge(engine, [publish("b", b"zombie", seq=7)], 2)
    assert (res.upserts, res.applied) == (1, 0)
    assert current(engine)["b"]["deleted"] is True
    # one commit per batch, whatever it changed
    assert [c.version for c in engine.commits("retained")] == [0, 1, 2, 3]


def test_mqtt_3_3_1_8_retain_0_changes_nothing_but_the_batch_is_recorded(engine):
    merge(engine, [publish("a", b"keep", seq=1)], 0)
    res = merge(engine, [publish("a", b"live", retain=False, seq=2), publish("b", b"", retain=False, seq=3)], 1)
    assert (res.skipped, res.upserts, res.deletes, res.applied) == (False, 0, 0, 0)
    assert {t: r["payload"] for t, r in current(engine).items()} == {"a": b"keep"}
    assert engine.committed_version("retained", "q") == 1


def test_merge_replay_is_skipped_and_noop_batches_still_record_the_transaction(engine):
    changes = retained_changes(table([publish("a", b"v1", seq=5)]))
    assert engine.merge_retained(changes, "q", 0).skipped is False
    assert engine.merge_retained(changes, "q", 0).skipped is True
    assert engine.merge_retained(retained_changes(table([])), "q", 1).skipped is False
    assert engine.committed_version("retained", "q") == 1
    assert engine.versions("retained").newest == 2


def test_coverage_metadata_is_each_batch_commits_user_metadata(engine):
    """What the edge's retained serving reads (bridge.tables.coverage): every
    committed batch, an empty one too, carries its offsets; a replay adds none."""
    m0 = coverage_metadata("mqtt-frames", {0: 10, 1: 4}, "query-a", 0)
    m1 = coverage_metadata("mqtt-frames", {0: 12, 1: 4}, "query-a", 1)
    merge(engine, [publish("a", b"v1", seq=5)], 0, m0)
    merge(engine, [publish("a", b"v1", seq=5)], 0, coverage_metadata("mqtt-frames", {0: 99}, "query-a", 0))  # replay
    merge(engine, [], 1, m1)
    assert covered_offsets(engine.history("retained"), "mqtt-frames") == {0: 12, 1: 4}
    assert covered_offsets(engine.history("retained"), "other-stream") is None
    assert [h.get("userMetadata") for h in engine.history("retained")][:2] == [m1, m0]
    merge(engine, [publish("b", b"v", seq=6)], 2)  # a commit without coverage: the newest with one counts
    assert covered_offsets(engine.history("retained"), "mqtt-frames") == {0: 12, 1: 4}


# -- time travel -----------------------------------------------------------------

@pytest.fixture(scope="module", params=ENGINES)
def travelled(request, tmp_path_factory):
    """A retained table of three versions (0: empty, 1: a=v1, 2: a=v2), made
    once per engine for the read-only tests below."""
    e = open_engine(request.param, tmp_path_factory.mktemp("travelled") / "tables", request)
    e.ensure()
    merge(e, [publish("a", b"v1", seq=1)], 0)
    merge(e, [publish("a", b"v2", seq=2)], 1)
    return e


def test_time_travel_and_missing_version_names_oldest_and_newest(travelled):
    engine = travelled
    assert {r["topic"]: r["payload"] for r in engine.arrow("retained", as_of=1).to_pylist()} == {"a": b"v1"}
    assert {r["topic"]: r["payload"] for r in engine.arrow("retained", as_of=2).to_pylist()} == {"a": b"v2"}
    assert engine.arrow("retained", as_of=0).num_rows == 0
    with pytest.raises(AsOfError, match=r"^retained: version 9 does not exist \(oldest 0, newest 2\)$"):
        engine.arrow("retained", as_of=9)
    with pytest.raises(AsOfError, match="neither a version number nor an ISO timestamp"):
        engine.arrow("retained", as_of="yesterday")


def test_as_of_a_timestamp_reads_the_newest_version_committed_at_or_before_it(travelled):
    engine = travelled
    commits = engine.commits("retained")
    assert [c.version for c in commits] == [0, 1, 2]
    assert commits[0].timestamp <= commits[1].timestamp <= commits[2].timestamp
    at1 = engine.resolve_as_of("retained", _iso(commits[1].timestamp))
    assert (at1.version, at1.committed_at, at1.moment) == (1, commits[1].timestamp, commits[1].timestamp)
    got = engine.arrow("retained", as_of=_iso(commits[1].timestamp)).to_pylist()
    assert {r["topic"]: r["payload"] for r in got} == {"a": b"v1"}
    # a later time: the newest version at or before it; the moment is the time asked for
    later = commits[2].timestamp + dt.timedelta(hours=1)
    at2 = engine.resolve_as_of("retained", _iso(later))
    assert (at2.version, at2.committed_at, at2.moment) == (2, commits[2].timestamp, later)
    # no zone means UTC
    naive = commits[2].timestamp.replace(tzinfo=None).isoformat()
    assert engine.resolve_as_of("retained", naive).version == 2
    # a version: its own commit time is the moment
    assert engine.resolve_as_of("retained", 1).moment == commits[1].timestamp


def test_a_version_is_dated_as_the_history_shows_it(travelled):
    """The ``retained_versions`` view shows each version's commit info
    timestamp; ``--as-of`` that time must read that version (delta-spark's own
    history dates a version by its commit file's modification time, a few ms
    later, which read the version before)."""
    shown = {h["version"]: dt.datetime.fromtimestamp(h["timestamp"] / 1000, tz=dt.timezone.utc)
             for h in travelled.history("retained")}
    assert sorted(shown) == [0, 1, 2]
    assert {v: travelled.resolve_as_of("retained", _iso(t)).version for v, t in shown.items()} == {0: 0, 1: 1, 2: 2}
    assert [c.timestamp for c in travelled.commits("retained")] == [shown[v] for v in (0, 1, 2)]


def test_as_of_a_timestamp_before_the_first_commit_is_one_line_naming_oldest_and_newest(travelled):
    with pytest.raises(AsOfError) as err:
        travelled.arrow("retained", as_of="2000-01-01T00:00:00Z")
    msg = str(err.value)
    assert "\n" not in msg
    assert re.fullmatch(r"retained: no version at or before 2000-01-01T00:00:00\.000Z "
                        r"\(oldest 0 committed \d{4}-\d\d-\d\dT[\d:.]+Z, newest 2 committed \d{4}-\d\d-\d\dT[\d:.]+Z\)", msg), msg


def test_a_failing_load_is_one_line_without_the_engines_causes(travelled, monkeypatch):
    """Each engine's own errors span lines (delta-rs: causes and paths; Spark:
    plans and stacks); the failing call differs per engine, the line does not."""
    def broken(*args, **kwargs):
        raise OSError("Generic DeltaTable error: version 0 unreadable\ncaused by: object store\n  path: /x/_delta_log")

    if travelled.name == "delta-rs":
        from deltalake import DeltaTable

        monkeypatch.setattr(DeltaTable, "load_as_version", broken)
    else:
        from pyspark.sql.readwriter import DataFrameReader

        monkeypatch.setattr(DataFrameReader, "load", broken)
    with pytest.raises(AsOfError) as err:
        travelled.arrow("retained", as_of=0)
    assert str(err.value) == ("retained: cannot read version 0 (oldest 0, newest 2): "
                              "Generic DeltaTable error: version 0 unreadable")


# -- expiry and maintenance ------------------------------------------------------

def test_expire_retained_turns_expired_rows_into_tombstones(engine):
    rows = [publish("short", b"v", seq=1, expiry=10, at=T0), publish("long", b"v", seq=2, expiry=3600, at=T0),
            publish("forever", b"v", seq=3, at=T0)]
    merge(engine, rows, 0)
    at = int((T0 + dt.timedelta(seconds=60)).timestamp() * 1e6)
    assert engine.expire_retained(at) == 1
    now = current(engine)
    assert now["short"]["deleted"] is True and now["short"]["payload"] is None
    assert now["short"]["expires_at"] is None and now["short"]["seq"] == 1
    assert now["long"]["deleted"] is False and now["forever"]["deleted"] is False
    assert engine.expire_retained(at) == 0
    assert engine.versions("retained").newest == 2  # nothing left to expire: no commit


def test_compact_and_vacuum_keep_the_data_and_an_idle_vacuum_commits_nothing(engine):
    for i in range(5):
        engine.append("messages", table([publish(f"t{i}", seq=i)]), "q", i)
    before = sorted_rows(engine.arrow("messages"))
    metrics = engine.compact()
    assert metrics["messages"] == {"files_removed": 5, "files_added": 1}
    stray = engine.path("messages") / f"receive_date={T0.date()}" / "part-stray-of-a-failed-write.parquet"
    stray.write_bytes(b"PAR1")
    version = engine.versions("messages").newest
    # younger than the retention: nothing deleted, no commit
    assert engine.vacuum(retention_hours=1) == {"messages": 0, "retained": 0, "quarantine": 0}
    assert engine.versions("messages").newest == version and stray.exists()
    removed = engine.vacuum(retention_hours=0)
    assert removed == {"messages": 6, "retained": 0, "quarantine": 0}  # the five replaced files and the stray
    assert not stray.exists()
    assert sorted_rows(engine.arrow("messages")) == before
    version = engine.versions("messages").newest
    assert engine.vacuum(retention_hours=0) == {"messages": 0, "retained": 0, "quarantine": 0}
    assert engine.versions("messages").newest == version


# -- schema evolution --------------------------------------------------------------

def test_quarantine_table_of_an_older_lakegate_gets_the_parser_columns_added(tmp_path, request, kind):
    """Schema evolution: a quarantine table created before ``parser_rule`` /
    ``parser_error`` existed gains them on ``ensure``; old rows read null, new
    rows carry them, and an old version still reads."""
    from deltalake import DeltaTable, write_deltalake

    new = SCHEMAS["quarantine"]
    old = pa.schema([f for f in new if f.name not in ("parser_rule", "parser_error")])
    path = tmp_path / "old" / "quarantine"
    DeltaTable.create(str(path), schema=old, partition_by=["receive_date"], name="quarantine")
    row = {"stream": "mqtt-frames", "partition": 0, "offset": 1, "seq": 1, "receive_time": T0,
           "receive_date": T0.date(), "rule": "LG-truncated", "frame": b"\x30", "frame_size": 1}
    write_deltalake(str(path), pa.Table.from_pylist([row], schema=old), mode="append", partition_by=["receive_date"])

    engine = open_engine(kind, tmp_path / "old", request)
    engine.ensure()
    assert {"parser_rule", "parser_error"} <= {f.name for f in DeltaTable(str(path)).schema().fields}
    fresh = {**row, "offset": 2, "seq": 2, "rule": "MQTT-3.2.2-15", "parser_rule": "LG-truncated",
             "parser_error": "[LG-truncated] ..."}
    assert engine.append("quarantine", pa.Table.from_pylist([fresh], schema=new), "q", 0) is True
    got = sorted(engine.arrow("quarantine").to_pylist(), key=lambda r: r["offset"])
    assert [(r["rule"], r["parser_rule"]) for r in got] == [("LG-truncated", None), ("MQTT-3.2.2-15", "LG-truncated")]
    assert engine.arrow("quarantine", as_of=1).num_rows == 1  # the version before the columns were added
    version = engine.versions("quarantine").newest
    engine.ensure()  # idempotent: nothing more to add
    assert engine.versions("quarantine").newest == version


# -- what the edge reads -----------------------------------------------------------

def test_the_edge_loads_the_retained_table_with_its_properties_and_coverage(engine):
    """The edge's loader reads the Parquet files as they are (no deletion
    vectors, no column mapping): after a MERGE, a tombstone and an expiry
    UPDATE, it serves what the engine reads."""
    from bridge.edge.retained.snapshot import load_snapshot

    rows = [publish("a", b"v1", seq=1, user_properties=[("k", "1")], content_type="text/plain"),
            publish("b", b"v", seq=2, expiry=10, at=T0), publish("c", b"v", seq=3)]
    merge(engine, rows, 0, coverage_metadata("mqtt-frames", {0: 4}, "q", 0))
    merge(engine, [publish("c", b"", seq=4)], 1, coverage_metadata("mqtt-frames", {0: 5}, "q", 1))
    engine.expire_retained(int((T0 + dt.timedelta(seconds=60)).timestamp() * 1e6))
    for actions in log_actions(engine, "retained").values():
        assert not [a for a in actions if "add" in a and a["add"].get("deletionVector")]
    # timestamps as INT64 microseconds in UTC (delta-rs's; Spark's default is INT96)
    files = [f for f in engine.path("retained").glob("*.parquet")]
    assert files and {str(pq.ParquetFile(f).schema_arrow.field("set_at").type) for f in files} == {"timestamp[us, tz=UTC]"}
    snap = load_snapshot(engine.path("retained"), "mqtt-frames", cache_bytes=1 << 20, warm_s=0)
    assert (snap.version, snap.covered) == (3, {0: 5})
    assert sorted(snap.topics.to_pylist()) == ["a", "b", "c"]
    live = snap.live_rows(snap.index.match("#"), now_wall_us=0)
    got = {m.topic: (m.payload, m.qos) for m in snap.messages(live, 0.0)}
    assert got == {"a": (b"v1", 1)}
    table_rows = current(engine)
    assert {t for t, r in table_rows.items() if not r["deleted"]} == set(got)


@pytest.mark.spark
def test_delta_spark_rewrites_files_instead_of_writing_deletion_vectors(tmp_path, request):
    """delta-spark only: delta-rs cannot write deletion vectors at all. With
    the session's default turned on, a table made without lakegate's
    properties gets them on its first DELETE (so the default is really on);
    the engine's tables, made with TABLE_PROPERTIES, never do: MERGE, UPDATE
    (expiry) and DELETE rewrite files, and the protocol asks no reader feature."""
    from delta.tables import DeltaTable

    engine = open_engine("delta-spark", tmp_path / "tables", request)
    default = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
    engine.writer.conf.set(default, "true")
    try:
        control = str(tmp_path / "control")
        (engine.writer.createDataFrame([("a",), ("b",)], "topic STRING").coalesce(1)
         .write.format("delta").save(control))
        engine.writer.sql(f"DELETE FROM delta.`{control}` WHERE topic = 'a'")
        assert [v for v in _adds(tmp_path / "control") if v], "the session default did not turn them on"

        engine.ensure()
        merge(engine, [publish("a", b"v", seq=1, expiry=10, at=T0), publish("b", b"v", seq=2),
                       publish("c", b"v", seq=3)], 0)
        engine.compact()  # one file of three rows: each change below leaves rows beside it
        merge(engine, [publish("b", b"", seq=4)], 1)                                             # MERGE
        assert engine.expire_retained(int((T0 + dt.timedelta(seconds=60)).timestamp() * 1e6)) == 1  # UPDATE
        engine.writer.sql(f"DELETE FROM delta.`{engine.path('retained')}` WHERE topic = 'c'")  # DELETE
    finally:
        engine.writer.conf.unset(default)
    log = log_actions(engine, "retained")
    ops = [next(a["commitInfo"]["operation"] for a in log[v] if "commitInfo" in a) for v in sorted(log)]
    # (OPTIMIZE only when the first MERGE wrote more than one file)
    assert [op for op in ops if op != "OPTIMIZE"] == ["CREATE TABLE", "MERGE", "MERGE", "UPDATE", "DELETE"]
    assert _adds(engine.path("retained")) == [None] * len(_adds(engine.path("retained")))
    protocols = [a["protocol"] for v in log for a in log[v] if "protocol" in a]
    assert protocols == [{"minReaderVersion": 1, "minWriterVersion": 2}]
    assert sorted(current(engine)) == ["a", "b"]


def _adds(table_dir):
    """The deletionVector of every add action in a table's log (None: none)."""
    return [json.loads(line)["add"].get("deletionVector") for f in sorted((table_dir / "_delta_log").glob("*.json"))
            for line in f.read_text().splitlines() if line.startswith('{"add"')]
