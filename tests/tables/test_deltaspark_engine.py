"""The delta-spark engine: the same semantics as delta-rs, when the jars are present.

delta-spark's JVM jars come only from Maven Central, which the test machines
cannot reach; these tests skip with the reason printed when the classes are
absent, and run on a session started with --packages io.delta:... .
"""

import pytest

from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import publish, table

pytestmark = pytest.mark.spark


@pytest.fixture
def engine(spark, tmp_path):
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    if not delta_spark_available(spark):
        pytest.skip(f"delta-spark JVM classes ({DELTA_CLASS}) are not on the classpath: "
                    "start Spark with --packages io.delta:delta-spark_4.2_2.13:4.4.1 (Maven Central is unreachable here)")
    from bridge.spark.deltaspark import DeltaSparkEngine

    e = DeltaSparkEngine(tmp_path / "tables", spark)
    e.ensure()
    return e


def test_append_is_idempotent_per_app_transaction(engine, spark):
    rows = table([publish("a", seq=1)])
    assert engine.append("messages", rows, "q", 0) is True
    assert engine.append("messages", rows, "q", 0) is False
    assert engine.dataframe(spark, "messages").count() == 1


def test_merge_latest_wins_and_tombstones(engine, spark):
    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=5)])), "q", 0)
    engine.merge_retained(retained_changes(table([publish("a", b"old", seq=3), publish("b", b"", seq=4)])), "q", 1)
    rows = {r.topic: r for r in engine.dataframe(spark, "retained").collect()}
    assert rows["a"].payload == b"v1" and rows["b"].deleted is True
    assert engine.merge_retained(retained_changes(table([publish("a", b"v9", seq=9)])), "q", 1).skipped is True


def test_time_travel_by_timestamp_resolves_a_version_and_refuses_a_time_before_the_first_commit(engine, spark):
    from bridge.tables.engine import AsOfError

    engine.merge_retained(retained_changes(table([publish("a", b"v1", seq=1)])), "q", 0)
    engine.merge_retained(retained_changes(table([publish("a", b"v2", seq=2)])), "q", 1)
    commits = engine.commits("retained")
    assert [c.version for c in commits] == list(range(commits[0].version, commits[-1].version + 1))
    at = commits[-2].timestamp.isoformat()
    assert engine.dataframe(spark, "retained", as_of=at).first().payload == b"v1"
    with pytest.raises(AsOfError, match=r"^retained: no version at or before 2000-01-01T00:00:00\.000Z \(oldest \d+ "):
        engine.dataframe(spark, "retained", as_of="2000-01-01T00:00:00Z")
