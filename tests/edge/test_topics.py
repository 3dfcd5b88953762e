"""The subscription tree (bridge.edge.topics): matching by rule id, replacement,
removal and pruning, shared groups, agreement with the scalar matcher."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.edge import topics
from bridge.edge.subscription import Matches, SharedGroup, Sub, split_share
from bridge.edge.topics import REMOVE_AT_ONCE, SubscriptionTree
from bridge.topic_filter import matches as scalar_matches
from tests.opcodes import count_opcodes


def tree_of(*filters: str, client: str = "c") -> SubscriptionTree:
    tree = SubscriptionTree()
    for tf in filters:
        tree.add(Sub(client, tf, 0))
    return tree


def matched(tree: SubscriptionTree, topic: str) -> set[tuple[str, str]]:
    """(client_id, topic_filter) of every subscription that ``topic`` matches."""
    m = tree.match(topic)
    got = [(s.client_id, s.topic_filter) for subs in m.direct.values() for s in subs]
    got += [(s.client_id, s.topic_filter) for g in m.shared for s in g.members.values()]
    assert len(got) == len(set(got)), f"a subscription matched twice: {got}"
    return set(got)


def filters_matching(topic: str, *filters: str) -> set[str]:
    return {tf for _, tf in matched(tree_of(*filters), topic)}


# -- Matching, MQTT 5.0 section 4.7 -------------------------------------------------------------

def test_mqtt_4_7_1_1_multi_level_wildcard_spec_examples():
    # 4.7.1.2: "sport/tennis/player1/#" matches player1, player1/ranking and
    # player1/score/wimbledon; "sport/#" also matches the singular "sport".
    f = "sport/tennis/player1/#"
    for topic in ("sport/tennis/player1", "sport/tennis/player1/ranking",
                  "sport/tennis/player1/score/wimbledon"):
        assert filters_matching(topic, f) == {f}, topic
    assert filters_matching("sport/tennis/player2", f) == set()
    assert filters_matching("sport/tennis", f) == set()
    assert filters_matching("sport", "sport/#") == {"sport/#"}
    assert filters_matching("sports", "sport/#") == set()
    # "#" matches every topic; "+/tennis/#" is valid and matches below any first level.
    assert filters_matching("a/b/c", "#", "+/tennis/#") == {"#"}
    assert filters_matching("x/tennis", "#", "+/tennis/#") == {"#", "+/tennis/#"}
    assert filters_matching("x/tennis/a/b", "#", "+/tennis/#") == {"#", "+/tennis/#"}


def test_mqtt_4_7_1_2_single_level_wildcard_spec_examples():
    # 4.7.1.3: "sport/tennis/+" matches player1 and player2 but not
    # player1/ranking; "sport/+" does not match "sport" but matches "sport/".
    f = "sport/tennis/+"
    assert filters_matching("sport/tennis/player1", f) == {f}
    assert filters_matching("sport/tennis/player2", f) == {f}
    assert filters_matching("sport/tennis/player1/ranking", f) == set()
    assert filters_matching("sport", "sport/+") == set()
    assert filters_matching("sport/", "sport/+") == {"sport/+"}
    # "+" matches "finance"; "+/+" and "/+" match "/finance", "+" does not.
    assert filters_matching("finance", "+", "+/+", "/+") == {"+"}
    assert filters_matching("/finance", "+", "+/+", "/+") == {"+/+", "/+"}
    # "+" in the middle and several of them.
    assert filters_matching("a/b/c", "a/+/c", "+/+/+", "+/b/+", "a/+", "+/+/+/+") == {
        "a/+/c", "+/+/+", "+/b/+"}


def test_empty_levels_are_levels():
    assert filters_matching("a//b", "a/+/b", "+/+/+", "a/b", "a//b", "a/#", "a//#") == {
        "a/+/b", "+/+/+", "a//b", "a/#", "a//#"}
    assert filters_matching("/a", "+/a", "/#", "#", "a", "/+", "+") == {"+/a", "/#", "#", "/+"}
    assert filters_matching("a/", "a", "a/", "a/+", "a/#", "+") == {"a/", "a/+", "a/#"}
    assert filters_matching("/", "+/+", "/", "+", "#", "/#") == {"+/+", "/", "#", "/#"}


def test_mqtt_4_7_2_1_wildcard_does_not_match_dollar_topics():
    # 4.7.2: "#" and "+/monitor/Clients" do not match "$SYS/monitor/Clients";
    # "$SYS/#" and "$SYS/monitor/+" do.
    fs = ("#", "+/monitor/Clients", "+/#", "+/+/+", "$SYS/#", "$SYS/monitor/+")
    assert filters_matching("$SYS/monitor/Clients", *fs) == {"$SYS/#", "$SYS/monitor/+"}
    assert filters_matching("$SYS", "#", "+", "$SYS", "$SYS/#") == {"$SYS", "$SYS/#"}
    # Only the first level counts: a "$" further down is an ordinary character.
    assert filters_matching("a/$SYS", "#", "a/+", "+/+") == {"#", "a/+", "+/+"}
    # The filter of a Shared Subscription follows the same rule.
    tree = SubscriptionTree()
    tree.add(Sub("c", "$share/g/#", 1))
    tree.add(Sub("c", "$share/g/$SYS/#", 1))
    assert [g.topic_filter for g in tree.match("$SYS/x").shared] == ["$SYS/#"]
    assert len(tree.match("x").shared) == 1


def test_mqtt_4_7_3_4_no_normalisation():
    assert filters_matching("A/b", "a/b", "a/+", "A/b") == {"A/b"}
    assert filters_matching("a/b/", "a/b") == set()
    assert filters_matching("a/ b", "a/b") == set()
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert filters_matching(composed, decomposed) == set()
    assert filters_matching(composed, composed) == {composed}


def test_invalid_topic_names_match_nothing():
    tree = tree_of("#", "+", "a/+", "a/#")
    for topic in ("", "a/+", "a/#", "+", "#"):
        assert not tree.match(topic), topic
    assert not SubscriptionTree().match("a")


def test_overlapping_subscriptions_of_one_client_all_match():
    tree = SubscriptionTree()
    for tf in ("a/+", "a/#", "#", "a/b", "x/+"):
        tree.add(Sub("c", tf, 1, sub_id=len(tf)))
    tree.add(Sub("d", "a/b", 2))
    m = tree.match("a/b")
    assert sorted(m.direct) == ["c", "d"]
    assert sorted(s.topic_filter for s in m.direct["c"]) == ["#", "a/#", "a/+", "a/b"]
    assert [s.qos for s in m.direct["d"]] == [2]
    assert m.shared == []


# -- Sub and split_share --------------------------------------------------------------------------

@pytest.mark.parametrize("tf, share, filt", [
    ("$share/g/a/+", "g", "a/+"),
    ("$share/g/#", "g", "#"),
    ("$share/g//", "g", "/"),
    ("a/b", None, "a/b"),
    ("$SYS/#", None, "$SYS/#"),
    ("$share/g", None, "$share/g"),   # no filter: an ordinary filter (the codec refuses it in 5)
    ("$share//a", None, "$share//a"),  # no ShareName
    ("$sharex/g/a", None, "$sharex/g/a"),
])
def test_sub_share_and_filter(tf, share, filt):
    assert split_share(tf) == (share, filt)
    sub = Sub("c", tf, 1)
    assert (sub.share, sub.filter) == (share, filt)


# -- Replacement, removal, pruning ----------------------------------------------------------------

def test_mqtt_3_8_4_3_same_filter_replaces_the_subscription():
    tree = SubscriptionTree()
    first = Sub("c", "a/+", 0, sub_id=1)
    assert tree.add(first) is None
    assert tree.add(Sub("c", "b", 0)) is None
    second = Sub("c", "a/+", 2, no_local=True, retain_as_published=True, retain_handling=1, sub_id=7)
    assert tree.add(second) is first
    assert len(tree) == 2 and tree.count("c") == 2
    # The replaced subscription keeps its place (order first added).
    assert tree.subscriptions("c") == [second, Sub("c", "b", 0)]
    assert tree.match("a/x").direct == {"c": [second]}
    # Another client's identical filter is another subscription.
    assert tree.add(Sub("d", "a/+", 1)) is None
    assert len(tree) == 3 and sorted(tree.match("a/x").direct) == ["c", "d"]
    # A shared filter is replaced the same way: a client is in a group once.
    s1, s2 = Sub("c", "$share/g/a/+", 0), Sub("c", "$share/g/a/+", 1)
    assert tree.add(s1) is None
    assert tree.add(s2) is s1
    [group] = tree.match("a/x").shared
    assert group.members == {"c": s2}
    assert len(tree) == 4


def test_remove_returns_the_subscription_and_prunes_empty_nodes():
    tree = SubscriptionTree()
    a = Sub("c", "a/b/c/#", 1)
    b = Sub("c", "a/b", 1)
    d = Sub("d", "a/b/c/#", 1)
    for s in (a, b, d):
        tree.add(s)
    assert tree.remove("c", "a/b/c/#") is a
    assert tree.remove("c", "a/b/c/#") is None
    assert tree.remove("x", "a/b") is None
    assert tree.remove("d", "a/b") is None
    assert tree.match("a/b/c").direct == {"d": [d]}
    assert tree.remove("d", "a/b/c/#") is d
    # "a/b" still holds c's subscription; nothing below it is left (one node
    # for both levels: "b" is the run that follows "a", see _Node.seg).
    node = tree._root.child("a")
    assert node.seg == ("b",) and node.kids is None and node.subs is b
    assert tree.remove("c", "a/b") is b
    assert tree._root.empty()
    assert len(tree) == 0 and tree.count("c") == 0 and tree.subscriptions("c") == []
    assert not tree.match("a/b")


def test_pruning_keeps_siblings_and_memory_returns():
    tree = SubscriptionTree()
    filters = ["a/b", "a/c", "a/+/d", "a/#", "$share/g/a/b", "$share/h/a/b", "+", "#"]
    for i, tf in enumerate(filters):
        tree.add(Sub(f"c{i}", tf, 0))
    for i, tf in enumerate(filters):
        assert tree.remove(f"c{i}", tf) is not None
        rest = filters[i + 1:]
        for j, other in enumerate(rest, start=i + 1):
            assert (f"c{j}", other) in tree
        assert {tf for _, tf in matched(tree, "a/b")} == {
            f for f in rest if scalar_matches(split_share(f)[1], "a/b")}
    assert tree._root.empty() and tree._clients == {} and len(tree) == 0


def test_remove_client_returns_its_subscriptions_in_order():
    tree = SubscriptionTree()
    mine = [Sub("c", tf, 1) for tf in ("z", "a/#", "$share/g/a", "m/+")]
    for s in mine:
        tree.add(s)
    tree.add(Sub("d", "a/#", 0))
    tree.add(Sub("d", "$share/g/a", 0))
    assert tree.remove_client("c") == mine
    assert tree.remove_client("c") == []
    assert tree.count("c") == 0 and tree.count("d") == 2 and len(tree) == 2
    m = tree.match("a")
    assert list(m.direct) == ["d"] and list(m.shared[0].members) == ["d"]
    assert ("c", "z") not in tree and ("d", "a/#") in tree and "d" not in tree
    assert tree.remove_client("d") == [Sub("d", "a/#", 0), Sub("d", "$share/g/a", 0)]
    assert tree._root.empty()


def _deep_client(tree: SubscriptionTree, cid: str, n: int, depth: int = 20) -> list[Sub]:
    subs = [Sub(cid, "/".join([f"{cid}{j}"] + [f"l{k}" for k in range(1, depth)]), 1) for j in range(n)]
    for s in subs:
        tree.add(s)
    return subs


def test_lg_edge_turn_budget_an_ended_session_leaves_the_tree_a_slice_at_a_time():
    tree = SubscriptionTree()
    mine = _deep_client(tree, "c", 1000) + [Sub("c", "$share/g/x/+", 1), Sub("c", "x/#", 0)]
    tree.add(mine[-2])
    tree.add(mine[-1])
    other = Sub("d", "x/#", 1)
    tree.add(other)
    assert tree.remove_client("c", defer=True) == mine
    # the client has none from now on; the shared group lost it at once
    assert tree.count("c") == 0 and tree.subscriptions("c") == [] and tree.get("c", "x/#") is None
    assert tree.clients() == ["d"] and list(tree) == [other]
    assert tree.match("x/y").shared == [] and tree.leaving == 1
    assert len(tree) == 1 + 1001  # still in the nodes until swept
    slices = []
    while True:
        before = len(tree)
        more = tree.sweep(max_filters=100, max_bytes=1 << 30)
        slices.append(before - len(tree))
        if not more:
            break
    assert slices == [100] * 10 + [1] and tree.leaving == 0 and len(tree) == 1
    assert {cid for cid, _ in matched(tree, "x/y")} == {"d"}
    assert tree.remove_client("d", defer=True) == [other]  # few: at once
    assert tree.leaving == 0 and tree._root.empty()


def test_lg_edge_turn_budget_a_sweep_stops_at_its_bytes_of_filters():
    tree = SubscriptionTree()
    subs = _deep_client(tree, "c", REMOVE_AT_ONCE + 10, depth=100)
    tree.remove_client("c", defer=True)
    first_ten = sum(len(s.topic_filter) for s in subs[:10])  # the first added go first
    before = len(tree)
    assert tree.sweep(max_filters=10_000, max_bytes=first_ten)
    assert before - len(tree) == 10
    assert all(not matched(tree, s.topic_filter) for s in subs[:10])
    assert all(matched(tree, s.topic_filter) for s in subs[10:])


def test_lg_edge_turn_budget_a_client_back_before_the_sweep_meets_none_of_its_old_subscriptions():
    for back in ("add", "settle"):
        tree = SubscriptionTree()
        old = _deep_client(tree, "c", REMOVE_AT_ONCE + 1)
        tree.remove_client("c", defer=True)
        assert tree.sweep(max_filters=5)
        if back == "add":  # the same filter again: new, replacing nothing [MQTT-3.8.4-3]
            assert tree.add(Sub("c", old[-1].topic_filter, 2)) is None
        else:
            tree.settle("c")
        assert tree.leaving == 0
        assert len(tree) == (1 if back == "add" else 0)
        assert not matched(tree, old[0].topic_filter)
        assert tree.sweep() is False


def test_subscriptions_count_len_contains():
    tree = SubscriptionTree()
    assert len(tree) == 0 and tree.subscriptions("c") == [] and tree.count("c") == 0
    subs = [Sub("c", f"t/{i}", 0) for i in range(5)] + [Sub("d", "$share/g/t/+", 1)]
    for s in subs:
        tree.add(s)
    assert len(tree) == 6 and tree.count("c") == 5 and tree.count("d") == 1
    assert tree.subscriptions("c") == subs[:5]
    assert ("d", "$share/g/t/+") in tree and ("d", "t/+") not in tree
    assert tree.get("d", "$share/g/t/+") is subs[5] and tree.get("d", "x") is None
    assert list(tree) == subs and tree.clients() == ["c", "d"]


# -- Shared Subscriptions ------------------------------------------------------------------------

def test_shared_groups_by_name_and_filter():
    tree = SubscriptionTree()
    for cid, tf in (("c1", "$share/g/a/+"), ("c2", "$share/g/a/+"), ("c3", "$share/h/a/+"),
                    ("c4", "$share/g/a/#"), ("c5", "a/+")):
        tree.add(Sub(cid, tf, 1))
    m = tree.match("a/x")
    groups = {(g.name, g.topic_filter): list(g.members) for g in m.shared}
    assert groups == {("g", "a/+"): ["c1", "c2"], ("h", "a/+"): ["c3"], ("g", "a/#"): ["c4"]}
    assert list(m.direct) == ["c5"]
    # A client in a shared group and subscribed directly to the same filter has both.
    tree.add(Sub("c1", "a/+", 0))
    m = tree.match("a/x")
    assert sorted(m.direct) == ["c1", "c5"]
    # The group returned is the tree's own (its round-robin cursor persists).
    assert tree.match("a/x").shared[0] is m.shared[0]


def test_shared_group_without_members_disappears():
    tree = SubscriptionTree()
    tree.add(Sub("c1", "$share/g/a", 1))
    tree.add(Sub("c2", "$share/g/a", 1))
    tree.add(Sub("c3", "$share/h/a", 1))
    tree.remove("c1", "$share/g/a")
    assert [(g.name, list(g.members)) for g in tree.match("a").shared] == [("g", ["c2"]), ("h", ["c3"])]
    tree.remove_client("c2")
    assert [g.name for g in tree.match("a").shared] == ["h"]
    tree.remove("c3", "$share/h/a")
    assert tree.match("a") == Matches() and tree._root.empty()


def group_of(*cids: str) -> SharedGroup:
    g = SharedGroup("g", "a")
    for cid in cids:
        g._put(Sub(cid, "$share/g/a", 1))
    return g


def picks(g: SharedGroup, n: int, prefer=lambda cid: True) -> list[str]:
    return [g.pick(prefer).client_id for _ in range(n)]


def test_shared_pick_round_robin():
    assert SharedGroup("g", "a").pick() is None
    g = group_of("a", "b", "c")
    assert picks(g, 7) == ["a", "b", "c", "a", "b", "c", "a"]
    # A member joining goes last in the round.
    g._put(Sub("d", "$share/g/a", 1))
    assert picks(g, 5) == ["b", "c", "d", "a", "b"]


def test_shared_pick_prefers_and_falls_back_to_the_next_in_turn():
    g = group_of("a", "b", "c", "d")
    online = {"b", "d"}
    assert picks(g, 4, online.__contains__) == ["b", "d", "b", "d"]
    asked = []

    def nobody(cid):
        asked.append(cid)
        return False

    # None preferred: the member whose turn it is, then the next one; each asked once.
    assert g.pick(nobody).client_id == "a"
    assert asked == ["a", "b", "c", "d"]
    assert g.pick(nobody).client_id == "b"
    assert picks(g, 3) == ["c", "d", "a"]


def test_shared_pick_keeps_the_turn_when_members_leave():
    g = group_of("a", "b", "c", "d")
    assert picks(g, 2) == ["a", "b"]          # c's turn
    g._pop("a")                                # a member before the cursor leaves
    assert picks(g, 1) == ["c"]
    g._pop("d")                                # the member whose turn it is leaves
    assert picks(g, 3) == ["b", "c", "b"]
    assert g._pop("x") is None
    g._pop("b")
    g._pop("c")
    assert g.pick() is None


def test_shared_resubscription_keeps_the_members_place():
    g = group_of("a", "b", "c")
    g._put(Sub("a", "$share/g/a", 2))
    assert picks(g, 4) == ["a", "b", "c", "a"]
    assert g.members["a"].qos == 2


# -- Work per message and memory -------------------------------------------------------------------

def count_opcodes_of(fn) -> int:
    """Python bytecode instructions executed in bridge/edge/topics.py by ``fn()``:
    a deterministic measure of the work per message (a scan of a level's
    children or of all subscriptions would show up here)."""
    return count_opcodes(fn, topics.__file__)


def test_match_work_does_not_grow_with_subscriptions_that_do_not_match():
    def tree_with(others: int) -> SubscriptionTree:
        tree = SubscriptionTree()
        for tf in ("site/a/+/temp", "site/#", "+/a/dev1/temp"):
            tree.add(Sub("c", tf, 1))
        for i in range(others):
            # Siblings at every level of the topic's path, and elsewhere.
            for tf in (f"site/a/dev{i}x", f"site/a/+/t{i}", f"site/b{i}/#", f"other{i}/+",
                       f"+/a{i}", f"$share/g{i}/site/a/+/x", f"site/a/dev1/temp/{i}"):
                tree.add(Sub(f"d{i}", tf, 1))
        return tree

    # Two of each sibling give every node on the path the shape it has with 2,000.
    small, big = tree_with(2), tree_with(2000)
    assert len(big) == 3 + 7 * 2000
    topic = "site/a/dev1/temp"
    assert count_opcodes_of(lambda: small.match(topic)) > 100
    assert count_opcodes_of(lambda: big.match(topic)) == count_opcodes_of(lambda: small.match(topic))
    assert {tf for _, tf in matched(big, topic)} == {"site/a/+/temp", "site/#", "+/a/dev1/temp"}


def test_adding_and_removing_a_deep_filter_takes_no_more_steps_than_a_short_one():
    # A run of ordinary levels is one node (_Node.seg), compared by C code:
    # a client holding 1,000 filters of 100 levels (issue 38's subscription
    # flood) is added and dropped in a few steps per filter, not per level.
    def work(depth: int) -> tuple[int, int, int, int]:
        tree = tree_of("x/1/2", "+/+/#", "d/0/#", client="other")
        deep = [f"d/{j}/" + "/".join(f"l{k}" for k in range(depth)) for j in range(1, 11)]
        add = count_opcodes_of(lambda: [tree.add(Sub("c", tf, 0)) for tf in deep])
        assert matched(tree, deep[3]) == {("c", deep[3]), ("other", "+/+/#")}
        match = count_opcodes_of(lambda: tree.match(deep[3]))
        remove = count_opcodes_of(lambda: tree.remove("c", deep[0]))
        drop = count_opcodes_of(lambda: tree.remove_client("c"))
        assert tree.count("c") == 0 and len(tree) == 3
        trees.append(tree)
        return add, match, remove, drop

    trees: list[SubscriptionTree] = []
    assert work(100) == work(3)
    # what they took is pruned, and "d" and "0" are one node again
    node = trees[0]._root.child("d")
    assert node.seg == ("0",) and node.kids[0] == "#" and node.subs is None


def test_memory_per_subscription_and_after_removal():
    # Only allocations made by the tree's module and this file count: other
    # threads of the test process (edges of earlier tests winding down) allocate too.
    mine = [tracemalloc.Filter(True, topics.__file__), tracemalloc.Filter(True, __file__)]

    def used() -> int:
        # a full collection also empties CPython's free lists (tuples, lists,
        # dicts): blocks they hold count as allocated where first allocated,
        # 131 kB of them seen here after the subscription tests before
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(mine)
        return sum(stat.size for stat in snap.statistics("filename"))

    def build_and_remove() -> tuple[float, int]:
        base = used()
        tree = SubscriptionTree()
        for c in range(500):
            cid = f"device-{c:08d}"
            for i in range(10):
                tree.add(Sub(cid, f"site/{c % 100}/{cid}/{i}/+", 1))
        per_sub = (used() - base) / 5_000
        for c in range(500):
            tree.remove_client(f"device-{c:08d}")
        del tree
        return per_sub, used() - base

    tracemalloc.start()
    try:
        per_sub, _ = build_and_remove()  # the first round fills CPython's free lists
        _, left = build_and_remove()
    finally:
        tracemalloc.stop()
    # 427 B measured on CPython 3.11 (module docstring); 10,000 x 10 must stay far below 200 MB.
    assert per_sub < 600, per_sub
    # What stays is allocator noise (a few hundred bytes); a node or client
    # entry left per client would be 50 kB and more.
    assert left < 20_000, left


# -- Agreement with the scalar matcher (bridge.topic_filter.matches) ------------------------------

LEVELS = ["a", "b", "", "$s", "é"]
filter_levels = st.lists(st.sampled_from(LEVELS + ["+"]), min_size=1, max_size=4)
filters = st.builds(lambda lv, h: "/".join(lv + ["#"] if h else lv), filter_levels, st.booleans())
filters = st.one_of(filters, st.just("#"))
topic_names = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=5).map("/".join)
subscriptions = st.lists(
    st.tuples(st.sampled_from(["c1", "c2", "c3"]), st.sampled_from([None, None, "g", "h"]), filters,
              st.integers(0, 2)),
    max_size=25)


def expected(subs: dict[tuple[str, str], Sub], topic: str) -> set[tuple[str, str]]:
    return {key for key, s in subs.items() if scalar_matches(s.filter, topic)}


@settings(max_examples=200, deadline=None)
@given(subscriptions, st.lists(topic_names, min_size=1, max_size=8), st.data())
def test_match_agrees_with_the_scalar_matcher(subs, topic_list, data):
    tree = SubscriptionTree()
    held: dict[tuple[str, str], Sub] = {}
    for cid, share, tf, qos in subs:
        sub = Sub(cid, f"$share/{share}/{tf}" if share else tf, qos)
        assert tree.add(sub) is held.get((cid, sub.topic_filter))
        held[(cid, sub.topic_filter)] = sub
    assert len(tree) == len(held)
    for topic in topic_list:
        assert matched(tree, topic) == expected(held, topic), topic
        m = tree.match(topic)
        assert all(m.direct.values()) and all(g.members for g in m.shared)
        assert all(s is held[(s.client_id, s.topic_filter)] for ss in m.direct.values() for s in ss)
    # Remove some, check again, then remove the rest: the tree is empty.
    keys = list(held)
    gone = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    for key in gone:
        assert tree.remove(*key) is held.pop(key)
    for topic in topic_list:
        assert matched(tree, topic) == expected(held, topic), topic
    for key in list(held):
        assert tree.remove(*key) is held.pop(key)
    assert len(tree) == 0 and tree._root.empty()
