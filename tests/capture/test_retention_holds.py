"""Retention holds (bridge.capture.commits.hold_offsets): a hold keeps records
from deletion below the consumers' floor, and never lets anything be deleted
by itself."""

from __future__ import annotations

from bridge.capture.commits import commit_offsets, committed_floor, hold_offsets


def test_a_hold_lowers_the_floor_below_the_consumers(tmp_path):
    commit_offsets(tmp_path, "spark", {0: 100, 1: 50})
    hold_offsets(tmp_path, "edge-sessions", {0: 40, 1: 70})
    assert committed_floor(tmp_path, 2) == [40, 50]


def test_a_hold_alone_deletes_nothing(tmp_path):
    hold_offsets(tmp_path, "edge-sessions", {0: 40, 1: 70})
    assert committed_floor(tmp_path, 2) == [0, 0]
