"""Wait on a condition with a deadline (never sleep-and-hope)."""

from __future__ import annotations

import time
from typing import Callable

POLL_S = 0.02


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition", poll: float = POLL_S):
    """Poll ``cond`` until it returns a truthy value (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def holds_for(cond: Callable[[], object], seconds: float, what: str = "condition", poll: float = POLL_S) -> None:
    """The negative wait: ``cond`` stays truthy for ``seconds`` (something that
    must not happen does not, within the time it would take), checked every
    ``poll``; fails at the first moment it does not hold, not at the end."""
    deadline = time.monotonic() + seconds
    while True:
        if not cond():
            raise AssertionError(f"no longer true after {seconds - (deadline - time.monotonic()):.2f}s: {what}")
        if time.monotonic() >= deadline:
            return
        time.sleep(poll)
