"""The AMQP engine's tick looks at a bounded share of its links (issue 38,
item 8): with a link per topic, 200,000 topics made every 50 ms tick walk
200,000 links, and the forwarder thread starved the edge beside it of the
interpreter lock. Each link is still looked at once per round. No peer."""

from __future__ import annotations

from bridge.amqp import engine as engine_mod
from bridge.amqp.engine import TICK_LINKS, Engine


class _Link:
    def __init__(self, key):
        self.key = key


def _engine(n: int) -> Engine:
    eng = Engine.__new__(Engine)  # the tick's bookkeeping only: no container, no peer
    eng.links = {(f"/topic/t{i}", "qos01"): _Link((f"/topic/t{i}", "qos01")) for i in range(n)}
    eng._tick_keys = None
    return eng


def test_a_few_links_are_all_looked_at_every_tick():
    eng = _engine(TICK_LINKS)
    assert len(eng._links_to_check()) == TICK_LINKS
    assert len(eng._links_to_check()) == TICK_LINKS


def test_many_links_are_looked_at_in_turn_each_once_per_round():
    n = TICK_LINKS * 5 + 123
    eng = _engine(n)
    seen = []
    for _ in range(6):
        got = eng._links_to_check()
        assert len(got) <= TICK_LINKS
        seen += [lk.key for lk in got]
    assert len(seen) == n and set(seen) == set(eng.links)
    assert len(eng._links_to_check()) == TICK_LINKS  # the next round starts


def test_links_gone_during_a_round_are_skipped_and_new_ones_come_next_round():
    eng = _engine(TICK_LINKS * 3)
    first = eng._links_to_check()
    gone = next(iter(k for k in list(eng.links)[: TICK_LINKS] if k not in {lk.key for lk in first}))
    del eng.links[gone]
    eng.links[("/topic/new", "qos01")] = _Link(("/topic/new", "qos01"))
    rest = [lk.key for lk in eng._links_to_check() + eng._links_to_check()]
    assert gone not in rest and ("/topic/new", "qos01") not in rest
    assert ("/topic/new", "qos01") in [lk.key for lk in eng._links_to_check()] + [
        lk.key for lk in eng._links_to_check()] + [lk.key for lk in eng._links_to_check()]
    assert engine_mod.TICK_LINKS == TICK_LINKS
