"""The first rule each frame breaks, tracked for a whole batch at once.

Every check of the vectorised parser is a :class:`Check`: a rule id from
:mod:`bridge.mqtt.rules` (its reason code comes from that table) and a
message, optionally formatted from one integer argument (a property id, a
flag value, a size). :class:`Problems` holds, per row, the first check that
failed (0 = none) and its argument; checks run in the codec's order, and a
row that has failed is excluded from every later check, so the first failure
is the one the scalar codec would raise.

Messages are formatted once per distinct (check, argument) pair, not per row.
Rows decoded by the scalar codec (rare packet types) carry the codec's own
error text, rule and reason code (:meth:`Problems.set_error`).

Runs on executors; numpy and pyarrow only (the rule table is plain data).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from bridge.mqtt.rules import RULES

__all__ = ["Check", "Problems", "check"]


class Check:
    """One check: ``rule`` (an id of ``RULES``) and ``message`` (a str, or a
    callable of the integer argument returning the str)."""

    __slots__ = ("id", "rule", "message", "reason_code")

    def __init__(self, id_: int, rule: str, message: str | Callable[[int], str]) -> None:
        self.id = id_
        self.rule = rule
        self.message = message
        self.reason_code = RULES[rule].reason_code  # KeyError: a rule missing from the table

    def text(self, arg: int) -> str:
        msg = self.message(arg) if callable(self.message) else self.message
        return f"[{self.rule}] {msg}"


_CHECKS: list[Check | None] = [None]


def check(rule: str, message: str | Callable[[int], str]) -> Check:
    """Register a check (at import time of the parser's modules)."""
    c = Check(len(_CHECKS), rule, message)
    _CHECKS.append(c)
    return c


class Problems:
    """Per-row first failure of a batch of ``n`` frames."""

    __slots__ = ("code", "arg", "custom")

    def __init__(self, n: int) -> None:
        self.code = np.zeros(n, dtype=np.int32)
        self.arg = np.zeros(n, dtype=np.int64)
        # row -> (rule, error text, reason code) for rows the scalar codec decoded
        self.custom: dict[int, tuple[str, str, int]] = {}

    def fail(self, rows: np.ndarray, c: Check, arg: np.ndarray | int = 0,
             where: np.ndarray | None = None) -> None:
        """Record ``c`` for ``rows`` (batch row indices; restricted to
        ``where`` when given) that have no failure yet. ``arg`` is one
        integer, or one per row of ``rows``."""
        rows = np.asarray(rows)
        if where is None:
            idx = None
            sel = rows
        else:
            if not where.any():
                return
            idx = np.flatnonzero(where)
            sel = rows[idx]
        free = self.code[sel] == 0
        if not free.all():
            sel = sel[free]
            idx = np.flatnonzero(free) if idx is None else idx[free]
        if len(sel) == 0:
            return
        self.code[sel] = c.id
        if np.ndim(arg):
            arg = np.asarray(arg)
            self.arg[sel] = arg if idx is None else arg[idx]
        else:
            self.arg[sel] = arg

    def set_error(self, row: int, rule: str, text: str, reason_code: int) -> None:
        """Record an error found by the scalar codec for one row."""
        self.code[row] = -1
        self.custom[row] = (rule, text, reason_code)

    def failed(self) -> np.ndarray:
        return self.code != 0

    def columns(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(rule, error, error_code) arrays: null where the row is valid."""
        n = len(self.code)
        key = self.code.astype(np.int64) * (1 << 40) + (self.arg & ((1 << 40) - 1))
        bad = np.flatnonzero(self.code > 0)
        rules: list[str | None] = [None]
        texts: list[str | None] = [None]
        codes: list[int | None] = [None]
        index = np.zeros(n, dtype=np.int32)
        if len(bad):
            uniq, inv = np.unique(key[bad], return_inverse=True)
            for k in uniq.tolist():  # once per distinct (check, argument), not per row
                c = _CHECKS[k >> 40]
                arg = k & ((1 << 40) - 1)
                rules.append(c.rule)
                texts.append(c.text(arg))
                codes.append(c.reason_code)
            index[bad] = inv.reshape(-1).astype(np.int32) + 1
        for row, (rule, text, reason) in self.custom.items():
            # rows decoded by the scalar codec (rare packet types), one entry each
            index[row] = len(rules)
            rules.append(rule)
            texts.append(text)
            codes.append(reason)
        # valid rows are null indices: take writes nothing for them
        idx = pa.Array.from_buffers(pa.int32(), n, [
            pa.py_buffer(np.packbits(index != 0, bitorder="little")), pa.py_buffer(index)])
        return (
            pa.array(rules, type=pa.string()).take(idx),
            pa.array(texts, type=pa.string()).take(idx),
            pa.array(codes, type=pa.int32()).take(idx),
        )
