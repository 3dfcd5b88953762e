"""The root cause of a Spark streaming failure, in one line (the job's
start and failure logs, the progress listener's status)."""

from __future__ import annotations

import re

__all__ = ["root_cause"]

_CAUSE = re.compile(r"^((?:bridge|proton|deltalake)\.[\w.]+|[A-Z]\w*(?:Error|Exception)): (.+)$")


def root_cause(text: str) -> str:
    """The innermost lakegate/library error line of a Spark streaming failure
    (Spark wraps a foreachBatch error in several layers of Py4J and JVM text)."""
    lines = [ln.strip() for ln in text.splitlines()]
    for line in reversed(lines):
        m = _CAUSE.match(line)
        if m and not m.group(1).startswith(("py4j", "pyspark")):
            return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    return lines[0] if lines else "unknown error"
