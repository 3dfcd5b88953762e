"""The cyclic garbage collector's settings while an edge runs (process-wide).

:func:`tune_gc` at each edge start: what start-up built is frozen out of
the collector's sight, young passes come less often, and automatic full
passes are off (``housekeeping._gc_round`` makes one every 10 minutes);
:func:`untune_gc` when the last edge of the process stops gives the
thresholds back.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLD0", "GC_THRESHOLD1", "GC_THRESHOLD2", "tune_gc", "untune_gc"]


#: the cyclic garbage collector's first threshold while an edge runs
#: (CPython's default is 700): a busy edge allocates a few objects per
#: delivery that die young, and collecting every 700 allocations took about
#: 7 % of its event loop in the QoS 1 fan-out bench; nothing the edge keeps
#: relies on the collector (no reference cycles on the delivery path)
GC_THRESHOLD0 = 10_000
#: young collections between two of the middle generation (CPython: 10): a
#: middle pass walks what survived that many young ones, 100,000 objects at
#: 10 (40-48 ms measured under a retained flood), 20,000 at 2
GC_THRESHOLD1 = 2
#: no automatic full pass: what the edge keeps for long (a retained overlay
#: of 200,000 topics, queued sessions) made each one walk a million objects,
#: 250-320 ms with the event loop stopped; the housekeeping makes one every
#: ``housekeeping.GC_FULL_EVERY`` rounds instead (10 minutes), at a known time
GC_THRESHOLD2 = 1 << 30


def tune_gc() -> None:
    """Move what start-up built (recovered sessions, imports) out of the
    collector's sight (``gc.freeze``), collect young objects less often
    (:data:`GC_THRESHOLD0`) and leave full passes to the housekeeping
    (:data:`GC_THRESHOLD2`). Process-wide; done once per edge start."""
    global _gc_saved, _gc_edges
    gc.freeze()
    if not _gc_edges:
        _gc_saved = gc.get_threshold()
    _gc_edges += 1
    gc.set_threshold(max(_gc_saved[0], GC_THRESHOLD0), GC_THRESHOLD1, GC_THRESHOLD2)


def untune_gc() -> None:
    """The last edge of the process stopped: the collector's thresholds as
    they were (a process that goes on, a test run, gets its full passes back)."""
    global _gc_edges
    if _gc_edges:
        _gc_edges -= 1
        if not _gc_edges and _gc_saved is not None:
            gc.set_threshold(*_gc_saved)


_gc_saved: tuple[int, int, int] | None = None
_gc_edges = 0  # edges of this process that tuned the collector and run
