"""The edge's subscription tree: who receives a PUBLISH to a topic (pure, no I/O).

One :class:`SubscriptionTree` holds every subscription of every session of
the edge. It is a trie keyed by topic level, as Mosquitto's ``subs.c``: a
node per filter level, with ``+`` and ``#`` as ordinary child keys, except
that a run of ordinary levels with nothing at them but the one way on is
one node (path compression, ``_Node.seg``): a filter of 100 levels costs a
few Python steps to add or remove, not a few per level (issue 38).
:meth:`SubscriptionTree.match` walks the topic's levels once, following at
each node the literal child, the ``+`` child and the ``#`` child; the work per
message grows with the topic's depth and with the subscriptions that match,
never with those that do not (no scan of every subscription).

Matching (MQTT 5.0 section 4.7, the same as :func:`bridge.topic_filter.matches`):

* ``+`` matches exactly one level [MQTT-4.7.1-2], ``#`` matches its parent
  level and any number of levels below [MQTT-4.7.1-1];
* empty levels are levels: ``a//b`` has three, ``/a`` two, ``sport/`` two
  (``sport/+`` matches it, ``sport/`` does not match ``sport``);
* a filter whose first character is ``+`` or ``#`` does not match a topic name
  starting with ``$`` [MQTT-4.7.2-1]; this holds for the filter of a Shared
  Subscription too (``$share/g/#`` does not match ``$SYS/x``);
* levels are compared character by character, no normalisation [MQTT-4.7.3-4];
* filters are assumed valid (the codec checks them,
  :func:`bridge.mqtt.subscribe.check_topic_filter`); an invalid topic name
  (empty, or containing ``+`` or ``#``) matches nothing.

Subscriptions are identified by (Client Identifier, Topic Filter as
subscribed): a second :meth:`~SubscriptionTree.add` with the same pair
replaces the first and keeps its place [MQTT-3.8.4-3]. A Topic Filter
``$share/{ShareName}/{filter}`` is a Shared Subscription (MQTT 5.0 section 4.8.2): its
members sit in one :class:`SharedGroup` per (ShareName, filter) at the
filter's node, ``$share/g/a/+`` and ``$share/h/a/+`` being two groups; a
client is in a group once; a group without members is removed. Whether a
client may use ``$share`` (MQTT 5 only; a 3.x filter ``$share/...`` is
decided by the caller) is not the tree's business: a filter that parses as
``$share/{name}/{filter}`` is shared.

Removing the last subscription at a node prunes the node and every ancestor
left empty, so memory returns after unsubscribes and expired sessions.

A session that ends with more than :data:`REMOVE_AT_ONCE` subscriptions
leaves them in a slice at a time (``remove_client(..., defer=True)``, then
:meth:`SubscriptionTree.sweep` once per turn of the event loop): 20 clients
of 1,000 filters of 100 levels each, disconnecting together, held the loop
120 ms in one turn (issue 38, ``bench hostile`` subscriptions)
[LG-edge-turn-budget]. Until swept, such a subscription may still be
matched; it names a client the router no longer has a session for, so
nothing is delivered by it. A client that comes back first has what is
left of its old subscriptions removed at once (:meth:`SubscriptionTree.settle`,
from :meth:`~SubscriptionTree.add` and the router's ``attach``), so the old
never meet the new. Shared subscriptions leave at once (a group must
never pick a member that is gone).

Memory, measured with :mod:`tracemalloc` by ``python -m bridge.bench.topics``
(CPython 3.11, 64-bit), counting the tree and the ``Sub`` objects with their
Client Identifiers and filters: 10,000 clients x 10 subscriptions each
(100,000) take 43 MB (427 B a subscription) when every subscription has a
filter of its own (``site/{area}/{client}/{i}/+``, the trie's worst case)
and 20 MB when the clients share 10 filters. To get there a node keeps a
single child or a single subscription without a dict, and a run of levels
is one node (a filter of 100 levels of its own: 7.7 kB, 18 kB at a node
per level). Removing every client
returns the memory (a few kB of CPython's free lists stay). ``match`` runs at
about 500,000 calls/s for a topic with one match whether the tree holds 0 or
100,000 other subscriptions (100,000 calls/s with 100 matches).

The tree is not thread-safe: the edge's event loop owns it.

One piece: ``_Node`` and :class:`SubscriptionTree` are one data
structure. ``add`` splits a node's run of levels (``seg``) where a filter
ends or turns off, ``_unlink`` (behind ``remove``, ``remove_client``,
``sweep`` and ``settle``) prunes nodes and merges runs again, and ``match``
walks the same compressed nodes with their three forms of ``kids`` and
``subs``; the invariant (a run holds no wildcard level and nothing along
it) is kept by all of them together. The subscriptions and shared groups
it stores are :mod:`bridge.edge.subscription`'s already.
"""

from __future__ import annotations

from collections.abc import Iterator

from bridge.edge.subscription import _SHARE, Matches, SharedGroup, Sub, split_share

__all__ = [
    "REMOVE_AT_ONCE",
    "SWEEP_FILTERS",
    "SWEEP_FILTER_BYTES",
    "SubscriptionTree",
]

#: a session that ends with more subscriptions than this leaves them a
#: slice at a time (``remove_client(defer=True)``, :meth:`SubscriptionTree.sweep`)
REMOVE_AT_ONCE = 256
#: subscriptions one :meth:`SubscriptionTree.sweep` removes at most (about
#: 1 ms of short filters)...
SWEEP_FILTERS = 512
#: ...and characters of Topic Filters at most (about 70 filters of 100 levels)
SWEEP_FILTER_BYTES = 64 * 1024


class _Node:
    """One level of the trie, or a run of levels.

    To keep 100,000 subscriptions small, a node holds each of its parts in
    the cheapest form: ``kids`` is None, a ``(level, node)`` tuple for a
    single child (most nodes below a per-device level) or a dict level ->
    node; ``subs`` is None, the one non-shared ``Sub`` or a dict client_id ->
    ``Sub``; ``groups`` is None or a dict ShareName -> :class:`SharedGroup`.

    ``seg`` (None, or a non-empty tuple of levels, never ``+`` nor ``#``):
    the levels that follow the node's own level with nothing at them but
    the one way on, so a node stands for its level and ``seg`` (path
    compression). A filter of 100 levels that shares only its first with
    others is then one node, not 100: adding or removing it, or dropping a
    client that holds 1,000 such, costs a few Python steps per filter (the
    levels are compared by C code), not a few per level. (A tuple of
    strings, which the cyclic garbage collector stops tracking after its
    first look, not a list it would walk level by level at every pass.)
    """

    __slots__ = ("kids", "subs", "groups", "seg")

    def __init__(self) -> None:
        self.kids: tuple[str, _Node] | dict[str, _Node] | None = None
        self.subs: Sub | dict[str, Sub] | None = None
        self.groups: dict[str, SharedGroup] | None = None
        self.seg: tuple[str, ...] | None = None

    def split(self, c: int) -> None:
        """Keep the first ``c`` levels of ``seg`` here and move the rest, with
        everything this node holds, to a new child (a filter ends, or two
        diverge, at that level). The containers move as they are: a
        :class:`Matches` taken before holds the same objects."""
        seg = self.seg
        low = _Node()
        low.kids, low.subs, low.groups = self.kids, self.subs, self.groups
        low.seg = seg[c + 1:] or None  # type: ignore[index]
        self.kids = (seg[c], low)  # type: ignore[index]
        self.subs = self.groups = None
        self.seg = seg[:c] or None  # type: ignore[index]

    def merge(self) -> None:
        """Undo a :meth:`split` that is no longer needed: a node that holds
        nothing and has one child of an ordinary level takes that child's
        level, run and content (called on a node that is not the root)."""
        kids = self.kids
        if self.subs is not None or self.groups is not None or type(kids) is not tuple:
            return
        level, only = kids  # type: ignore[misc]
        if level == "+" or level == "#":
            return
        self.seg = (self.seg or ()) + (level,) + (only.seg or ())
        self.kids, self.subs, self.groups = only.kids, only.subs, only.groups

    def child(self, level: str) -> _Node | None:
        kids = self.kids
        if kids is None:
            return None
        if type(kids) is tuple:
            return kids[1] if kids[0] == level else None
        return kids.get(level)  # type: ignore[union-attr]

    def make_child(self, level: str) -> _Node:
        kids = self.kids
        if kids is None:
            node = _Node()
            self.kids = (level, node)
            return node
        if type(kids) is tuple:
            if kids[0] == level:
                return kids[1]
            node = _Node()
            self.kids = {kids[0]: kids[1], level: node}
            return node
        node = kids.get(level)  # type: ignore[union-attr]
        if node is None:
            node = kids[level] = _Node()  # type: ignore[index]
        return node

    def drop_child(self, level: str) -> None:
        kids = self.kids
        if type(kids) is tuple:
            self.kids = None
            return
        del kids[level]  # type: ignore[union-attr]
        if len(kids) == 1:  # type: ignore[arg-type]
            self.kids = next(iter(kids.items()))  # type: ignore[union-attr]

    def put_sub(self, sub: Sub) -> Sub | None:
        subs = self.subs
        if subs is None:
            self.subs = sub
            return None
        if type(subs) is Sub:
            if subs.client_id == sub.client_id:
                self.subs = sub
                return subs
            self.subs = {subs.client_id: subs, sub.client_id: sub}
            return None
        old = subs.get(sub.client_id)  # type: ignore[union-attr]
        subs[sub.client_id] = sub  # type: ignore[index]
        return old

    def pop_sub(self, client_id: str) -> Sub:
        subs = self.subs
        if type(subs) is Sub:
            self.subs = None
            return subs
        old = subs.pop(client_id)  # type: ignore[union-attr]
        if len(subs) == 1:  # type: ignore[arg-type]
            self.subs = next(iter(subs.values()))  # type: ignore[union-attr]
        return old

    def empty(self) -> bool:
        return self.kids is None and self.subs is None and self.groups is None


def _chain(node: _Node, levels: tuple[str, ...], i: int) -> _Node:
    """New nodes under ``node`` for ``levels[i:]`` (``levels[i]`` is not a
    child of ``node``): one per wildcard level and per run of ordinary
    levels; returns the last."""
    n = len(levels)
    while i < n:
        node = node.make_child(levels[i])
        i += 1
        j = n  # the next wildcard level, searched by C code
        if "+" in levels:
            try:
                j = levels.index("+", i, j)
            except ValueError:
                pass
        if "#" in levels:
            try:
                j = levels.index("#", i, j)
            except ValueError:
                pass
        if j > i:
            node.seg = levels[i:j]
            i = j
    return node


class SubscriptionTree:
    """Every subscription of the edge, matched by walking a topic's levels once."""

    __slots__ = ("_root", "_clients", "_leaving", "_count", "version")

    def __init__(self) -> None:
        self._root = _Node()
        # client_id -> {topic_filter as subscribed -> Sub}, in the order first added.
        self._clients: dict[str, dict[str, Sub]] = {}
        # client_id -> Topic Filters still in the tree after the client's
        # session ended (remove_client(defer=True)); sweep() removes them
        self._leaving: dict[str, list[str]] = {}
        self._count = 0
        #: changes with every add and remove: a :class:`Matches` taken at the
        #: same version (``Matches.version``) is still the tree's answer
        self.version = 0

    def __len__(self) -> int:
        """The number of subscriptions, members of shared groups included
        (and those of ended sessions not swept yet)."""
        return self._count

    def __contains__(self, key: object) -> bool:
        """``(client_id, topic_filter) in tree``."""
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        subs = self._clients.get(key[0])
        return subs is not None and key[1] in subs

    def __iter__(self) -> Iterator[Sub]:
        """Every subscription, client by client in the order they were added."""
        for subs in self._clients.values():
            yield from subs.values()

    def clients(self) -> list[str]:
        """The Client Identifiers with at least one subscription."""
        return list(self._clients)

    def get(self, client_id: str, topic_filter: str) -> Sub | None:
        """The subscription of ``client_id`` to ``topic_filter`` (as subscribed), or None."""
        subs = self._clients.get(client_id)
        return None if subs is None else subs.get(topic_filter)

    def add(self, sub: Sub) -> Sub | None:
        """Add ``sub``; return the ``Sub`` it replaced (same client, same Topic
        Filter as subscribed) or None [MQTT-3.8.4-3]. A replaced subscription
        keeps its place in :meth:`subscriptions` and in its shared group."""
        if self._leaving and sub.client_id in self._leaving:
            self.settle(sub.client_id)
        share, tf = split_share(sub.topic_filter)
        node = self._root
        levels = tuple(tf.split("/"))
        n = len(levels)
        i = 0
        while i < n:
            child = node.child(levels[i])
            i += 1
            if child is None:
                node = _chain(node, levels, i - 1)
                break
            seg = child.seg
            if seg is not None:
                k = len(seg)
                if levels[i:i + k] != seg:  # the filter ends or turns off inside the run
                    c = 0
                    while c < k and i + c < n and levels[i + c] == seg[c]:
                        c += 1
                    child.split(c)
                    k = c
                i += k
            node = child
        self.version += 1
        if share is None:
            old = node.put_sub(sub)
        else:
            if node.groups is None:
                node.groups = {}
            group = node.groups.get(share)
            if group is None:
                group = node.groups[share] = SharedGroup(share, tf)
            old = group._put(sub)
        own = self._clients.get(sub.client_id)
        if own is None:
            own = self._clients[sub.client_id] = {}
        own[sub.topic_filter] = sub
        if old is None:
            self._count += 1
        return old

    def remove(self, client_id: str, topic_filter: str) -> Sub | None:
        """Remove the subscription of ``client_id`` to ``topic_filter`` (as
        subscribed, ``$share`` prefix included); return it, or None when there
        was none. Nodes and shared groups left empty are pruned."""
        own = self._clients.get(client_id)
        if own is None or topic_filter not in own:
            return None
        del own[topic_filter]
        if not own:
            del self._clients[client_id]
            if not self._clients:
                self._clients = {}  # a dict never shrinks: let the table of 10,000 clients go
        return self._unlink(client_id, topic_filter)

    def _unlink(self, client_id: str, topic_filter: str) -> Sub:
        """Take the subscription out of the nodes (it is there); prune."""
        share, tf = split_share(topic_filter)
        levels = tuple(tf.split("/"))
        n = len(levels)
        path: list[tuple[_Node, str]] = []  # (parent, level) of each node on the way
        node = self._root
        i = 0
        while i < n:  # present: own has it, and a filter ends where a node does
            level = levels[i]
            path.append((node, level))
            node = node.child(level)  # type: ignore[assignment]
            seg = node.seg
            i += 1 if seg is None else 1 + len(seg)
        self.version += 1
        if share is None:
            old = node.pop_sub(client_id)
        else:
            group = node.groups[share]  # type: ignore[index]
            old = group._pop(client_id)  # type: ignore[assignment]
            if not group.members:
                del node.groups[share]  # type: ignore[union-attr]
                if not node.groups:
                    node.groups = None
        self._count -= 1
        # Prune from the leaf up while nodes are empty; the first node left
        # may join its one remaining child again (_Node.merge).
        while path and node.empty():
            node, level = path.pop()
            node.drop_child(level)
        if path:
            node.merge()
        return old

    def remove_client(self, client_id: str, defer: bool = False) -> list[Sub]:
        """Remove every subscription of ``client_id``; return them in the order
        first added. ``defer`` (the client's session ended and the router
        forgot it): past :data:`REMOVE_AT_ONCE` subscriptions, the client has
        none from now on (:meth:`get`, :meth:`count`, :meth:`subscriptions`)
        but its ordinary ones leave the nodes in later :meth:`sweep` calls."""
        own = self._clients.get(client_id)
        if own is None:
            return []
        removed = list(own.values())
        if not defer or len(removed) <= REMOVE_AT_ONCE:
            for sub in removed:
                self.remove(client_id, sub.topic_filter)
            return removed
        del self._clients[client_id]
        later = []
        for sub in removed:
            tf = sub.topic_filter
            if tf.startswith(_SHARE) and split_share(tf)[0] is not None:
                self._unlink(client_id, tf)  # a group must never pick a member that is gone
            else:
                later.append(tf)
        later.reverse()  # sweep pops from the end: the first added go first
        self._leaving[client_id] = later
        return removed

    @property
    def leaving(self) -> int:
        """Clients whose ended session's subscriptions :meth:`sweep` has still to remove."""
        return len(self._leaving)

    def sweep(self, max_filters: int = SWEEP_FILTERS, max_bytes: int = SWEEP_FILTER_BYTES) -> bool:
        """Remove up to ``max_filters`` subscriptions of ended sessions (and
        no more once ``max_bytes`` characters of their filters were); True
        while some are left."""
        leaving = self._leaving
        unlink = self._unlink
        spent = 0
        while leaving and max_filters > 0 and spent < max_bytes:
            cid = next(iter(leaving))
            tfs = leaving[cid]
            while tfs and max_filters > 0 and spent < max_bytes:
                tf = tfs.pop()
                unlink(cid, tf)
                max_filters -= 1
                spent += len(tf)
            if not tfs:
                del leaving[cid]
        if not leaving and self._leaving is leaving:
            self._leaving = {}  # a dict never shrinks
        return bool(self._leaving)

    def settle(self, client_id: str) -> None:
        """Remove at once what :meth:`sweep` still had to remove of
        ``client_id``'s ended session (the client is back: the old
        subscriptions must not meet the new session)."""
        tfs = self._leaving.pop(client_id, None)
        if tfs:
            for tf in tfs:
                self._unlink(client_id, tf)

    def subscriptions(self, client_id: str) -> list[Sub]:
        """The subscriptions of ``client_id`` in the order first added."""
        own = self._clients.get(client_id)
        return [] if own is None else list(own.values())

    def count(self, client_id: str) -> int:
        """The number of subscriptions of ``client_id``."""
        own = self._clients.get(client_id)
        return 0 if own is None else len(own)

    def match(self, topic: str) -> Matches:
        """The subscriptions whose filter matches the Topic Name ``topic``.

        Walks the topic's levels once; each node is reached at most once, so
        a subscription appears at most once. ``topic`` is a Topic Name as
        published (not an alias); an empty one or one containing a wildcard
        matches nothing.
        """
        result = Matches()
        result.version = self.version
        if not topic or "+" in topic or "#" in topic:
            return result
        root = self._root
        if root.kids is None:
            return result
        levels = topic.split("/")
        n = len(levels)
        found = result.found
        shared = result.shared

        def collect(node: _Node) -> None:
            subs = node.subs
            if subs is not None:
                found.append(subs)
            if node.groups:
                shared.extend(node.groups.values())

        # Depth first over (node, depth): a node at depth d has matched the
        # topic's first d levels. Each node is reached at most once.
        stack: list[tuple[_Node, int]] = []
        first = levels[0]
        node = root.child(first)
        if node is not None:
            stack.append((node, 1))
        if first[:1] != "$":  # [MQTT-4.7.2-1] no wildcard first level for "$" topics
            node = root.child("+")
            if node is not None:
                stack.append((node, 1))
            node = root.child("#")
            if node is not None:
                collect(node)  # [MQTT-4.7.1-1] "#" alone matches every topic
        while stack:
            node, depth = stack.pop()
            seg = node.seg
            if seg is not None:  # a run of ordinary levels: all must be the topic's next ones
                k = depth + len(seg)
                if tuple(levels[depth:k]) != seg:
                    continue
                depth = k
            if depth == n:
                collect(node)
                if node.kids is not None:
                    # [MQTT-4.7.1-1] "#" matches its parent level: "sport/#" matches "sport".
                    hash_node = node.child("#")
                    if hash_node is not None:
                        collect(hash_node)
                continue
            if node.kids is None:
                continue
            hash_node = node.child("#")
            if hash_node is not None:
                collect(hash_node)
            child = node.child(levels[depth])
            if child is not None:
                stack.append((child, depth + 1))
            child = node.child("+")  # [MQTT-4.7.1-2] one whole level, an empty one too
            if child is not None:
                stack.append((child, depth + 1))
        return result
