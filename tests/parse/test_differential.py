"""Differential test: the vectorised parser and the edge's scalar codec agree
on every field and on the rule id, for thousands of random valid and broken
frames of all three protocol levels (see tests/parse/strategies.py).

Each hypothesis example is a batch of up to 250 frames parsed in one call,
so the slicing, grouping and per-step property walk see realistic mixes.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings

from bridge.parse import parse_frames
from tests.parse.reference import compare, reference_row
from tests.parse.strategies import batch

SEEN: Counter = Counter()


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(batch(min_size=40, max_size=250))
def test_vectorised_parser_agrees_with_the_codec(example):
    rows, from_client, max_packet = example
    frames = [r[0] for r in rows]
    table = parse_frames(frames, [r[1] for r in rows], [r[2] for r in rows],
                         from_client=from_client, max_packet_bytes=max_packet)
    views = parse_frames(frames, [r[1] for r in rows], [r[2] for r in rows],
                         from_client=from_client, max_packet_bytes=max_packet, payload_views=True)
    assert views.to_pylist() == table.to_pylist()  # payloads left in place: the same values
    for (frame, level, alias), row in zip(rows, table.to_pylist()):
        expected = reference_row(frame, level, alias, from_client, max_packet)
        SEEN[(expected["valid"], expected["rule"], level)] += 1
        diffs = compare(row, expected)
        assert not diffs, (frame.hex(), level, alias, from_client, max_packet, diffs)


def test_the_differential_run_covered_enough():
    """Runs after the property test (file order): thousands of frames, valid
    and broken, every level, and the main rule families."""
    if not SEEN:  # the property test was deselected
        return
    total = sum(SEEN.values())
    valid = sum(n for (ok, _r, _l), n in SEEN.items() if ok)
    levels = {lv for (_ok, _r, lv) in SEEN}
    rules = {r for (_ok, r, _l) in SEEN if r}
    assert total >= 5000 and valid >= 1000 and total - valid >= 1000, (total, valid)
    assert {3, 4, 5} <= levels
    assert {"MQTT-3.3.1-4", "MQTT-1.5.4-1", "LG-truncated", "LG-property-unknown",
            "LG-property-duplicate", "MQTT-3.3.2-2", "LG-trailing-bytes"} <= rules, rules
