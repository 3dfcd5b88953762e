"""The cyclic garbage collector's settings and the interpreter's switch
interval while an edge runs (process-wide).

:func:`tune_gc` at each edge start: what start-up built is frozen out of
the collector's sight, young passes come less often, and automatic full
passes are off (``housekeeping._gc_round`` makes one every 10 minutes);
the interpreter lock changes hands after :data:`SWITCH_INTERVAL_S`
instead of 5 ms. :func:`untune_gc` when the last edge of the process stops
gives both back.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["GC_THRESHOLD0", "GC_THRESHOLD1", "GC_THRESHOLD2", "SWITCH_INTERVAL_S", "tune_gc", "untune_gc"]


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
#: how long a thread that wants the interpreter lock waits for the one that
#: holds it (CPython's default: 5 ms). Every acknowledgement passes through
#: the capture log's flusher thread: it fsyncs without the lock, then needs
#: it back to complete the commit, while the event loop thread holds it in
#: a busy turn. At 5 ms each hand-off added up to 5 ms per commit; under
#: bench hostile's slow-readers the good publisher's PUBACK p99 was 16-92 ms
#: at 5 ms and 11-19 ms at 0.5 ms over 6 runs each, subscriptions 165-204
#: against 80-99 ms. A thread alone (no waiter) is never interrupted.
SWITCH_INTERVAL_S = 0.0005


def tune_gc() -> None:
    """Move what start-up built (recovered sessions, imports) out of the
    collector's sight (``gc.freeze``), collect young objects less often
    (:data:`GC_THRESHOLD0`), leave full passes to the housekeeping
    (:data:`GC_THRESHOLD2`) and hand the interpreter lock over sooner
    (:data:`SWITCH_INTERVAL_S`). Process-wide; done once per edge start."""
    global _gc_saved, _gc_edges, _switch_saved
    gc.freeze()
    if not _gc_edges:
        _gc_saved = gc.get_threshold()
        _switch_saved = sys.getswitchinterval()
        sys.setswitchinterval(min(_switch_saved, SWITCH_INTERVAL_S))
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
            if _switch_saved is not None:
                sys.setswitchinterval(_switch_saved)


_gc_saved: tuple[int, int, int] | None = None
_switch_saved: float | None = None
_gc_edges = 0  # edges of this process that tuned the collector and run
