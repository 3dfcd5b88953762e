"""``lakegate compact`` from the command line, with either engine."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from deltalake import DeltaTable

from bridge.cli import main
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import publish, table

pytestmark = pytest.mark.usefixtures("bridge_log_level")


@pytest.fixture
def data_dir(tmp_path):
    """Five one-row appends to messages (five small files) and retained rows: one expired, two not."""
    data = tmp_path / "data"
    engine = DeltaRsEngine(data / "tables")
    engine.ensure()
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(5):
        engine.append("messages", table([publish(f"t/{i}", seq=i, at=now)]), "q", i)
    rows = [publish("expired", b"old", seq=10, expiry=10, at=now - dt.timedelta(hours=1)),
            publish("later", b"v", seq=11, expiry=3600, at=now),
            publish("forever", b"v", seq=12, at=now)]
    engine.merge_retained(retained_changes(table(rows)), "q", 0)
    return data


def _no_spark(*args, **kwargs):
    raise AssertionError("lakegate compact started Spark for the delta-rs engine")


@pytest.mark.parametrize("engine_choice", ["delta-rs", "auto"])
def test_compact_expires_retained_and_compacts_small_files_with_delta_rs(data_dir, engine_choice, monkeypatch, capsys):
    monkeypatch.setattr("bridge.spark.session.build_session", _no_spark)
    path = data_dir / "tables" / "messages"
    assert len(DeltaTable(str(path)).file_uris()) == 5
    code = main(["compact", "--json", "--set", f"data_dir={data_dir}", "--set", f"tables.engine={engine_choice}",
                 "--set", "tables.vacuum_retention_hours=1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["engine"] == "delta-rs"
    assert report["expired"] == 1
    assert report["compacted"]["messages"] == {"files_removed": 5, "files_added": 1}
    assert report["vacuumed"]["messages"] == 0  # the replaced files are younger than the retention
    # what the tables hold now
    assert len(DeltaTable(str(path)).file_uris()) == 1
    engine = DeltaRsEngine(data_dir / "tables")
    assert sorted(r["topic"] for r in engine.arrow("messages").to_pylist()) == [f"t/{i}" for i in range(5)]
    retained = {r["topic"]: r for r in engine.arrow("retained").to_pylist()}
    assert retained["expired"]["deleted"] is True and retained["expired"]["payload"] is None
    assert retained["later"]["deleted"] is False and retained["forever"]["deleted"] is False
    live = sorted(t for t, r in retained.items() if not r["deleted"])
    assert live == ["forever", "later"]


def test_compact_prints_one_report_line(data_dir, capsys):
    code = main(["compact", "--set", f"data_dir={data_dir}", "--set", "tables.engine=delta-rs"])
    out = capsys.readouterr().out
    assert code == 0
    assert len(out.splitlines()) == 1
    assert out.startswith("expired retained: 1; compacted: messages 5->1 files")


def test_compact_refuses_a_vacuum_retention_below_one_hour_in_one_line(data_dir, capsys, monkeypatch):
    monkeypatch.setattr("bridge.spark.session.build_session", _no_spark)
    code = main(["compact", "--set", f"data_dir={data_dir}", "--set", "tables.engine=delta-spark",
                 "--set", "tables.vacuum_retention_hours=0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "lakegate: tables.vacuum_retention_hours must be at least 1 (got 0)\n"


def test_a_failing_table_operation_is_one_line_exit_1(data_dir, capsys, monkeypatch):
    def broken(self):
        raise OSError("Generic DeltaTable error: cannot write\ncaused by: No space left on device")

    monkeypatch.setattr(DeltaRsEngine, "compact", broken)
    code = main(["compact", "--set", f"data_dir={data_dir}", "--set", "tables.engine=delta-rs"])
    out = capsys.readouterr()
    assert code == 1 and out.out == ""
    assert out.err == "lakegate: compact: Generic DeltaTable error: cannot write\n"


@pytest.mark.spark
def test_compact_with_delta_spark_builds_a_session_and_answers_in_one_line(spark, data_dir, capfd, monkeypatch):
    """tables.engine = delta-spark used to fail with "needs a SparkSession" as a stack trace.
    With the jars: Delta's own OPTIMIZE, and a VACUUM at the configured retention
    (1 hour), below Delta's own 7-day floor."""
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    monkeypatch.setattr(spark, "stop", lambda: None)  # the command stops its session; this one is shared
    capfd.readouterr()
    code = main(["compact", "--json", "--set", f"data_dir={data_dir}", "--set", "tables.engine=delta-spark",
                 "--set", "tables.vacuum_retention_hours=1",
                 "--set", "spark.master=local[2]", "--set", "spark.shuffle_partitions=2"])
    out = capfd.readouterr()
    assert "Traceback" not in out.err and "needs a SparkSession" not in out.err
    if delta_spark_available(spark):
        assert code == 0, out.err
        report = json.loads(out.out)
        assert report["engine"] == "delta-spark" and report["expired"] == 1
        assert report["compacted"]["messages"] == {"files_removed": 5, "files_added": 1}
        history = DeltaTable(str(data_dir / "tables" / "messages")).history()
        assert [h["engineInfo"].split("/")[0] for h in history if h["operation"] == "OPTIMIZE"] == ["Apache-Spark"]
    else:
        # Without the jars the engine cannot work; what is checked is that the
        # failure is one line and exit code 1.
        print(f"delta-spark JVM classes ({DELTA_CLASS}) are absent: checked the one-line failure only")
        lines = [ln for ln in out.err.splitlines() if ln.startswith("lakegate:")]
        assert code == 1 and len(lines) == 1, out.err
        assert lines[0].startswith("lakegate: compact: tables.engine = delta-spark, but delta-spark's JVM classes "
                                   f"({DELTA_CLASS}) are not on the classpath"), out.err
