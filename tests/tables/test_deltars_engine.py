"""The delta-rs engine: idempotent appends and MERGE, time travel, expiry, vacuum."""

import datetime as dt
import re

import pytest

from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.engine import AsOfError
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import T0, publish, table


@pytest.fixture
def engine(tmp_path):
    e = DeltaRsEngine(tmp_path / "tables")
    e.ensure()
    return e


def current(engine):
    return {r["topic"]: r for r in engine.arrow("retained").to_pylist()}


def test_ensure_is_idempotent_and_creates_three_tables(engine):
    engine.ensure()
    for t in ("messages", "retained", "quarantine"):
        assert engine.versions(t).newest == 0


def test_append_records_the_app_transaction_and_refuses_a_replay(engine):
    rows = table([publish("a", seq=1), publish("b", seq=2)])
    assert engine.append("messages", rows, "query-1", 0) is True
    assert engine.append("messages", rows, "query-1", 0) is False  # replayed batch
    assert engine.committed_version("messages", "query-1") == 0
    assert engine.arrow("messages").num_rows == 2
    assert engine.append("messages", rows, "query-1", 1) is True
    assert engine.append("messages", rows, "query-2", 0) is True  # another query is another app
    assert engine.arrow("messages").num_rows == 6


def test_writes_see_what_another_writer_committed_meanwhile(engine):
    """The batch step's tables are kept open between batches (update_incremental);
    a replay committed through another engine (another process) must still be
    refused, and a retained MERGE must see the other writer's rows."""
    rows = table([publish("a", seq=1)])
    assert engine.append("messages", rows, "query-1", 0) is True
    other = DeltaRsEngine(engine.tables_dir)
    assert other.append("messages", rows, "query-1", 1) is True
    assert engine.committed_version("messages", "query-1") == 1
    assert engine.append("messages", rows, "query-1", 1) is False  # the other writer's batch 1: a replay
    assert engine.append("messages", rows, "query-1", 2) is True
    assert engine.arrow("messages").num_rows == 3

    new = table([publish("t", b"new", seq=5)])
    old = table([publish("t", b"old", seq=3)])
    assert not other.merge_retained(retained_changes(new), "query-1", 0).skipped
    engine.merge_retained(retained_changes(old), "query-1", 1)  # older: must not win over the other's row
    assert current(engine)["t"]["payload"] == b"new"


def test_a_table_replaced_under_the_open_one_is_opened_afresh(engine):
    import shutil

    engine.append("messages", table([publish("a", seq=1)]), "query-1", 0)
    shutil.rmtree(engine.path("messages"))
    engine.ensure()
    assert engine.committed_version("messages", "query-1") is None
    assert engine.append("messages", table([publish("b", seq=2)]), "query-1", 0) is True
    assert engine.arrow("messages").num_rows == 1


def test_messages_are_partitioned_by_receive_date(engine):
    engine.append("messages", table([publish("a", seq=1)]), "q", 0)
    parts = list((engine.path("messages")).glob("receive_date=*"))
    assert [p.name for p in parts] == [f"receive_date={T0.date().isoformat()}"]


def test_merge_replaces_deletes_and_never_lets_an_older_record_win(engine):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=5), publish("b", b"v", seq=6)])), "q", 0)
    # a later batch carries an OLDER record for a (seq 3) and a newer delete for b
    res = engine.merge_retained(retained_changes(table([publish("a", b"stale", seq=3), publish("b", b"", seq=9)])), "q", 1)
    assert (res.upserts, res.deletes, res.applied) == (1, 1, 1)
    now = current(engine)
    assert now["a"]["payload"] == b"v1" and now["a"]["seq"] == 5
    assert now["b"]["deleted"] is True and now["b"]["payload"] is None
    # an older record arriving after the delete does not bring b back
    engine.merge_retained(retained_changes(table([publish("b", b"zombie", seq=7)])), "q", 2)
    assert current(engine)["b"]["deleted"] is True


def test_merge_replay_is_skipped_and_noop_batches_still_record_the_transaction(engine):
    changes = retained_changes(table([publish("a", b"v1", seq=5)]))
    assert engine.merge_retained(changes, "q", 0).skipped is False
    assert engine.merge_retained(changes, "q", 0).skipped is True
    assert engine.merge_retained(retained_changes(table([])), "q", 1).skipped is False
    assert engine.committed_version("retained", "q") == 1


def test_time_travel_and_missing_version_names_oldest_and_newest(engine):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=1)])), "q", 0)
    engine.merge_retained(retained_changes(table([publish("a", b"v2", seq=2)])), "q", 1)
    assert {r["topic"]: r["payload"] for r in engine.arrow("retained", as_of=1).to_pylist()} == {"a": b"v1"}
    assert {r["topic"]: r["payload"] for r in engine.arrow("retained", as_of=2).to_pylist()} == {"a": b"v2"}
    with pytest.raises(AsOfError, match=r"^retained: version 9 does not exist \(oldest 0, newest 2\)$"):
        engine.arrow("retained", as_of=9)
    with pytest.raises(AsOfError, match="neither a version number nor an ISO timestamp"):
        engine.arrow("retained", as_of="yesterday")


def test_expire_retained_turns_expired_rows_into_tombstones(engine):
    rows = [publish("short", b"v", seq=1, expiry=10, at=T0), publish("long", b"v", seq=2, expiry=3600, at=T0),
            publish("forever", b"v", seq=3, at=T0)]
    engine.merge_retained(retained_changes(table(rows)), "q", 0)
    n = engine.expire_retained(int((T0 + dt.timedelta(seconds=60)).timestamp() * 1e6))
    assert n == 1
    now = current(engine)
    assert now["short"]["deleted"] is True and now["short"]["payload"] is None
    assert now["long"]["deleted"] is False and now["forever"]["deleted"] is False


def test_compact_and_vacuum_keep_the_data(engine):
    for i in range(5):
        engine.append("messages", table([publish(f"t{i}", seq=i)]), "q", i)
    metrics = engine.compact()
    assert metrics["messages"]["files_removed"] == 5 and metrics["messages"]["files_added"] == 1
    removed = engine.vacuum(retention_hours=0)
    assert removed["messages"] == 5
    assert engine.arrow("messages").num_rows == 5


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat()


def test_as_of_a_timestamp_reads_the_newest_version_committed_at_or_before_it(engine):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=1)])), "q", 0)
    engine.merge_retained(retained_changes(table([publish("a", b"v2", seq=2)])), "q", 1)
    commits = engine.commits("retained")
    assert [c.version for c in commits] == [0, 1, 2]
    assert commits[0].timestamp <= commits[1].timestamp <= commits[2].timestamp
    at1 = engine.resolve_as_of("retained", _iso(commits[1].timestamp))
    assert (at1.version, at1.committed_at, at1.moment) == (1, commits[1].timestamp, commits[1].timestamp)
    assert {r["topic"]: r["payload"] for r in engine.arrow("retained", as_of=_iso(commits[1].timestamp)).to_pylist()} == {"a": b"v1"}
    # a later time: the newest version at or before it; the moment is the time asked for
    later = commits[2].timestamp + dt.timedelta(hours=1)
    at2 = engine.resolve_as_of("retained", _iso(later))
    assert (at2.version, at2.committed_at, at2.moment) == (2, commits[2].timestamp, later)
    # no zone means UTC
    naive = commits[2].timestamp.replace(tzinfo=None).isoformat()
    assert engine.resolve_as_of("retained", naive).version == 2
    # a version: its own commit time is the moment
    assert engine.resolve_as_of("retained", 1).moment == commits[1].timestamp


def test_as_of_a_timestamp_before_the_first_commit_is_one_line_naming_oldest_and_newest(engine):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=1)])), "q", 0)
    with pytest.raises(AsOfError) as err:
        engine.arrow("retained", as_of="2000-01-01T00:00:00Z")
    msg = str(err.value)
    assert "\n" not in msg
    assert re.fullmatch(r"retained: no version at or before 2000-01-01T00:00:00\.000Z "
                        r"\(oldest 0 committed \d{4}-\d\d-\d\dT[\d:.]+Z, newest 1 committed \d{4}-\d\d-\d\dT[\d:.]+Z\)", msg), msg


def test_a_failing_load_is_one_line_without_delta_rs_causes(engine, monkeypatch):
    from deltalake import DeltaTable

    def broken(self, version):
        raise OSError("Generic DeltaTable error: version 0 unreadable\ncaused by: object store\n  path: /x/_delta_log")

    monkeypatch.setattr(DeltaTable, "load_as_version", broken)
    with pytest.raises(AsOfError) as err:
        engine.arrow("retained", as_of=0)
    assert str(err.value) == ("retained: cannot read version 0 (oldest 0, newest 0): "
                              "Generic DeltaTable error: version 0 unreadable")


def test_quarantine_table_of_an_older_lakegate_gets_the_parser_columns_added(tmp_path):
    """Schema evolution: a quarantine table created before ``parser_rule`` /
    ``parser_error`` existed gains them on ``ensure``; old rows read null, new
    rows carry them, and an old version still reads."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from bridge.tables.engine import SCHEMAS

    new = SCHEMAS["quarantine"]
    old = pa.schema([f for f in new if f.name not in ("parser_rule", "parser_error")])
    path = tmp_path / "tables" / "quarantine"
    DeltaTable.create(str(path), schema=old, partition_by=["receive_date"], name="quarantine")
    row = {"stream": "mqtt-frames", "partition": 0, "offset": 1, "seq": 1, "receive_time": T0,
           "receive_date": T0.date(), "rule": "LG-truncated", "frame": b"\x30", "frame_size": 1}
    write_deltalake(str(path), pa.Table.from_pylist([row], schema=old), mode="append", partition_by=["receive_date"])

    engine = DeltaRsEngine(tmp_path / "tables")
    engine.ensure()
    assert {"parser_rule", "parser_error"} <= {f.name for f in DeltaTable(str(path)).schema().fields}
    fresh = {**row, "offset": 2, "seq": 2, "rule": "MQTT-3.2.2-15", "parser_rule": "LG-truncated",
             "parser_error": "[LG-truncated] ..."}
    assert engine.append("quarantine", pa.Table.from_pylist([fresh], schema=new), "q", 0) is True
    got = sorted(engine.arrow("quarantine").to_pylist(), key=lambda r: r["offset"])
    assert [(r["rule"], r["parser_rule"]) for r in got] == [("LG-truncated", None), ("MQTT-3.2.2-15", "LG-truncated")]
    assert engine.arrow("quarantine", as_of=1).num_rows == 1  # the version before the columns were added
    engine.ensure()  # idempotent: nothing more to add
