"""The retained topics' level index (bridge/edge/retained/index.py) against
the reference matcher (bridge/topic_filter.matches), rule ids in names."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from bridge.edge.retained.index import LevelIndex
from bridge.topic_filter import matches

TOPICS = ["a", "a/b", "a/b/c", "a/c", "a//b", "/a", "/", "", "sport", "sport/", "sport/tennis",
          "$SYS/x", "$SYS", "$share/x", "b/$x", "x/y/z/w", "é/ü", "a/b/c/d/e/f"]
TOPICS = [t for t in TOPICS if t]  # an empty Topic Name is not a topic
FILTERS = ["#", "+", "+/+", "a/#", "a/+", "a/+/c", "+/b", "/#", "/+", "sport/#", "sport/+",
           "$SYS/#", "$SYS/+", "+/x", "#/x"[:1], "a//b", "a/b/c/#", "x/+/z/w", "é/+", "$share/#",
           "b/+", "nothing", "a/b/c/d/e/f/#", "+/+/+/+/+/+"]


def rows_of(index: LevelIndex, topics: list[str], f: str) -> list[str]:
    return sorted(topics[int(r)] for r in index.match(f))


@pytest.mark.parametrize("f", FILTERS)
def test_mqtt_4_7_1_1_and_4_7_1_2_and_4_7_2_1_index_agrees_with_the_reference_matcher(f):
    idx = LevelIndex(pa.array(TOPICS))
    assert rows_of(idx, TOPICS, f) == sorted(t for t in TOPICS if matches(f, t))


def test_mqtt_4_7_2_1_wildcards_first_do_not_match_dollar_topics():
    topics = ["$SYS/a", "$x", "a", "#x"[1:]]
    idx = LevelIndex(pa.array(topics))
    assert rows_of(idx, topics, "#") == ["a", "x"]
    assert rows_of(idx, topics, "+") == ["a", "x"]
    assert rows_of(idx, topics, "$SYS/#") == ["$SYS/a"]


def test_random_topics_and_filters_agree_with_the_reference_matcher():
    rnd = random.Random(7)
    words = ["a", "b", "c", "", "$d", "ee"]
    topics = sorted({"/".join(rnd.choice(words) for _ in range(rnd.randint(1, 5)))
                     for _ in range(600)} - {""})
    idx = LevelIndex(pa.array(topics))
    for _ in range(400):
        parts = [rnd.choice(words + ["+", "+"]) for _ in range(rnd.randint(1, 5))]
        if rnd.random() < 0.3:
            parts.append("#")
        f = "/".join(parts)
        assert rows_of(idx, topics, f) == sorted(t for t in topics if matches(f, t)), f


def test_an_empty_index_matches_nothing():
    idx = LevelIndex(pa.array([], pa.string()))
    assert idx.match("#").size == 0 and idx.match("a/+").size == 0


def test_a_literal_filter_finds_its_topic_among_many_without_wildcards():
    topics = [f"site/{i % 100}/dev{i}" for i in range(20_000)]
    idx = LevelIndex(pa.array(topics))
    assert rows_of(idx, topics, "site/7/dev1207") == ["site/7/dev1207"]
    assert len(idx.match("site/7/+")) == 200
    assert len(idx.match("site/+/dev1207")) == 1
    assert len(idx.match("#")) == 20_000


def test_lg_edge_turn_budget_the_row_table_is_built_a_step_at_a_time(monkeypatch):
    # built in one C call, 200,000 topics held the interpreter lock 150 ms,
    # and the edge's event loop with it, on each reload of the table
    import pyarrow as pa

    from bridge.edge.retained import snapshot

    topics = pa.array([f"t/{i}" for i in range(2 * snapshot.ROW_TABLE_STEP + 7)], pa.large_string())
    calls = []

    class Counting:
        def __init__(self, arr):
            self.arr = arr

        def slice(self, i, n):
            calls.append(n)
            return self.arr.slice(i, n)

        def __len__(self):
            return len(self.arr)

    row = snapshot._row_table(Counting(topics))
    assert row == {f"t/{i}": i for i in range(len(topics))}
    assert calls == [snapshot.ROW_TABLE_STEP, snapshot.ROW_TABLE_STEP, 7]
