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
