"""Named crash points for deterministic recovery tests.

``failpoint("after-tables-commit")`` kills the current process with SIGKILL
when the environment variable ``LAKEGATE_FAILPOINTS`` lists that name
(comma separated; ``name@N`` fires only when ``n`` equals N, e.g. a batch id).
Unset in production: the check is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["failpoint"]


def failpoint(name: str, n: int | None = None) -> None:
    spec = os.environ.get("LAKEGATE_FAILPOINTS")
    if not spec:
        return
    for item in spec.split(","):
        item = item.strip()
        want, _, at = item.partition("@")
        if want == name and (not at or (n is not None and int(at) == n)):
            os.kill(os.getpid(), signal.SIGKILL)
