"""Spark SQL over the delta-rs tables: views, the retained view's filters, mqtt_match."""

import datetime as dt

import pytest

from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.engine import AsOfError
from bridge.tables.retained_rule import retained_changes
from bridge.tables.views import register_views, views_in_query
from tests.tables.rows import publish, table

pytestmark = pytest.mark.spark


@pytest.fixture
def engine(tmp_path):
    e = DeltaRsEngine(tmp_path / "tables")
    e.ensure()
    return e


def test_views_in_query_word_match():
    assert views_in_query("SELECT * FROM retained r JOIN messages m") == ["messages", "retained"]
    assert views_in_query("select topic from RETAINED_all") == ["retained_all"]
    assert views_in_query("select my_messages from x") == []


def test_retained_view_hides_tombstones_and_expired_rows(spark, engine):
    now = dt.datetime.now(dt.timezone.utc)
    rows = [
        publish("live", b"1", seq=1, at=now),
        publish("gone", b"1", seq=2, at=now), publish("gone", b"", seq=3, at=now),
        publish("expired", b"1", seq=4, expiry=1, at=now - dt.timedelta(hours=1)),
        publish("fresh", b"1", seq=5, expiry=3600, at=now),
        publish("plain", b"1", retain=False, seq=6, at=now),
    ]
    engine.append("messages", table(rows), "q", 0)
    engine.merge_retained(retained_changes(table(rows)), "q", 0)
    register_views(spark, engine)
    topics = sorted(r.topic for r in spark.sql("SELECT topic FROM retained").collect())
    assert topics == ["fresh", "live"]
    assert "deleted" not in spark.table("retained").columns
    assert spark.sql("SELECT count(*) c FROM retained_all").first().c == 4
    assert spark.sql("SELECT count(*) c FROM messages").first().c == 6
    # partition column comes back from the directory layout
    assert spark.sql("SELECT DISTINCT receive_date d FROM messages").first().d == now.date()


def test_mqtt_match_in_sql_answers_which_retained_messages_a_subscription_gets(spark, engine):
    rows = [publish(t, b"1", seq=i) for i, t in enumerate(["dev/1/status", "dev/2/status", "dev/1/temp", "$SYS/x"])]
    engine.merge_retained(retained_changes(table(rows)), "q", 0)
    register_views(spark, engine)
    got = sorted(r.topic for r in spark.sql("SELECT topic FROM retained WHERE mqtt_match('dev/+/status', topic)").collect())
    assert got == ["dev/1/status", "dev/2/status"]
    assert spark.sql("SELECT count(*) c FROM retained WHERE mqtt_match('#', topic)").first().c == 3
    assert spark.sql("SELECT mqtt_match('a/#/b', 'a/x/b') m").first().m is None


def test_time_travel_through_spark(spark, engine):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=1)])), "q", 0)
    engine.merge_retained(retained_changes(table([publish("a", b"v2", seq=2)])), "q", 1)
    register_views(spark, engine, as_of=1, views=["retained"])
    assert spark.sql("SELECT payload FROM retained").first().payload == b"v1"
    with pytest.raises(AsOfError, match=r"^retained: version 5 does not exist \(oldest 0, newest 2\)$"):
        register_views(spark, engine, as_of=5, views=["retained"])


def test_the_tables_pages_own_notebook_example_runs(spark, tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from tests.docs.examples import doc_examples

    data = tmp_path / "data"
    engine = DeltaRsEngine(data / "tables")
    engine.ensure()
    engine.merge_retained(retained_changes(table([publish("site/1/status", b"on", seq=1)])), "q", 0)
    monkeypatch.setenv("LAKEGATE_DATA_DIR", str(data))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    import textwrap

    (code,) = doc_examples("docs/tables.md", "Your own notebook or job")
    exec(compile(textwrap.dedent(code), "docs/tables.md", "exec"), {})
    assert "site/1/status" in capsys.readouterr().out


def _topics(spark, view="retained"):
    return sorted(r.topic for r in spark.sql(f"SELECT topic FROM {view}").collect())


def test_retained_as_of_shows_what_a_subscriber_received_then_not_what_the_clock_says(spark, engine):
    from tests.waiting import wait_for

    now = dt.datetime.now(dt.timezone.utc)
    rows = [publish("soon", b"1", seq=1, expiry=3, at=now), publish("stays", b"1", seq=2, at=now)]
    engine.merge_retained(retained_changes(table(rows)), "q", 0)  # version 1
    expires = now + dt.timedelta(seconds=3)
    v1 = engine.resolve_as_of("retained", 1)
    assert v1.committed_at < expires, "precondition: version 1 committed before 'soon' expired"
    wait_for(lambda: dt.datetime.now(dt.timezone.utc) > expires + dt.timedelta(milliseconds=5), timeout=15,
             what="'soon' to expire")
    register_views(spark, engine)
    assert _topics(spark) == ["stays"]  # now: expired
    register_views(spark, engine, as_of=1, views=["retained", "retained_all"])
    assert _topics(spark) == ["soon", "stays"]  # at version 1 it had not expired yet
    assert _topics(spark, "retained_all") == ["soon", "stays"]
    # a timestamp: expires_at is compared with the time asked for (same version 1 both times)
    register_views(spark, engine, as_of=v1.committed_at.isoformat(), views=["retained"])
    assert _topics(spark) == ["soon", "stays"]
    register_views(spark, engine, as_of=expires.isoformat(), views=["retained"])
    assert engine.resolve_as_of("retained", expires.isoformat()).version == 1
    assert _topics(spark) == ["stays"]  # expires_at > moment is false at the moment it expires


def test_tables_under_a_directory_with_a_space_read_through_spark(spark, tmp_path):
    """delta-rs lists data files percent-encoded (a space is %20); Spark must get the real path."""
    e = DeltaRsEngine(tmp_path / "data dir" / "tables")
    e.ensure()
    now = dt.datetime.now(dt.timezone.utc)
    e.append("messages", table([publish("a/b", b"x", seq=1, at=now), publish("a/c", b"y", seq=2, at=now)]), "t", 0)
    assert e.dataframe(spark, "messages").count() == 2
