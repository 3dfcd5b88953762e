"""A compact index of Topic Names by level, for matching Topic Filters
against a large, fixed set of topics (the retained table's). Pure: Arrow and
numpy in, row numbers out.

The topics form a trie, stored per depth as flat arrays rather than Python
objects (a million topics would take hundreds of MB as dicts): at depth
``d`` the nodes are the distinct prefixes of ``d + 1`` levels, sorted by
(parent node, level name), so that

* the children of a node are one contiguous range of the next depth
  (``first``, ``count``), found by ``searchsorted`` when the index is built;
* a literal level is found among a node's children by binary search on the
  names' UTF-8 bytes (kept as one ``bytes`` blob and offsets per depth);
* ``+`` takes every child of every current node (numpy ranges), ``#`` every
  descendant, and a node that ends a Topic Name maps to its row (``leaf``).

Matching follows MQTT 5.0 section 4.7 as ``bridge.topic_filter.matches``
does: ``+`` one whole level, an empty one too [MQTT-4.7.1-2]; ``#`` the
parent level and every level below [MQTT-4.7.1-1]; a filter starting with a
wildcard does not match a topic starting with ``$`` [MQTT-4.7.2-1]; levels
compared byte for byte, no normalisation [MQTT-4.7.3-4]. The work per match
grows with the matched subtree (and a binary search per literal level and
current node), never with the topics that do not match.

Memory: 4 int32 per node (parent, first child, child count, leaf row) plus
the level names' bytes and an int64 offset each; measured in the README
(``Retained messages from the lakehouse``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LevelIndex"]

_EMPTY = np.zeros(0, dtype=np.int64)


class _Depth:
    """The nodes of one depth."""

    __slots__ = ("n", "parent", "first", "count", "leaf", "off", "data", "off_mv")

    def __init__(self, names: pa.StringArray, parent: np.ndarray, leaf: np.ndarray) -> None:
        self.n = len(names)
        self.parent = parent
        self.leaf = leaf
        self.first = np.zeros(self.n, dtype=np.int32)
        self.count = np.zeros(self.n, dtype=np.int32)
        names = pc.cast(names, pa.large_string()) if len(names) else pa.array([], pa.large_string())
        bufs = names.buffers()
        off = np.frombuffer(bufs[1], dtype=np.int64, count=len(names) + 1, offset=names.offset * 8)
        base = int(off[0])
        self.off = (off - base).copy()
        self.data = bufs[2].to_pybytes()[base:base + int(off[-1] - base)] if bufs[2] is not None \
            else b""
        self.off_mv = memoryview(self.off)

    def name(self, k: int) -> bytes:
        o = self.off_mv
        return self.data[o[k]:o[k + 1]]

    def find(self, lo: int, hi: int, key: bytes) -> int:
        """The node named ``key`` in [lo, hi) (names sorted), or -1."""
        o = self.off_mv
        d = self.data
        end = hi
        while lo < hi:
            mid = (lo + hi) >> 1
            if d[o[mid]:o[mid + 1]] < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < end and d[o[lo]:o[lo + 1]] == key else -1


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Every index of the ranges [starts[i], starts[i] + counts[i])."""
    counts = counts.astype(np.int64)
    total = int(counts.sum())
    if total == 0:
        return _EMPTY
    ends = np.cumsum(counts)
    return np.repeat(starts.astype(np.int64) - (ends - counts), counts) + np.arange(total)


class LevelIndex:
    """The topics of ``topics`` (a string array, each topic once) by level;
    :meth:`match` returns the row numbers of the topics a filter matches."""

    def __init__(self, topics) -> None:
        if isinstance(topics, pa.ChunkedArray):
            topics = topics.combine_chunks() if topics.num_chunks else pa.array([], pa.string())
        topics = pc.cast(topics, pa.large_string())
        self.size = len(topics)
        self.depths: list[_Depth] = []
        self._dollar = (0, 0)  # depth 0 nodes whose name starts with "$": [lo, hi)
        if self.size == 0:
            return
        levels = pc.split_pattern(topics, "/")
        lens = pc.list_value_length(levels).to_numpy().astype(np.int64)
        flat = levels.flatten()
        starts = levels.offsets.to_numpy()[:-1].astype(np.int64) - int(levels.offsets[0].as_py())
        node_of = np.zeros(self.size, dtype=np.int64)  # node of each topic at the previous depth
        prev: _Depth | None = None
        for d in range(int(lens.max())):
            rows = np.flatnonzero(lens > d)
            names = flat.take(pa.array(starts[rows] + d))
            parent = node_of[rows] if d else np.zeros(len(rows), dtype=np.int64)
            order = pc.sort_indices(pa.table({"p": parent, "n": names}),
                                    sort_keys=[("p", "ascending"), ("n", "ascending")]).to_numpy()
            p_sorted = parent[order]
            n_sorted = names.take(pa.array(order))
            r_sorted = rows[order]
            new = np.ones(len(order), dtype=bool)
            if len(order) > 1:
                same_name = pc.equal(n_sorted.slice(1), n_sorted.slice(0, len(order) - 1))
                new[1:] = (p_sorted[1:] != p_sorted[:-1]) | ~same_name.to_numpy(
                    zero_copy_only=False)
            node_sorted = np.cumsum(new) - 1
            firsts = np.flatnonzero(new)
            leaf = np.full(len(firsts), -1, dtype=np.int32)
            ends_here = lens[r_sorted] == d + 1
            leaf[node_sorted[ends_here]] = r_sorted[ends_here]
            node_parent = p_sorted[firsts].astype(np.int32)
            depth = _Depth(n_sorted.take(pa.array(firsts)), node_parent, leaf)
            if prev is not None:
                ids = np.arange(prev.n)
                lo = np.searchsorted(node_parent, ids, "left")
                prev.first = lo.astype(np.int32)
                prev.count = (np.searchsorted(node_parent, ids, "right") - lo).astype(np.int32)
            else:
                lo = _lower_bound(depth, b"$")
                hi = _lower_bound(depth, b"%")  # the byte after "$": every name with "$" first
                self._dollar = (lo, hi)
            self.depths.append(depth)
            node_of[r_sorted] = node_sorted
            prev = depth

    # ------------------------------------------------------------ matching
    def _children(self, cur: np.ndarray | None, d: int) -> np.ndarray:
        """Every node at depth ``d`` under the nodes ``cur`` of depth ``d - 1``
        (None: the root, so every node of depth 0)."""
        if d >= len(self.depths):
            return _EMPTY
        if cur is None:
            return np.arange(self.depths[0].n, dtype=np.int64)
        up = self.depths[d - 1]
        return _ranges(up.first[cur], up.count[cur])

    def _no_dollar(self, nodes: np.ndarray) -> np.ndarray:
        lo, hi = self._dollar
        if hi <= lo:
            return nodes
        return nodes[(nodes < lo) | (nodes >= hi)]  # [MQTT-4.7.2-1]

    def match(self, topic_filter: str) -> np.ndarray:
        """Row numbers (int64, unordered) of the topics ``topic_filter``
        matches. The filter is assumed valid (the codec checked it)."""
        if not self.depths:
            return _EMPTY
        parts = topic_filter.split("/")
        cur: np.ndarray | None = None
        for d, lev in enumerate(parts):
            if lev == "#":  # [MQTT-4.7.1-1]
                out = []
                if cur is not None:
                    out.append(self.depths[d - 1].leaf[cur])  # "sport/#" matches "sport"
                nodes = self._children(cur, d)
                if d == 0:
                    nodes = self._no_dollar(nodes)
                while nodes.size:
                    out.append(self.depths[d].leaf[nodes])
                    d += 1
                    nodes = self._children(nodes, d)
                rows = np.concatenate(out) if out else _EMPTY
                return rows[rows >= 0].astype(np.int64)
            if d >= len(self.depths):
                return _EMPTY
            if lev == "+":  # [MQTT-4.7.1-2]
                nodes = self._children(cur, d)
                if d == 0:
                    nodes = self._no_dollar(nodes)
            else:
                key = lev.encode()
                depth = self.depths[d]
                if cur is None:
                    k = depth.find(0, depth.n, key)
                    nodes = np.array([k], dtype=np.int64) if k >= 0 else _EMPTY
                else:
                    up = self.depths[d - 1]
                    first = up.first
                    count = up.count
                    found = []
                    for p in cur.tolist():
                        lo = int(first[p])
                        k = depth.find(lo, lo + int(count[p]), key)
                        if k >= 0:
                            found.append(k)
                    nodes = np.array(found, dtype=np.int64)
            if nodes.size == 0:
                return _EMPTY
            cur = nodes
        rows = self.depths[len(parts) - 1].leaf[cur]
        return rows[rows >= 0].astype(np.int64)

    def nbytes(self) -> int:
        """Bytes the index holds (arrays and names)."""
        return sum(x.parent.nbytes + x.first.nbytes + x.count.nbytes + x.leaf.nbytes
                   + x.off.nbytes + len(x.data) for x in self.depths)


def _lower_bound(depth: _Depth, key: bytes) -> int:
    lo, hi = 0, depth.n
    while lo < hi:
        mid = (lo + hi) >> 1
        if depth.name(mid) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo
