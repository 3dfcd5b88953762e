"""Vectorised MQTT 5 property blocks, driven by the codec's property table.

:func:`walk_properties` reads the Property Length and the properties of many
rows at once. It iterates over property *positions*, not rows: step k
handles the k-th property of every row that still has properties left (and
has not failed), so the number of steps is the largest number of properties
in one row (0-4 in practice), each step a handful of numpy operations over
the rows still walking.

The checks are those of :func:`bridge.mqtt.properties.decode_properties`,
and a row's first failure is the codec's: identifier (Variable Byte
Integer) -> unknown [LG-property-unknown] -> not allowed in the packet
[LG-property-not-allowed] -> value read (running past the block
[LG-truncated], strings' UTF-8 rules) -> value constraints
[LG-property-value, MQTT-3.3.2-8, MQTT-3.3.2-14] -> repetition of a
single-valued property [LG-property-duplicate]. Each step applies them in
this order, except the strings' UTF-8 rules and the Response Topic's
wildcard check: those run once for the whole batch after the walk, on the
arrays that become the output columns, and a row's earliest bad string
replaces whatever the walk recorded for that row later
(:func:`_check_strings`). One copy of the strings instead of two, and one
check per kind of string instead of one per step.

The table (:data:`bridge.mqtt.properties.PROPERTIES`: wire type, allowed
packets, repeatable) and the value-constraint sets are the codec's own.

Runs on executors; numpy and pyarrow only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bridge.mqtt.fixed_header import PacketType
# The codec's value constraints (0/1 bytes, non-zero integers): imported, not
# re-typed, so the two parsers cannot drift apart.
from bridge.mqtt.properties import _BOOLEAN_BYTES, _NON_ZERO  # noqa: PLC2701 -- see above
from bridge.mqtt.properties import PROPERTIES, Scope, WireType
from bridge.parse import utf8
from bridge.parse.buffers import read_u16, read_u32, take_range_pairs, take_ranges, value_buffers
from bridge.parse.problems import Problems, check
from bridge.parse.varint import NOT_MINIMAL, OK, SHORT, TOO_LONG, decode_varints

__all__ = ["PropertyBlock", "SCOPES", "walk_properties"]

#: Scopes by index (the ``scope`` argument of :func:`walk_properties`).
SCOPES: tuple[Scope, ...] = tuple(Scope)
_SCOPE_INDEX = {s: i for i, s in enumerate(SCOPES)}

# wire codes
_BYTE, _TWO, _FOUR, _VBI, _STR, _BIN, _PAIR = range(7)
_WIRE_CODE = {
    WireType.BYTE: _BYTE, WireType.TWO_BYTE_INTEGER: _TWO, WireType.FOUR_BYTE_INTEGER: _FOUR,
    WireType.VARIABLE_BYTE_INTEGER: _VBI, WireType.UTF8_STRING: _STR,
    WireType.BINARY_DATA: _BIN, WireType.UTF8_STRING_PAIR: _PAIR,
}
_NIDS = max(PROPERTIES) + 1  # identifiers are below this (0x2B in MQTT 5)
_WIRE = np.full(_NIDS, -1, dtype=np.int8)
_ALLOWED = np.zeros((len(SCOPES), _NIDS), dtype=bool)
_REPEAT = np.zeros((len(SCOPES), _NIDS), dtype=bool)
for _pid, _spec in PROPERTIES.items():
    _WIRE[_pid] = _WIRE_CODE[_spec.wire]
    for _s in _spec.packets:
        _ALLOWED[_SCOPE_INDEX[_s], _pid] = True
    for _s in _spec.may_repeat:
        _REPEAT[_SCOPE_INDEX[_s], _pid] = True
# the same tables with one more identifier, _NIDS, standing for "unknown"
_WIRE_X = np.append(_WIRE, np.int8(-1))
_ALLOWED_X = np.concatenate([_ALLOWED, np.zeros((len(SCOPES), 1), dtype=bool)], axis=1)
_REPEAT_X = np.concatenate([_REPEAT, np.zeros((len(SCOPES), 1), dtype=bool)], axis=1)
_IS_BOOL = np.zeros(_NIDS + 1, dtype=bool)
_IS_BOOL[list(_BOOLEAN_BYTES)] = True
_IS_NONZERO = np.zeros(_NIDS + 1, dtype=bool)
_IS_NONZERO[list(_NON_ZERO)] = True
USER_PROPERTY, SUBSCRIPTION_IDENTIFIER, TOPIC_ALIAS, RESPONSE_TOPIC = 0x26, 0x0B, 0x23, 0x08

# The walk treats the one Variable Byte Integer property as the Subscription
# Identifier and the one String Pair as the User Property; say so loudly if a
# change of the codec's table breaks that.
for _wire, _only in ((WireType.VARIABLE_BYTE_INTEGER, SUBSCRIPTION_IDENTIFIER),
                     (WireType.UTF8_STRING_PAIR, USER_PROPERTY)):
    if {p for p, sp in PROPERTIES.items() if sp.wire is _wire} != {_only}:
        raise RuntimeError(f"bridge.parse.properties expects 0x{_only:02X} to be the only "
                           f"{_wire.value} property")

_TYPE_NAMES = {int(t): t.name for t in PacketType}


def _pt(arg: int) -> str:
    return _TYPE_NAMES.get(arg >> 32, "packet")


def _name(pid: int) -> str:
    spec = PROPERTIES.get(pid)
    return spec.name if spec else f"property 0x{pid:02X}"


# Checks, in the codec's order. Arguments pack (packet type << 32) | detail.
PL_SHORT = check("LG-truncated", lambda a: f"{_pt(a)} ends before the Property Length")
PL_TOO_LONG = check("LG-varint-length", lambda a: f"{_pt(a)} Property Length is longer than four bytes")
PL_NOT_MINIMAL = check("MQTT-1.5.5-1", lambda a: f"{_pt(a)} Property Length is not minimally encoded")
PL_PAST_END = check("LG-truncated", lambda a: f"{_pt(a)} Property Length {a & 0xFFFFFFFF} runs past "
                    "the end of the packet")
ID_SHORT = check("LG-truncated", lambda a: f"{_pt(a)} ends before the property identifier")
ID_TOO_LONG = check("LG-varint-length",
                    lambda a: f"{_pt(a)} property identifier is longer than four bytes")
ID_NOT_MINIMAL = check("MQTT-1.5.5-1",
                       lambda a: f"{_pt(a)} property identifier is not minimally encoded")
UNKNOWN = check("LG-property-unknown",
                lambda a: f"{_pt(a)} has unknown property identifier 0x{a & 0xFFFFFFFF:02X}")
NOT_ALLOWED = check("LG-property-not-allowed",
                    lambda a: f"{_name((a >> 8) & 0xFF)} (0x{(a >> 8) & 0xFF:02X}) is not allowed "
                    f"in {SCOPES[a & 0xFF].value}")
VALUE_SHORT = check("LG-truncated", lambda a: f"{_pt(a)} ends before the "
                    f"{_name(a & 0xFF)}{' value' if _WIRE[a & 0xFF] in (_BYTE, _TWO, _FOUR) else ''}")
VALUE_PAST_END = check("LG-truncated", lambda a: f"{_pt(a)} {_name(a & 0xFF)} runs past the end")
VALUE_TOO_LONG = check("LG-varint-length",
                       lambda a: f"{_pt(a)} {_name(a & 0xFF)} is longer than four bytes")
VALUE_NOT_MINIMAL = check("MQTT-1.5.5-1",
                          lambda a: f"{_pt(a)} {_name(a & 0xFF)} is not minimally encoded")
PAIR_KEY_SHORT = check("LG-truncated", lambda a: f"{_pt(a)} ends before the User Property name")
PAIR_KEY_PAST_END = check("LG-truncated",
                          lambda a: f"{_pt(a)} User Property name runs past the end")
PAIR_VALUE_SHORT = check("LG-truncated", lambda a: f"{_pt(a)} ends before the User Property value")
PAIR_VALUE_PAST_END = check("LG-truncated",
                            lambda a: f"{_pt(a)} User Property value runs past the end")
STR_ILL = check("MQTT-1.5.4-1", lambda a: f"{_name(a & 0xFF)} is not well-formed UTF-8")
STR_NUL = check("MQTT-1.5.4-2", lambda a: f"{_name(a & 0xFF)} contains U+0000")
STR_DISALLOWED = check("LG-utf8-disallowed",
                       lambda a: f"{_name(a & 0xFF)} contains a disallowed code point")
PAIR_ILL = check("MQTT-1.5.7-1", lambda a: f"User Property {('name', 'value')[a & 1]} is not "
                 "well-formed UTF-8")
PAIR_NUL = check("MQTT-1.5.7-1", lambda a: f"User Property {('name', 'value')[a & 1]} contains U+0000")
PAIR_DISALLOWED = check("LG-utf8-disallowed", lambda a: f"User Property {('name', 'value')[a & 1]} "
                        "contains a disallowed code point")
NOT_BOOL = check("LG-property-value", lambda a: f"{_name(a & 0xFF)} is {(a >> 8) & 0xFF}, not 0 or 1")
ZERO = check("LG-property-value", lambda a: f"{_name(a & 0xFF)} is 0")
ALIAS_ZERO = check("MQTT-3.3.2-8", "PUBLISH has Topic Alias 0")
RESPONSE_WILDCARD = check("MQTT-3.3.2-14", "Response Topic contains a wildcard character")
DUPLICATE = check("LG-property-duplicate", lambda a: f"{_name(a & 0xFF)} appears more than once "
                  f"in {SCOPES[(a >> 8) & 0xFF].value}")


class PropertyBlock:
    """What :func:`walk_properties` found, for ``m`` rows.

    * ``end``: position after the block (meaningful where the row has not failed);
    * ``numbers``: pid -> (present bool[m], value int64[m]) for the single-valued
      integer properties;
    * ``ranges``: pid -> (rows, start, length), int64 arrays over the rows
      that have the single-valued string or binary property, in row order
      (positions in ``data``), and ``steps``: pid -> the step (property
      position) each was read at;
    * ``values``: pid -> the values of ``ranges[pid]`` cut from ``data``, one
      ``binary`` array in the same order (the UTF-8 strings were checked on
      this very array; the output column shares its bytes);
    * ``user``: (row, key start, key length, value start, value length), each an
      int64 array, ordered by row then wire order, and ``user_keys`` /
      ``user_values``: the keys and values as ``string`` arrays in that order;
    * ``subids``: (row, value) in the same order.
    """

    __slots__ = ("end", "numbers", "ranges", "steps", "values", "user", "user_step",
                 "user_keys", "user_values", "subids")

    def __init__(self, m: int) -> None:
        self.end = np.zeros(m, dtype=np.int64)
        self.numbers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.ranges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.steps: dict[int, np.ndarray] = {}
        self.values: dict[int, pa.BinaryArray] = {}
        empty = np.zeros(0, dtype=np.int64)
        self.user = (empty, empty, empty, empty, empty)
        self.user_step = empty
        self.user_keys = self.user_values = pa.array([], type=pa.string())
        self.subids = (empty, empty)

    def store(self, m: int, parts: list[tuple[np.ndarray, ...]]) -> None:
        """Fill ``numbers``, ``ranges`` and ``steps`` from the walk's
        single-valued properties: (local row, identifier, step, value,
        start, length) per step, each row and identifier at most once."""
        if not parts:
            return
        lr, pid, step, value, start, length = (np.concatenate(c) for c in zip(*parts))
        for q in np.flatnonzero(np.bincount(pid)).tolist():  # once per identifier present
            w = np.flatnonzero(pid == q)
            at = lr[w]
            present = np.zeros(m, dtype=bool)
            present[at] = True
            if _WIRE[q] in (_STR, _BIN):
                # in row order: spread over the rows, then read back where present
                st, ln, sp = (np.zeros(m, dtype=np.int64) for _ in range(3))
                st[at], ln[at], sp[at] = start[w], length[w], step[w]
                rows = np.flatnonzero(present)
                self.ranges[q] = (rows, st[rows], ln[rows])
                self.steps[q] = sp[rows]
            else:
                vals = np.zeros(m, dtype=np.int64)
                vals[at] = value[w]
                self.numbers[q] = (present, vals)


def walk_properties(problems: Problems, data: np.ndarray, rows: np.ndarray,
                    pos: np.ndarray, limit: np.ndarray, scope: np.ndarray,
                    ptype: np.ndarray) -> PropertyBlock:
    """Read the property blocks starting at ``pos`` (the Property Length) of
    the batch rows ``rows``, bounded by ``limit`` (the packet end).

    ``scope`` is the index in :data:`SCOPES` of each row's block and
    ``ptype`` its packet type (for messages). Failures go to ``problems``
    (batch rows); the returned block's values are meaningful only for rows
    that did not fail.

    The UTF-8 rules of the strings (and the Response Topic's wildcards) are
    checked once for the whole batch after the walk, on the arrays that also
    become the output columns (:func:`_check_strings`): the walk records at
    which step each string was read, and a row's earliest bad string takes
    the place of whatever later failure the walk recorded for it, exactly
    as if the walk had stopped there.
    """
    m = len(rows)
    block = PropertyBlock(m)
    if m == 0:
        return block
    tagp = ptype.astype(np.int64) << 32
    length, cur, st = decode_varints(data, pos, limit)
    problems.fail(rows, PL_SHORT, tagp, st == SHORT)
    problems.fail(rows, PL_TOO_LONG, tagp, st == TOO_LONG)
    problems.fail(rows, PL_NOT_MINIMAL, tagp, st == NOT_MINIMAL)
    bend = cur + length
    problems.fail(rows, PL_PAST_END, tagp | length, (st == OK) & (bend > limit))
    block.end[:] = np.where(st == OK, bend, 0)
    seen = np.zeros(m, dtype=np.int64)     # bit per single-valued identifier seen
    nsub = np.zeros(m, dtype=np.int64)     # subscription identifiers seen
    user_parts: list[tuple[np.ndarray, ...]] = []
    sub_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    orphans: list[tuple[np.ndarray, ...]] = []
    singles: list[tuple[np.ndarray, ...]] = []
    step = 0
    alive = np.flatnonzero((problems.code[rows] == 0) & (cur < bend))
    while len(alive):
        _step(problems, data, rows, alive, cur, bend, scope, tagp, seen, nsub, singles,
              user_parts, sub_parts, orphans, step)
        alive = alive[(problems.code[rows[alive]] == 0) & (cur[alive] < bend[alive])]
        step += 1
    if user_parts:
        cols = [np.concatenate(c) for c in zip(*user_parts)]
        order = np.lexsort((cols[5], cols[0]))
        block.user = tuple(c[order] for c in cols[:5])
        block.user_step = cols[5][order]
    if sub_parts:
        cols = [np.concatenate(c) for c in zip(*sub_parts)]
        order = np.lexsort((cols[2], cols[0]))
        block.subids = (cols[0][order], cols[1][order])
    block.store(m, singles)
    _check_strings(problems, data, rows, tagp, block, orphans)
    return block


# what a string's status becomes: UTF-8 status (utf8.ILL_FORMED, NUL,
# DISALLOWED), then _WILDCARD for a Response Topic
_WILDCARD = 4
_STRING_CHECKS = (None, STR_ILL, STR_NUL, STR_DISALLOWED, RESPONSE_WILDCARD)
_PAIR_CHECKS = (None, PAIR_ILL, PAIR_NUL, PAIR_DISALLOWED)
_KEY, _VALUE = 0, 1  # the pair's part, in a pair check's argument


def _check_strings(problems: Problems, data: np.ndarray, rows: np.ndarray, tagp: np.ndarray,
                   block: PropertyBlock, orphans: list) -> None:
    """The UTF-8 rules of every string the walk read, in one pass per kind.

    Each single-valued string and binary property becomes one ``binary``
    array of the rows that have it (``block.values``, whose bytes the output
    column shares), and the User Property keys and values one ``string``
    array each (one copy for both); the strings are checked on those
    arrays. Strings that the walk read but did not store (a repeated
    property, a name whose value is cut off: the "orphans") are checked on
    their own.

    A bad string at step k (time 2k, or 2k+1 for a User Property value)
    fails its row with the string's check, replacing what the walk recorded
    for the row: the walk only records failures from that point on, since a
    row stops walking at its first failure and its strings are read before
    anything after them is checked. The Response Topic's wildcard check
    [MQTT-3.3.2-14] comes right after its UTF-8 rules, as in the codec."""
    buf = pa.py_buffer(data)
    bad: list[tuple[np.ndarray, ...]] = []  # (local row, time, check id, argument)

    def found(lr, time, status, checks, arg) -> None:
        w = np.flatnonzero(status)
        if len(w):
            ids = np.array([c.id for c in checks[1:]], dtype=np.int32)[status[w] - 1]
            bad.append((lr[w], time[w], ids, arg[w]))

    for pid, (lr, start, length) in block.ranges.items():
        arr = take_ranges(buf, data, start, length)
        block.values[pid] = arr
        if _WIRE[pid] != _STR:
            continue
        status = utf8.string_status(arr)
        if pid == RESPONSE_TOPIC:
            wild = utf8.has_wildcard(*value_buffers(arr))
            status = np.where((status == 0) & wild, np.int8(_WILDCARD), status)
        found(lr, 2 * block.steps[pid], status, _STRING_CHECKS, tagp[lr] | pid)
    if len(block.user[0]):
        lr, ks, kl, vs, vl = block.user
        keys, values = take_range_pairs(buf, data, ks, kl, vs, vl)
        block.user_keys, block.user_values = keys.view(pa.string()), values.view(pa.string())
        t = 2 * block.user_step
        found(lr, t, utf8.string_status(block.user_keys), _PAIR_CHECKS, tagp[lr] | _KEY)
        found(lr, t + 1, utf8.string_status(block.user_values), _PAIR_CHECKS,
              tagp[lr] | _VALUE)
    if orphans:  # rare: only in frames that break a rule anyway
        lr, start, length, time, pid, pair = (np.concatenate(c) for c in zip(*orphans))
        status = utf8.range_status(data, start, length)
        rt = (pid == RESPONSE_TOPIC) & ~pair & (status == 0)
        if rt.any():
            wild = utf8.range_has_wildcard(data, start[rt], length[rt])
            status[np.flatnonzero(rt)[wild]] = _WILDCARD
        single = ~pair
        found(lr[single], time[single], status[single], _STRING_CHECKS,
              tagp[lr[single]] | pid[single])
        found(lr[pair], time[pair], status[pair], _PAIR_CHECKS, tagp[lr[pair]] | _KEY)
    if not bad:
        return
    lr, time, ids, arg = (np.concatenate(c) for c in zip(*bad))
    order = np.lexsort((time, lr))
    lr, ids, arg = lr[order], ids[order], arg[order]
    first = np.flatnonzero(np.r_[True, lr[1:] != lr[:-1]])  # each row's earliest
    br = rows[lr[first]]
    problems.code[br] = ids[first]
    problems.arg[br] = np.where(ids[first] == RESPONSE_WILDCARD.id, 0, arg[first])


def _step(problems: Problems, data, rows, r, cur, bend, scope, tagp, seen, nsub, singles,
          user_parts, sub_parts, orphans, step) -> None:
    """The ``step``-th property of the rows ``r`` (local indices): every
    check of one iteration of the codec's property loop, in its order --
    except the UTF-8 rules of the strings and the Response Topic's wildcard
    check, which :func:`_check_strings` applies afterwards (strings read
    but not stored go to ``orphans``). Rows are grouped by wire type so
    that each group's reads and checks -- up to the repetition check and the
    storing of the value -- touch only its own rows. Advances ``cur`` for
    the rows that pass."""
    brow = rows[r]
    end = bend[r]
    sc = scope[r]
    tp = tagp[r]
    pid, at, st = decode_varints(data, cur[r], end)
    ok = st == OK
    if not ok.all():
        problems.fail(brow, ID_SHORT, tp, st == SHORT)
        problems.fail(brow, ID_TOO_LONG, tp, st == TOO_LONG)
        problems.fail(brow, ID_NOT_MINIMAL, tp, st == NOT_MINIMAL)
    pidc = np.where(ok & (pid < _NIDS), pid, _NIDS)  # _NIDS: the "unknown" column
    wire = _WIRE_X[pidc]
    bad = ok & (wire < 0)
    if bad.any():
        problems.fail(brow, UNKNOWN, tp | (pid & 0xFFFFFFFF), bad)
        ok &= ~bad
    bad = ok & ~_ALLOWED_X[sc, pidc]
    if bad.any():
        problems.fail(brow, NOT_ALLOWED, (pidc << 8) | sc, bad)
        ok &= ~bad
    wire = np.where(ok, wire, np.int8(-1))

    def drop(g: np.ndarray, c, arg) -> np.ndarray:
        """Fail the rows ``g`` (indices into r, all clean so far) with ``c``."""
        if len(g):
            problems.code[brow[g]] = c.id
            problems.arg[brow[g]] = arg if np.isscalar(arg) else np.asarray(arg)
        return g

    def orphan(g, start, length, p, pair: bool) -> None:
        """Strings read at this step but not stored: checked afterwards."""
        if len(g):
            k = len(g)
            orphans.append((r[g], start, length, np.full(k, 2 * step, dtype=np.int64), p,
                            np.full(k, pair)))

    def single(g, p, nxt, value=None, start=None, length=None) -> None:
        """Repetition check, then store a single-valued property and advance."""
        bit = np.left_shift(np.int64(1), p)
        lr = r[g]
        dup = (seen[lr] & bit) != 0
        if dup.any():
            drop(g[dup], DUPLICATE, (sc[g[dup]] << 8) | p[dup])
            keep = ~dup
            if value is not None:
                value = value[keep]
            else:
                s = np.flatnonzero(dup)[_WIRE[p[dup]] == _STR]  # binary data: no rules
                orphan(g[s], start[s], length[s], p[s], False)
                start, length = start[keep], length[keep]
            g, p, nxt, lr, bit = g[keep], p[keep], nxt[keep], lr[keep], bit[keep]
        seen[lr] |= bit
        cur[lr] = nxt
        k = len(lr)
        if k:
            zero = np.zeros(k, dtype=np.int64)
            singles.append((lr, p, np.full(k, step, dtype=np.int64),
                            zero if value is None else value,
                            zero if start is None else start, zero if length is None else length))

    order = np.argsort(wire, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount((wire + 1).astype(np.intp), minlength=8))))
    for code in range(7):
        g = order[bounds[code + 1]:bounds[code + 2]]
        if len(g) == 0:
            continue
        a, e, p = at[g], end[g], pidc[g]
        if code in (_BYTE, _TWO, _FOUR):
            size = 1 if code == _BYTE else 2 if code == _TWO else 4
            short = a + size > e
            if short.any():
                drop(g[short], VALUE_SHORT, tp[g[short]] | p[short])
                keep = ~short
                g, a, p = g[keep], a[keep], p[keep]
            v = (data[a].astype(np.int64) if code == _BYTE else
                 read_u16(data, a) if code == _TWO else read_u32(data, a))
            if code == _BYTE:
                bad = _IS_BOOL[p] & (v > 1)
                drop(g[bad], NOT_BOOL, ((v[bad] & 0xFF) << 8) | p[bad])
            else:
                bad = _IS_NONZERO[p] & (v == 0)
                drop(g[bad], ZERO, p[bad])
                if code == _TWO:
                    z = (p == TOPIC_ALIAS) & (v == 0)
                    drop(g[z], ALIAS_ZERO, 0)
                    bad |= z
            if bad.any():
                keep = ~bad
                g, a, p, v = g[keep], a[keep], p[keep], v[keep]
            single(g, p, a + size, value=v)
        elif code == _VBI:  # Subscription Identifier, the only one
            v, nx, vst = decode_varints(data, a, e)
            for s_code, c in ((SHORT, VALUE_SHORT), (TOO_LONG, VALUE_TOO_LONG),
                              (NOT_MINIMAL, VALUE_NOT_MINIMAL)):
                w = vst == s_code
                drop(g[w], c, tp[g[w]] | p[w])
            fine = (vst == OK) & ~(_IS_NONZERO[p] & (v == 0))
            zero = (vst == OK) & ~fine
            drop(g[zero], ZERO, p[zero])
            g, v, nx, p = g[fine], v[fine], nx[fine], p[fine]
            lr = r[g]
            dup = (nsub[lr] > 0) & ~_REPEAT_X[sc[g], p]
            drop(g[dup], DUPLICATE, (sc[g[dup]] << 8) | p[dup])
            keep = ~dup
            g, v, nx, lr = g[keep], v[keep], nx[keep], lr[keep]
            nsub[lr] += 1
            cur[lr] = nx
            sub_parts.append((lr, v, np.full(len(g), step, dtype=np.int64)))
        else:  # length-prefixed: UTF-8 string, binary data, string pair
            pair = code == _PAIR
            short = a + 2 > e
            if short.any():
                if pair:
                    drop(g[short], PAIR_KEY_SHORT, tp[g[short]])
                else:
                    drop(g[short], VALUE_SHORT, tp[g[short]] | p[short])
                keep = ~short
                g, a, e, p = g[keep], a[keep], e[keep], p[keep]
            ln = read_u16(data, a)
            s0 = a + 2
            past = s0 + ln > e
            if past.any():
                if pair:
                    drop(g[past], PAIR_KEY_PAST_END, tp[g[past]])
                else:
                    drop(g[past], VALUE_PAST_END, tp[g[past]] | p[past])
                keep = ~past
                g, s0, ln, e, p = g[keep], s0[keep], ln[keep], e[keep], p[keep]
            if not pair:  # UTF-8 rules and the Response Topic's wildcards: afterwards
                single(g, p, s0 + ln, start=s0, length=ln)
                continue
            # the value of the pair
            a2 = s0 + ln
            short = a2 + 2 > e
            drop(g[short], PAIR_VALUE_SHORT, tp[g[short]])
            l2 = np.zeros(len(g), dtype=np.int64)
            l2[~short] = read_u16(data, a2[~short])
            s2 = a2 + 2
            past = ~short & (s2 + l2 > e)
            drop(g[past], PAIR_VALUE_PAST_END, tp[g[past]])
            cut = short | past
            if cut.any():
                orphan(g[cut], s0[cut], ln[cut], p[cut], True)
                keep = ~cut
                g, s0, ln, s2, l2 = g[keep], s0[keep], ln[keep], s2[keep], l2[keep]
            cur[r[g]] = s2 + l2
            user_parts.append((r[g], s0, ln, s2, l2, np.full(len(g), step, dtype=np.int64)))
