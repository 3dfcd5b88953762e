"""mqtt_match as a SQL function (bridge.sqlserve.match_sql) answers as the
Python rule (bridge.topic_filter.matches) does, over every pair of a corpus
of filters and topics built from awkward levels."""

from __future__ import annotations

import itertools

from bridge.sqlserve.match_sql import create_function_sql
from bridge.topic_filter import matches

LEVELS = ["a", "b", "", "+", "#", "$SYS", "a+", "a#", "\\E", "\\Q", ".", "*", "x\ny", "$", "é"]
EXTRA_FILTERS = [None, "a\x00b", "a/+/#", "+/+/+", "a/b/c", "$SYS/#", "#/a", "a/#/b", "+/#", "a/b/#"]
EXTRA_TOPICS = [None, "a/b/c", "a/b/c/d", "$SYS/x/y", "a//c", "/", "//", "a/b\n"]


def _corpus() -> list[str | None]:
    names = {"/".join(c) for n in (1, 2) for c in itertools.product(LEVELS, repeat=n)}
    return sorted(names)


def test_sql_mqtt_match_agrees_with_the_python_rule_MQTT_4_7_1_and_4_7_2_1(spark):
    # the shared session may hold the Python UDF of register_mqtt_match (a
    # tables test before this one): a SQL function cannot replace it
    spark.sql("DROP TEMPORARY FUNCTION IF EXISTS mqtt_match")
    spark.sql(create_function_sql(temporary=True))
    try:
        filters = _corpus() + EXTRA_FILTERS
        topics = _corpus() + EXTRA_TOPICS
        pairs = [(f, t) for f in filters for t in topics]
        rows = spark.createDataFrame(pairs, "f STRING, t STRING").selectExpr("f", "t", "mqtt_match(f, t) AS m").collect()
        assert len(rows) == len(pairs) > 50000
        wrong = [(r.f, r.t, r.m, matches(r.f, r.t)) for r in rows if r.m != matches(r.f, r.t)]
        assert wrong == []
        # the corpus exercises every outcome
        assert {r.m for r in rows} == {True, False, None}
    finally:
        spark.sql("DROP TEMPORARY FUNCTION IF EXISTS mqtt_match")


def test_sql_mqtt_match_examples(spark):
    # the shared session may hold the Python UDF of register_mqtt_match (a
    # tables test before this one): a SQL function cannot replace it
    spark.sql("DROP TEMPORARY FUNCTION IF EXISTS mqtt_match")
    spark.sql(create_function_sql(temporary=True))
    try:
        got = spark.sql("SELECT mqtt_match('sport/tennis/#', 'sport/tennis') a, mqtt_match('sport/+', 'sport/') b, "
                        "mqtt_match('#', '$SYS/x') c, mqtt_match('sport/ten#', 'sport/tennis') d, "
                        "mqtt_match('a/\\\\E.*', 'a/\\\\Exyz') e").first()
        assert (got.a, got.b, got.c, got.d, got.e) == (True, True, False, None, False)
    finally:
        spark.sql("DROP TEMPORARY FUNCTION IF EXISTS mqtt_match")
