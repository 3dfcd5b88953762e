"""A large retained replay's overlay part, matched a block at a time. Sans-IO.

:meth:`~bridge.edge.retained.store.RetainedStore.replay` walks the overlay's
trie at once while the walk is small (:data:`EAGER_NODES`). Past that (a
subscription to ``#`` over 200,000 topics the job has not folded into the
table yet: 0.2 s of the event loop, every other client waiting), it keeps a
frozen list of the overlay's entries as they were at the SUBSCRIBE (one
C-level copy of references, about 1 ms for 200,000) and an
:class:`OverlayScan` matches them :data:`SCAN_BLOCK` at a time as the
replay is sent (:meth:`~bridge.edge.retained.replay.Replay.take`).

What it serves is the state at the SUBSCRIBE, as the eager walk does: an
entry replaced later is served as it was (the newer message reaches the
subscriber live, behind the replay), one the job folded into a newer table
version meanwhile is served from the list (the replay's table version is
the one it started with). The rule between an entry and a table row of the
same topic is the job's (:func:`~bridge.tables.retained_order.supersedes`):
a row an entry supersedes is left out of the replay (``hidden``), an entry
a row supersedes is not served.
"""

from __future__ import annotations

from bridge.edge.message import Message
from bridge.edge.retained.overlay import Entry
from bridge.tables.retained_order import supersedes

__all__ = ["EAGER_NODES", "SCAN_BLOCK", "OverlayScan", "filter_matcher"]

#: trie nodes a replay walks at once before it falls back to a scan
EAGER_NODES = 2_000
#: overlay entries one scan step looks at (about 0.5 ms; more where the
#: table holds some of their topics: a look-up each)
SCAN_BLOCK = 512


def filter_matcher(topic_filter: str):
    """``match(topic) -> bool`` for one valid Topic Filter (MQTT 5.0
    section 4.7: ``+`` one level [MQTT-4.7.1-2], ``#`` the parent level
    and every level below [MQTT-4.7.1-1], no wildcard first level for a
    topic starting with ``$`` [MQTT-4.7.2-1]), compiled once per replay."""
    parts = topic_filter.split("/")
    wild_first = parts[0] in ("+", "#")
    if topic_filter == "#":
        return lambda topic: topic[:1] != "$"
    if parts[-1] == "#" and "+" not in topic_filter:
        prefix = topic_filter[:-2]  # "a/b/#": "a/b" and everything under "a/b/"
        below = prefix + "/"
        return lambda topic: topic == prefix or topic.startswith(below)
    if "+" not in topic_filter and "#" not in topic_filter:
        return lambda topic: topic == topic_filter
    hash_at = len(parts) - 1 if parts[-1] == "#" else -1
    n = len(parts)

    def match(topic: str) -> bool:
        if wild_first and topic[:1] == "$":
            return False
        levels = topic.split("/")
        if hash_at >= 0:
            if len(levels) < hash_at:
                return False
        elif len(levels) != n:
            return False
        for i, f in enumerate(parts):
            if i == hash_at:
                return True
            if f != "+" and f != levels[i]:
                return False
        return True

    return match


class OverlayScan:
    """The overlay entries a filter matches, from a frozen list, found a
    block at a time (see the module docstring). ``snapshot``: the table
    version the replay serves (None: no table); ``now``: the server's clock
    at the SUBSCRIBE (expiry [MQTT-3.3.2-5])."""

    __slots__ = ("entries", "pos", "match", "snapshot", "now", "hidden")

    def __init__(self, entries: list[Entry], topic_filter: str, snapshot, now: float) -> None:
        self.entries = entries
        self.pos = 0
        self.match = filter_matcher(topic_filter)
        self.snapshot = snapshot
        self.now = now
        #: table rows an entry superseded (the replay leaves them out)
        self.hidden: list[int] = []

    @property
    def done(self) -> bool:
        return self.pos >= len(self.entries)

    def step(self, n: int = SCAN_BLOCK) -> list[Message]:
        """The messages to serve among the next ``n`` entries."""
        entries = self.entries
        end = min(self.pos + n, len(entries))
        match = self.match
        snap = self.snapshot
        now = self.now
        out: list[Message] = []
        for i in range(self.pos, end):
            e = entries[i]
            if not match(e.topic):
                continue
            if snap is not None:
                r = snap.row_of(e.topic)
                if r >= 0:
                    if not supersedes(e.seq, int(snap.seq[r])):
                        continue  # the table holds a newer state of the topic
                    self.hidden.append(r)
            msg = e.msg
            if msg is not None:  # (None: a clear [MQTT-3.3.1-6])
                left = msg.remaining(now)
                if left is None or left > 0:  # [MQTT-3.3.2-5]
                    out.append(msg)
        self.pos = end
        if end >= len(entries):
            self.entries = []  # let the frozen list go
            self.pos = 0
        return out
