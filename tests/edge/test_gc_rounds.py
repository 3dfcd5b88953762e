"""The edge's garbage-collector settings (issue 38, item 8): no automatic
full pass (they stopped the event loop for 250-320 ms under a retained
flood); the housekeeping makes one every GC_FULL_EVERY rounds, which
collects the cycles that reached the oldest generation."""

from __future__ import annotations

import gc
import logging
import weakref

import bridge.edge.housekeeping as hk
from bridge.edge import gc_tuning


class _Rounds(hk.SessionHousekeeping):
    pass


def test_lg_edge_no_automatic_full_pass_and_the_housekeeping_makes_one(caplog):
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        gc_tuning.tune_gc()
        assert gc.get_threshold() == (max(before[0], gc_tuning.GC_THRESHOLD0), gc_tuning.GC_THRESHOLD1,
                                      gc_tuning.GC_THRESHOLD2)

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        gc.collect(1)
        gc.collect(1)  # survived the middle generation: in the oldest now
        del a, b
        for _ in range(50):  # young and middle passes, as the edge's allocations make them
            gc.collect(1)
        assert alive() is not None  # only a full pass finds it
        h = _Rounds()
        with caplog.at_level(logging.INFO, logger="bridge.edge"):
            for _ in range(hk.GC_FULL_EVERY - 1):
                h._gc_round()
            assert alive() is not None
            h._gc_round()
        assert alive() is None
        line = next(r.getMessage() for r in caplog.records if "full garbage" in r.getMessage())
        assert int(line.split(": ")[2].split()[0]) >= 2  # the two Cycle objects at least
    finally:
        gc_tuning.untune_gc()
        gc.unfreeze()
    assert gc.get_threshold() == before  # the last edge's stop gives them back


def test_lg_edge_switch_interval_while_an_edge_runs_and_given_back():
    import sys

    before = sys.getswitchinterval()
    gc_tuning.tune_gc()
    try:
        gc_tuning.tune_gc()  # a second edge of the process
        assert sys.getswitchinterval() == min(before, gc_tuning.SWITCH_INTERVAL_S)
        gc_tuning.untune_gc()
        assert sys.getswitchinterval() == min(before, gc_tuning.SWITCH_INTERVAL_S)  # one still runs
    finally:
        gc_tuning.untune_gc()
        gc.unfreeze()
    assert sys.getswitchinterval() == before
