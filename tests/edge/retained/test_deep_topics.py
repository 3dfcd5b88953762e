"""Issue 38 item 6: one retained message on a very deep topic must not break
matching. A retained PUBLISH on a topic of 2,000 levels made every later
SUBSCRIBE to ``#`` (or ``d/#``) fail with RecursionError in the overlay's
recursive ``match``: the connection dropped without a SUBACK, and it
survived a restart (the overlay is rebuilt from the capture log). Every
walk of a topic tree (overlay, the table's level index, the subscription
tree) is iterative: these tests take topics far deeper than Python's
recursion limit, and deeper than ``edge.max_topic_levels`` (a retained row
from an older version, or a larger setting at the time).

Test names carry the rule ids (MQTT 5.0 section 4.7 matching)."""

from __future__ import annotations

import datetime as dt
import random
import sys

import pytest

from bridge.edge.message import Message
from bridge.edge.retained.index import LevelIndex
from bridge.edge.retained.overlay import Entry, Overlay
from bridge.edge.retained.store import RetainedStore
from bridge.edge.router import Router
from bridge.edge.subscription import Sub
from bridge.edge.topics import SubscriptionTree
from bridge.mqtt import Publish, Suback, Subscribe, Subscription, decode_packet, encode
from tests.edge.util import Harness, connect

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

DEPTH = 2000
assert DEPTH > sys.getrecursionlimit()  # the point of the test


def deep(prefix: str = "d", depth: int = DEPTH) -> str:
    """A topic of ``depth`` levels starting with ``prefix``."""
    return "/".join([prefix] + [f"l{i}" for i in range(1, depth)])


def msg(topic: str, payload: bytes = b"deep", seq: int = 0) -> Message:
    return Message(topic, 1, True, payload, origin="pub", ready=True, ref=(0, seq))


# ------------------------------------------------------------------ overlay
def test_mqtt_4_7_1_1_the_overlay_matches_a_2000_level_topic_with_hash():
    ov = Overlay()
    topic = deep()
    ov.apply(Entry(topic, 1, (0, 1), msg(topic)))
    ov.apply(Entry("d", 2, (0, 2), msg("d")))
    ov.apply(Entry("$sys/" + topic, 3, (0, 3), msg("$sys/" + topic)))
    assert [e.topic for e in ov.match("#")] == ["d", topic]  # not the "$" one [MQTT-4.7.2-1]
    assert [e.topic for e in ov.match("d/#")] == ["d", topic]  # the parent level too
    assert [e.topic for e in ov.match(topic)] == [topic]
    assert [e.topic for e in ov.match("/".join(["+"] * DEPTH))] == [topic]  # [MQTT-4.7.1-2]
    assert [e.topic for e in ov.match(deep(depth=DEPTH - 1) + "/#")] == [topic]
    assert [e.topic for e in ov.match("$sys/#")] == ["$sys/" + topic]
    assert list(ov.match(topic + "/x")) == []
    # a topic of 2,000 levels is removed (pruned) without recursion too
    assert ov.drop_covered({0: 4}) == 3 and len(ov) == 0 and not ov._root.kids


def _recursive_match(ov: Overlay, topic_filter: str) -> list[Entry]:
    """The overlay's former recursive walk: the reference for the order of
    the iterative one (depth first, children in insertion order, a node's
    own entry before its subtree)."""
    parts = topic_filter.split("/")
    out: list[Entry] = []

    def below(node, first):
        if node.kids:
            for lev, kid in node.kids.items():
                if first and lev[:1] == "$":
                    continue
                if kid.entry is not None:
                    out.append(kid.entry)
                below(kid, False)

    def walk(node, d):
        if d == len(parts):
            if node.entry is not None:
                out.append(node.entry)
            return
        lev = parts[d]
        if lev == "#":
            if d and node.entry is not None:
                out.append(node.entry)
            below(node, d == 0)
            return
        if not node.kids:
            return
        if lev == "+":
            for name, kid in node.kids.items():
                if d == 0 and name[:1] == "$":
                    continue
                walk(kid, d + 1)
        else:
            kid = node.kids.get(lev)
            if kid is not None:
                walk(kid, d + 1)

    walk(ov._root, 0)
    return out


def test_mqtt_4_7_1_2_and_4_7_2_1_the_iterative_overlay_match_keeps_the_order_and_the_rules():
    rnd = random.Random(38)
    names = ["a", "b", "", "$s", "c"]
    ov = Overlay()
    topics = set()
    for seq in range(400):
        t = "/".join(rnd.choice(names) for _ in range(rnd.randint(1, 5)))
        if not t:
            continue  # not a Topic Name
        topics.add(t)
        ov.apply(Entry(t, seq, (0, seq), msg(t, seq=seq)))
    filters = {"#", "+", "+/#", "a/#", "a/+", "+/+/#", "$s/#", "$s/+", "/#", "a//#", "a/b/c",
               "+/b/+/#", "a/+/+/+/+", "c/#", "b/+/#", "+/+/+/+/+", "nothing/#"}
    filters |= {"/".join(rnd.choice(names + ["+"]) for _ in range(rnd.randint(1, 4)))
                for _ in range(100)}
    filters |= {f + "/#" for f in list(filters) if "#" not in f}
    for f in sorted(filters):
        want = _recursive_match(ov, f)
        assert [e.topic for e in ov.match(f)] == [e.topic for e in want], f
    # and the result is what the specification says, topic by topic
    from bridge.topic_filter import matches
    for f in ("#", "+/+", "a/#", "+/#", "$s/#"):
        assert sorted(e.topic for e in ov.match(f)) == sorted(t for t in topics if matches(f, t))


# ------------------------------------------------------------------ the other trees
def test_mqtt_4_7_1_1_the_tables_level_index_matches_a_2000_level_topic():
    import pyarrow as pa

    idx = LevelIndex(pa.array([deep(), "d", "e/f", "$x/" + deep()]))
    assert sorted(idx.match("#").tolist()) == [0, 1, 2]
    assert sorted(idx.match("d/#").tolist()) == [0, 1]
    assert idx.match(deep()).tolist() == [0]
    assert idx.match("/".join(["+"] * DEPTH)).tolist() == [0]


def test_mqtt_4_7_1_1_the_subscription_tree_takes_and_matches_2000_level_filters():
    tree = SubscriptionTree()
    f = deep(depth=DEPTH - 1) + "/#"
    tree.add(Sub("c", f, 1))
    tree.add(Sub("c", "/".join(["+"] * DEPTH), 1))
    assert len(tree.match(deep()).direct["c"]) == 2
    assert tree.remove("c", f) is not None and tree.remove_client("c")
    assert tree._root.kids is None


# ------------------------------------------------------------------ through the session
def _client(tmp_path, level: int) -> Harness:
    router = Router()
    router.retained = RetainedStore(tmp_path / "no-table", "mqtt-frames")
    for i, t in enumerate([deep(), "d/x"]):
        router.retained.capture(t, i, (0, i), msg(t, b"v-%d" % i, i))
    h = Harness(router=router)
    h.feed(connect(level, client_id="sub"))
    assert h.session.state == "connected"
    h.take()
    return h


def _subscribe(h: Harness, tf: str, pid: int) -> list:
    h.feed(encode(Subscribe(pid, [Subscription(tf, 1)]), h.session.level))
    data = h.take()
    out = []
    while data:
        p, n = decode_packet(data, h.session.level, from_client=False)
        out.append(p)
        data = data[n:]
    return out


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("tf", ["#", "d/#", "+/#"])
def test_mqtt_4_7_1_1_subscribe_gets_suback_and_the_retained_2000_level_topic(tmp_path, level,
                                                                              tf):
    h = _client(tmp_path, level)
    got = _subscribe(h, tf, 1)
    assert h.closed is None and h.session.state == "connected"
    assert isinstance(got[0], Suback) and list(got[0].reason_codes) == [1]
    pubs = got[1:]
    assert all(isinstance(p, Publish) and p.retain for p in pubs)
    assert sorted(p.topic for p in pubs) == sorted([deep(), "d/x"])
    # and again: nothing was left broken
    assert isinstance(_subscribe(h, "d/l1/#", 2)[0], Suback)


def test_mqtt_4_7_1_1_a_2000_level_row_in_the_retained_table_is_served(tmp_path):
    """A retained row deeper than edge.max_topic_levels, from an older
    version (or a larger setting), loaded from the table: matched, served."""
    from bridge.tables.deltars import DeltaRsEngine
    from bridge.tables.retained_rule import retained_changes
    from tests.tables.rows import publish as row, table

    eng = DeltaRsEngine(tmp_path / "tables")
    eng.ensure()
    at = dt.datetime.now(dt.timezone.utc)
    eng.merge_retained(retained_changes(table([row(deep(), b"table", seq=1, at=at),
                                               row("d/y", b"y", seq=2, at=at)])), "q", 0, None)
    s = RetainedStore(tmp_path / "tables" / "retained", "mqtt-frames", 0.0, 1 << 20)
    s.swap(s.load())
    s.capture(deep("e"), 9, (0, 9), msg(deep("e"), b"overlay", 9))
    import time

    for tf in ("#", "d/#", deep(depth=DEPTH - 1) + "/+"):
        replay = s.replay(tf, 1, (), time.time())
        out = []
        while not replay.done:
            out += replay.take(100)
        want = {"#": {deep(), "d/y", deep("e")}, "d/#": {deep(), "d/y"}}.get(tf, {deep()})
        assert {d.msg.topic for d in out} == want, tf


# ------------------------------------------------------------------ the edge, end to end
@pytest.mark.subprocess
@pytest.mark.parametrize("tf", ["#", "d/#"])
def test_mqtt_4_7_1_1_a_retained_2000_level_topic_breaks_no_subscribe_nor_a_restart(
        run_edge, edge_config, tf):
    """The issue's reproduction: with edge.max_topic_levels raised so that
    the PUBLISH is taken, a retained message on a topic of 2,000 levels;
    then SUBSCRIBE gets its SUBACK and the message, before and after a
    restart (the overlay is rebuilt from the capture log)."""
    from tests.edge.conftest import RawClient

    cfg = edge_config(f"edge.max_topic_levels={DEPTH + 10}")
    e1 = run_edge(config=cfg)
    pub = RawClient(e1.port, timeout=10)
    assert pub.connect(5, client_id="pub")[3] == 0
    pub.publish(5, topic=deep(), payload=b"deep", qos=1, packet_id=1, retain=True)
    assert pub.packet() == b"\x40\x02\x00\x01"
    pub.close()
    for attempt in range(2):
        e = e1 if attempt == 0 else run_edge(config=cfg)
        c = RawClient(e.port, timeout=10)
        assert c.connect(5, client_id=f"sub{attempt}")[3] == 0
        c.send(encode(Subscribe(1, [Subscription(tf, 1)]), 5))
        suback, _ = decode_packet(c.packet(), 5, from_client=False)
        assert isinstance(suback, Suback) and list(suback.reason_codes) == [1], attempt
        p, _ = decode_packet(c.packet(), 5, from_client=False)
        assert isinstance(p, Publish) and p.topic == deep() and p.retain and p.payload == b"deep"
        c.close()
        if attempt == 0:
            e1.stop()
