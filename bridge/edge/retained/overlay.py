"""The retained messages this edge captured after the table version it
serves covers: the overlay that makes the edge exact while the job lags (or
is not running). Pure memory, owned by the event loop.

Each entry is the latest retained PUBLISH (or zero-byte clear: a tombstone)
of one topic, with its capture sequence and position. The job applies the
same rule to the same records (``bridge/tables/retained_rule.py``): a
PUBLISH with RETAIN 1 replaces the topic's message [MQTT-3.3.1-5], with zero
bytes it clears it [MQTT-3.3.1-6, MQTT-3.3.1-7]; RETAIN 0 changes nothing
[MQTT-3.3.1-8 in 5.0 numbering]; the higher capture sequence wins
(:func:`~bridge.tables.retained_rule.supersedes`). Entries are dropped once a
table version covers their capture positions (:meth:`Overlay.drop_covered`).

Topics are kept in a small trie of dicts (the overlay holds what changed
since the job's last batch, not the whole retained set), matched like the
table's index, without a scan of every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from bridge.edge.message import Message
from bridge.tables.retained_order import supersedes

__all__ = ["DROP_BLOCK", "Entry", "Overlay"]

#: entries one step of a drop looks at (about 1 ms)
DROP_BLOCK = 1_000


@dataclass(slots=True)
class Entry:
    """The latest retained PUBLISH of ``topic`` this edge captured: ``msg``
    (None: a zero-byte clear, a tombstone), its capture ``seq`` and
    position ``(partition, offset)``."""

    topic: str
    seq: int
    pos: tuple[int, int]
    msg: Message | None


#: The depth marker of a stack item inside a "#" subtree (see Overlay.match).
_BELOW = -1


class _Node:
    __slots__ = ("kids", "entry")

    def __init__(self) -> None:
        self.kids: dict[str, _Node] | None = None
        self.entry: Entry | None = None


class Overlay:
    """Entries by topic, with a level trie for matching filters."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._root = _Node()
        #: changes so far (a frozen list of the entries is reused while it holds)
        self.version = 0
        #: a drop of covered entries under way: (covered, the entries to look at)
        self._drop: tuple[dict[int, int], list[Entry]] | None = None
        self._drop_pos = 0

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, entry: Entry) -> bool:
        """Take ``entry`` unless the topic holds a newer one; True if taken."""
        old = self.entries.get(entry.topic)
        if old is not None and not supersedes(entry.seq, old.seq):
            return False
        self.entries[entry.topic] = entry
        self.version += 1
        node = self._root
        for lev in entry.topic.split("/"):
            kids = node.kids
            if kids is None:
                kids = node.kids = {}
            nxt = kids.get(lev)
            if nxt is None:
                nxt = kids[lev] = _Node()
            node = nxt
        node.entry = entry
        return True

    def drop_covered(self, covered: dict[int, int]) -> int:
        """Drop the entries whose capture position a table version covers
        (``covered``: partition -> first offset not covered); returns how many."""
        self.begin_drop(covered)
        n = 0
        while self.dropping:
            n += self.drop_step(1 << 30)
        return n

    def begin_drop(self, covered: dict[int, int]) -> None:
        """:meth:`drop_covered` a step at a time (:meth:`drop_step`, one per
        turn of the event loop: a version covering 200,000 entries would
        hold the loop for about half a second). Until the last step, the
        covered entries still serve; they agree with the table's rows (the
        same capture sequence: the table's row wins, ``supersedes``)."""
        self._drop = (covered, list(self.entries.values()))
        self._drop_pos = 0

    @property
    def dropping(self) -> bool:
        return self._drop is not None

    def drop_step(self, n: int = DROP_BLOCK) -> int:
        """Look at up to ``n`` more entries of the drop begun; returns how
        many were dropped."""
        if self._drop is None:
            return 0
        covered, todo = self._drop
        end = min(self._drop_pos + n, len(todo))
        entries = self.entries
        gone = 0
        for i in range(self._drop_pos, end):
            e = todo[i]
            if entries.get(e.topic) is e and e.pos[1] < covered.get(e.pos[0], 0):
                self._remove(e.topic)
                gone += 1
        self._drop_pos = end
        if end >= len(todo):
            self._drop = None
        return gone

    def _remove(self, topic: str) -> None:
        del self.entries[topic]
        self.version += 1
        path = []
        node = self._root
        for lev in topic.split("/"):
            path.append((node, lev))
            node = node.kids[lev]  # type: ignore[index]
        node.entry = None
        for parent, lev in reversed(path):  # prune what is left empty
            child = parent.kids[lev]  # type: ignore[index]
            if child.entry is not None or child.kids:
                break
            del parent.kids[lev]  # type: ignore[union-attr]

    def match(self, topic_filter: str, budget: int | None = None) -> Iterator[Entry] | None:
        """The entries (tombstones too) whose topic ``topic_filter`` matches
        (MQTT 5.0 section 4.7, as ``bridge.edge.retained.index``).

        Depth first with an explicit stack, never recursion: a topic of
        thousands of levels (a retained message captured under a larger
        ``edge.max_topic_levels``, or before there was one) is walked like
        any other [LG-edge-topic-levels]. Order: children in the order
        their topics first came, a node's own entry before its subtree.
        ``budget``: the trie nodes the walk may visit; None when it would
        visit more (the caller scans instead, ``bridge.edge.retained.scan``)."""
        parts = topic_filter.split("/")
        n = len(parts)
        out: list[Entry] = []
        # (node, d): d >= 0, the node matched the filter's first d levels;
        # _BELOW: a node inside the subtree of a "#" (its entry, then its kids).
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        pop = stack.pop
        push = stack.append
        extend = stack.extend
        left = -1 if budget is None else budget
        while stack:
            if not left:
                return None
            left -= 1
            node, d = pop()
            kids = node.kids
            if d == _BELOW:
                if node.entry is not None:
                    out.append(node.entry)
                if kids:
                    extend([(kid, _BELOW) for kid in reversed(kids.values())])
                continue
            if d == n:
                if node.entry is not None:
                    out.append(node.entry)
                continue
            lev = parts[d]
            if lev == "#":  # [MQTT-4.7.1-1]: the parent level too
                if d and node.entry is not None:
                    out.append(node.entry)
                if kids:
                    extend([(kid, _BELOW) for name, kid in reversed(kids.items())
                            if d or name[:1] != "$"])  # [MQTT-4.7.2-1]
                continue
            if not kids:
                continue
            if lev == "+":  # [MQTT-4.7.1-2]
                extend([(kid, d + 1) for name, kid in reversed(kids.items())
                        if d or name[:1] != "$"])  # [MQTT-4.7.2-1]
            else:
                kid = kids.get(lev)
                if kid is not None:
                    push((kid, d + 1))
        return iter(out)
