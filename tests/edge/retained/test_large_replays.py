"""Retained replays over a large overlay are matched as they go (issue 38,
item 8): making one costs about as much whatever the overlay holds, each
take looks at a bounded number of entries, and what is served is what the
eager walk serves (the state at the SUBSCRIBE). In process, no sockets."""

from __future__ import annotations

import random
import time

import pytest

import bridge.edge.retained.scan as scan_mod
import bridge.edge.retained.store as store_mod
from bridge.edge.delivery import Outbox, Receiver
from bridge.edge.message import Message
from bridge.edge.retained.scan import filter_matcher
from bridge.topic_filter import matches
from tests.edge.retained.test_store import drain, now, row, store_for, wall, write


def msg(topic: str, payload: bytes = b"m", qos: int = 1) -> Message:
    return Message(topic, qos, True, payload, origin="c", received=time.time())


def _fill(s, n: int, start_seq: int = 100) -> None:
    for i in range(n):
        t = f"big/{i % 7}/{i}" if i % 50 else f"$SYS/x/{i}"
        s.capture(t, start_seq + i, (0, start_seq + i), msg(t, b"o%d" % i, qos=i % 3))


def _served(replay) -> list[tuple[str, bytes, int]]:
    return sorted((d.msg.topic, d.msg.payload, d.qos) for d in drain(replay))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mqtt_4_7_1_1_and_4_7_2_1_the_scans_matcher_agrees_with_the_reference(seed):
    rng = random.Random(seed)
    levels = ["a", "b", "", "$SYS", "$x", "c"]
    for _ in range(3000):
        f = "/".join(rng.choice(levels + ["+"]) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.4:
            f += "/#" if rng.random() < 0.8 else ""
        if rng.random() < 0.05:
            f = "#"
        t = "/".join(rng.choice(levels) for _ in range(rng.randint(1, 5)))
        if not t or matches(f, t) is None:  # (no valid topic / filter: not the scan's business)
            continue
        assert filter_matcher(f)(t) == matches(f, t), (f, t)


@pytest.mark.parametrize("tf", ["#", "big/#", "big/3/+", "+/3/#", "+/+/+", "$SYS/#", "big/3"])
def test_mqtt_3_3_1_9_a_scanned_replay_serves_what_the_eager_walk_serves(tmp_path, monkeypatch, tf):
    write(tmp_path, [row("big/1/1", b"table-older", seq=1, at=now()),
                     row("big/2/7000", b"table-newer", seq=10**9, at=now()),
                     row("big/5/t", b"table-only", seq=3, at=now())])
    s = store_for(tmp_path)
    _fill(s, 6000)
    if tf in ("#", "big/#"):  # more than EAGER_NODES to walk: scanned
        assert s.replay(tf, 2, (), wall()).scan is not None
    monkeypatch.setattr(store_mod, "EAGER_NODES", 0)  # every filter scanned
    lazy = s.replay(tf, 2, (), wall())
    assert lazy.scan is not None
    got = _served(lazy)
    monkeypatch.setattr(store_mod, "EAGER_NODES", 10**9)
    eager = s.replay(tf, 2, (), wall())
    assert eager is None or eager.scan is None
    assert got == (_served(eager) if eager is not None else [])
    if tf == "#":
        assert ("big/1/1", b"o1", 1) in got and ("big/5/t", b"table-only", 1) in got
        assert ("big/2/7000", b"table-newer", 1) in got  # the job's rule: the higher seq wins
        assert not any(t.startswith("$") for t, _, _ in got)  # [MQTT-4.7.2-1]


def test_lg_edge_a_lazy_replay_matches_the_table_after_the_overlay(tmp_path):
    write(tmp_path, [row(f"t/{i}", b"row", seq=i, at=now()) for i in range(30)])
    s = store_for(tmp_path)
    s.capture("t/3", 10**6, (0, 1), msg("t/3", b"edge"))
    s.capture("t/3000", 10**6 + 1, (0, 2), msg("t/3000", b"new"))
    r = s.replay("t/#", 1, (), wall(), eager=False)
    assert r.rows is None and r.count >= 32  # numbers reserved for every possible message
    got = {d.msg.topic: d.msg.payload for d in drain(r)}
    assert got["t/3"] == b"edge" and got["t/3000"] == b"new" and len(got) == 31


def test_lg_edge_a_scanned_replay_serves_the_state_at_the_subscribe(tmp_path):
    s = store_for(tmp_path)
    _fill(s, 5000)
    r = s.replay("big/#", 1, (), wall())
    assert r.scan is not None
    s.capture("big/1/1", 10**7, (0, 10**7), msg("big/1/1", b"later"))  # replaced after
    s.capture("big/1/8", 10**7 + 1, (0, 10**7 + 1), msg("big/1/8", b""))  # cleared after
    s.capture("big/new", 10**7 + 2, (0, 10**7 + 2), msg("big/new", b"new"))  # new after
    got = {d.msg.topic: d.msg.payload for d in drain(r)}
    assert got["big/1/1"] == b"o1" and got["big/1/8"] == b"o8" and "big/new" not in got


def test_lg_edge_each_take_of_a_scanned_replay_looks_at_a_bounded_share(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "EAGER_NODES", 0)
    s = store_for(tmp_path)
    _fill(s, 20_000)
    r = s.replay("nothing/+/matches", 1, (), wall())
    scan = r.scan
    assert scan is not None
    steps = 0
    while not r.done:
        before = scan.pos if r.scan is not None else None
        out = r.take(100)
        assert out == []
        if r.scan is not None:
            assert scan.pos - before <= scan_mod.SCAN_BLOCK * 2
        steps += 1
    assert steps >= 20_000 // (scan_mod.SCAN_BLOCK * 2)


def test_lg_edge_a_replay_that_hands_out_nothing_yet_asks_for_another_pump(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(store_mod, "EAGER_NODES", 0)
    s = store_for(tmp_path)
    _fill(s, 20_000)
    s.capture("zz/last", 10**8, (0, 10**8), msg("zz/last", b"at the end"))
    box = Outbox()
    box.add_replay(s.replay("zz/+", 1, (), wall()))
    rx = Receiver(5, 10)
    pumps = 0
    got = []
    while box.queue:
        got += box.pump(rx, wall())
        pumps += 1
        assert box.more or not box.queue or box.inflight
        for pid in list(box.inflight):
            box.puback(pid)
    assert len(got) == 1 and pumps > 5


def test_lg_edge_frozen_entries_are_shared_while_the_overlay_does_not_change(tmp_path):
    s = store_for(tmp_path)
    _fill(s, 3000)
    a = s.replay("#", 1, (), wall())
    b = s.replay("big/#", 1, (), wall())
    assert a.scan.entries is b.scan.entries
    s.capture("x", 1, (0, 1), msg("x"))
    c = s.replay("#", 1, (), wall())
    assert c.scan.entries is not a.scan.entries and len(c.scan.entries) == 3001


def test_lg_edge_a_covering_version_drops_the_overlay_a_step_at_a_time(tmp_path):
    from bridge.edge.retained.overlay import Entry, Overlay

    o = Overlay()
    for i in range(5000):
        o.apply(Entry(f"d/{i}", i, (i % 2, i), msg(f"d/{i}")))
    o.apply(Entry("d/7", 10**6, (1, 10**6), msg("d/7", b"newer")))  # not covered
    o.begin_drop({0: 10**9, 1: 3000})
    steps = 0
    while o.dropping:
        o.drop_step(1000)
        steps += 1
    assert steps == 5  # 5,000 entries looked at, 1,000 a step
    kept = sorted(o.entries)
    assert kept == sorted([f"d/{i}" for i in range(3000, 5000) if i % 2] + ["d/7"])
    assert len(o) == len([i for i in range(3000, 5000) if i % 2]) + 1
    assert sorted(e.topic for e in o.match("d/+")) == kept  # the trie agrees


def test_lg_edge_entries_applied_during_a_drop_are_kept(tmp_path):
    from bridge.edge.retained.overlay import Entry, Overlay

    o = Overlay()
    for i in range(100):
        o.apply(Entry(f"k/{i}", i, (0, i), msg(f"k/{i}")))
    o.begin_drop({0: 50})
    o.drop_step(10)
    o.apply(Entry("k/40", 500, (0, 500), msg("k/40", b"replaced during the drop")))
    while o.dropping:
        o.drop_step(10)
    assert sorted(o.entries) == sorted([f"k/{i}" for i in range(50, 100)] + ["k/40"])
    assert o.entries["k/40"].msg.payload == b"replaced during the drop"
