"""Retention deletes only segments wholly below every consumer's commit, never the active one."""

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.capture import LogReader, OffsetOutOfRangeError, commit_offsets, read_commits
from bridge.capture.commits import committed_floor, remove_consumer
from bridge.capture.layout import partition_dir
from bridge.capture.retention import apply_retention
from bridge.capture.segment import list_segments, segment_path
from tests.capture.util import append_range, open_log
from tests.waiting import wait_for


def _log_with_segments(path, n=600, segment_bytes=3000):
    with open_log(path, partitions=1, segment_bytes=segment_bytes) as log:
        append_range(log, 0, n)
    return list_segments(partition_dir(path, 0))


def _age(path, seconds):
    """Make every segment look ``seconds`` old."""
    pdir = partition_dir(path, 0)
    t = time.time() - seconds
    for b in list_segments(pdir):
        os.utime(segment_path(pdir, b), (t, t))


def test_nothing_is_deleted_without_a_consumer(tmp_path):
    bases = _log_with_segments(tmp_path)
    _age(tmp_path, 10_000)
    report = apply_retention(tmp_path, 1, retention_age_s=0, retention_bytes=0)
    assert report.deleted == [] and list_segments(partition_dir(tmp_path, 0)) == bases


def test_only_segments_wholly_below_the_commit_are_deleted(tmp_path):
    bases = _log_with_segments(tmp_path)
    _age(tmp_path, 10_000)
    commit = bases[3] + 1  # inside segment 3
    commit_offsets(tmp_path, "job", {0: commit})
    report = apply_retention(tmp_path, 1, retention_age_s=60, retention_bytes=1 << 40)
    assert [d[1] for d in report.deleted] == bases[:3]
    assert list_segments(partition_dir(tmp_path, 0)) == bases[3:]
    reader = LogReader(tmp_path)
    assert reader.earliest_offsets() == [bases[3]]
    assert [r.offset for r in reader.records(0, bases[3], bases[3] + 2)] == [bases[3], bases[3] + 1]
    with pytest.raises(OffsetOutOfRangeError, match=rf"^capture log partition 0: offsets \[0, 5\) are out of range "
                                                    rf"\(the partition holds \[{bases[3]}, 600\); offsets below "
                                                    rf"{bases[3]} were deleted by retention\)$"):
        list(reader.records(0, 0, 5))


def test_young_segments_stay_when_within_budget(tmp_path):
    bases = _log_with_segments(tmp_path)
    commit_offsets(tmp_path, "job", {0: 600})
    report = apply_retention(tmp_path, 1, retention_age_s=3600, retention_bytes=1 << 40)
    assert report.deleted == [] and list_segments(partition_dir(tmp_path, 0)) == bases


def test_size_budget_deletes_oldest_committed_first(tmp_path):
    bases = _log_with_segments(tmp_path)
    commit_offsets(tmp_path, "job", {0: bases[5]})
    total = sum(f.stat().st_size for f in partition_dir(tmp_path, 0).iterdir())
    report = apply_retention(tmp_path, 1, retention_age_s=1 << 30, retention_bytes=total - 1)
    assert [d[1] for d in report.deleted] == bases[:1]
    report = apply_retention(tmp_path, 1, retention_age_s=1 << 30, retention_bytes=0)
    assert [d[1] for d in report.deleted] == bases[1:5]  # never past the commit, whatever the budget


def test_the_active_segment_is_never_deleted(tmp_path):
    bases = _log_with_segments(tmp_path)
    commit_offsets(tmp_path, "job", {0: 10**9})
    _age(tmp_path, 10_000)
    apply_retention(tmp_path, 1, retention_age_s=0, retention_bytes=0)
    assert list_segments(partition_dir(tmp_path, 0)) == bases[-1:]
    with open_log(tmp_path, partitions=1) as log:  # the writer continues from the active segment
        assert log.next_offsets() == [600]


def test_slowest_consumer_holds_retention(tmp_path):
    bases = _log_with_segments(tmp_path)
    _age(tmp_path, 10_000)
    commit_offsets(tmp_path, "fast", {0: 600})
    commit_offsets(tmp_path, "slow", {0: bases[2]})
    assert committed_floor(tmp_path, 1) == [bases[2]]
    apply_retention(tmp_path, 1, retention_age_s=0, retention_bytes=0)
    assert list_segments(partition_dir(tmp_path, 0))[0] == bases[2]
    assert read_commits(tmp_path) == {"fast": {0: 600}, "slow": {0: bases[2]}}
    assert remove_consumer(tmp_path, "slow")
    apply_retention(tmp_path, 1, retention_age_s=0, retention_bytes=0)
    assert list_segments(partition_dir(tmp_path, 0)) == bases[-1:]


def test_partition_missing_from_a_commit_counts_as_uncommitted(tmp_path):
    with open_log(tmp_path, partitions=2, segment_bytes=3000) as log:
        append_range(log, 0, 600)
    commit_offsets(tmp_path, "job", {0: 10**9})  # nothing about partition 1
    before = list_segments(partition_dir(tmp_path, 1))
    apply_retention(tmp_path, 2, retention_age_s=0, retention_bytes=0, now=time.time() + 10_000)
    assert list_segments(partition_dir(tmp_path, 1)) == before
    assert len(list_segments(partition_dir(tmp_path, 0))) == 1


def test_writer_applies_retention_periodically(tmp_path):
    _log_with_segments(tmp_path)
    commit_offsets(tmp_path, "job", {0: 600})
    _age(tmp_path, 10_000)
    with open_log(tmp_path, partitions=1, retention_age_s=60, retention_check_interval_s=1):
        wait_for(lambda: len(list_segments(partition_dir(tmp_path, 0))) <= 1, timeout=20,
                 what="the writer's periodic retention")
    assert len(list_segments(partition_dir(tmp_path, 0))) == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 100), st.booleans()), min_size=1, max_size=8))
def test_retention_never_deletes_an_uncommitted_record(tmp_path_factory, steps):
    """Appends, commits (anywhere at or below the end) and retention runs in
    any order: every offset at or above the committed floor stays readable."""
    path = tmp_path_factory.mktemp("ret")
    written = 0
    committed = 0
    with open_log(path, partitions=1, segment_bytes=2000) as log:
        for n, commit_pct, age_all in steps:
            append_range(log, written, written + n)
            log.flush()
            written += n
            committed = committed + (written - committed) * commit_pct // 100
            commit_offsets(path, "job", {0: committed})
            if age_all:
                _age(path, 10_000)
            apply_retention(path, 1, retention_age_s=0 if age_all else 3600, retention_bytes=0)
            reader = LogReader(path)
            earliest = reader.earliest_offsets()[0]
            assert earliest <= committed
            assert [r.offset for r in reader.records(0, committed, written)] == list(range(committed, written))
