"""The Delta catalog of bridge/sqlserve/catalog.py on the tests' local session
(delta-spark's jars present; the tests skip, saying why, where they are not):
the tables delta-rs writes registered without a commit, ``retained`` and
``retained_versions`` as the delta-rs views show them, and the maintenance
guard in the sessions made after it."""

from __future__ import annotations

import datetime as dt

import pytest
from deltalake import DeltaTable

from bridge.config import load_config
from bridge.sqlserve import catalog
from bridge.tables.coverage import coverage_metadata
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from bridge.tables.views import version_rows
from tests.tables.rows import publish, table

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def delta(spark):
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    if not delta_spark_available(spark):
        pytest.skip(f"delta-spark's JVM classes ({DELTA_CLASS}) are not on the classpath: .jvm/lib/delta is empty "
                    "(scripts/bootstrap resolves it)")
    return spark


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tables under a directory whose name needs quoting in SQL and in a URI."""
    root = tmp_path_factory.mktemp("catalog") / "it's data"
    engine = DeltaRsEngine(root / "tables")
    engine.ensure()
    now = dt.datetime.now(dt.timezone.utc)
    for batch in range(2):
        rows = [publish(f"dev/{batch}", b"on", seq=2 * batch, at=now),
                publish("gone", b"" if batch else b"x", seq=2 * batch + 1, at=now)]
        engine.append("messages", table(rows), "q", batch)
        engine.merge_retained(retained_changes(table(rows)), "q", batch,
                              coverage_metadata("mqtt-frames", {0: 2 * batch + 2, 1: 7}, "q", batch))
    return root


def _config(data, *sets: str):
    return load_config(None, [f"data_dir={data}", *sets], env={})


def test_the_tables_are_registered_as_delta_tables_without_a_commit(delta, data):
    versions = {t: DeltaTable(str(data / "tables" / t)).version() for t in ("messages", "retained", "quarantine")}
    made = catalog.install(delta, _config(data))
    assert made == ["messages", "retained_all", "quarantine", "retained", "retained_versions"]
    assert {t: DeltaTable(str(data / "tables" / t)).version() for t in versions} == versions
    kinds = {t.name: t.tableType for t in delta.catalog.listTables("default")}
    assert [kinds[n] for n in made] == ["EXTERNAL"] * 3 + ["VIEW"] * 2
    assert catalog.serves_delta(delta)
    assert delta.sql("SELECT count(*) c FROM messages").first().c == 4
    assert sorted(r.topic for r in delta.sql("SELECT topic FROM retained").collect()) == ["dev/0", "dev/1"]
    assert "deleted" not in delta.table("retained").columns
    assert delta.sql("SELECT count(*) c FROM retained_all WHERE deleted").first().c == 1
    assert delta.sql("SELECT count(*) c FROM retained_all VERSION AS OF 1 WHERE deleted").first().c == 0


def test_retained_versions_reads_what_the_delta_rs_history_says(delta, data):
    catalog.install(delta, _config(data), ["retained_versions"])
    got = [r.asDict() for r in delta.sql("SELECT * FROM retained_versions ORDER BY version DESC").collect()]
    want = version_rows(DeltaTable(str(data / "tables" / "retained")).history())
    for row in want:
        row["committed_at"] = row["committed_at"].replace(tzinfo=None)  # the session's zone is UTC
    assert got == want
    assert got[0]["capture_offsets"] == {0: 4, 1: 7} and got[0]["stream"] == "mqtt-frames"


def test_another_data_dir_in_the_same_spark_replaces_the_names(delta, data, tmp_path):
    other = tmp_path / "other"
    DeltaRsEngine(other / "tables").ensure()
    catalog.install(delta, _config(data), ["messages"])
    catalog.install(delta, _config(other), ["messages"])
    assert delta.sql("SELECT count(*) c FROM messages").first().c == 0
    catalog.install(delta, _config(data), ["messages"])
    assert delta.sql("SELECT count(*) c FROM messages").first().c == 4


_OFF = ("through SQL is off: sql.allow_maintenance = false in the configuration of the lakegate process serving "
        "this SQL (lakegate compact runs OPTIMIZE and VACUUM)")


def _refusal(session, sql: str) -> str:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as err:
        session.sql(sql).collect()
    return str(err.value).strip().splitlines()[0]


def test_the_guard_refuses_maintenance_in_the_sessions_made_after_it(delta, data):
    path = str(data / "tables" / "messages").replace("`", "``")
    catalog.install(delta, _config(data), ["messages"])
    catalog.install_guard(delta, _config(data))
    session = delta.newSession()
    assert _refusal(session, "OPTIMIZE messages") == f"OPTIMIZE {_OFF}"
    assert _refusal(session, f"OPTIMIZE delta.`{path}`") == f"OPTIMIZE {_OFF}"
    assert _refusal(session, "VACUUM messages RETAIN 500 HOURS") == f"VACUUM {_OFF}"
    assert _refusal(session, "REORG TABLE messages APPLY (PURGE)") == f"REORG TABLE {_OFF}"
    assert session.sql("SELECT count(*) c FROM messages").first().c == 4  # reading is not maintenance
    # allowed: the same guard, its settings from the configuration of the call
    catalog.install_guard(delta, _config(data, "sql.allow_maintenance=true", "tables.vacuum_retention_hours=24"))
    assert _refusal(session, "VACUUM messages RETAIN 2 HOURS") == (
        "VACUUM ... RETAIN 2.0 HOURS is below tables.vacuum_retention_hours = 24 (readers and time travel may "
        "still need those files)")
    files = len(DeltaTable(path).file_uris())
    assert files == 2 and session.sql("OPTIMIZE messages").count() == 1
    t = DeltaTable(path)
    assert t.history(1)[0]["operation"] == "OPTIMIZE" and len(t.file_uris()) == 1
    catalog.install_guard(delta, _config(data))  # off again: the shared session's other users
