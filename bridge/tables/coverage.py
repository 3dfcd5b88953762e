"""Which capture records a ``retained`` table version reflects.

With each retained MERGE the job records, in the commit's ``userMetadata``
(Delta's commit info field for it; ``DESCRIBE HISTORY`` and
``lakegate sql`` show it), the capture stream and, per partition, the first
offset the table does **not** yet reflect::

    {"lakegate": {"stream": "mqtt-frames", "capture_offsets": {"0": 1200, "1": 0},
                  "query": "<query id>", "batch": 17}}

Every record of that stream below those offsets is in the version (and in
every later one): the job processes a partition's records in offset order,
batch after batch, and each batch commits the table (an empty MERGE still
commits its app transaction). The offsets are a lower bound: the batch's
highest offset seen per partition plus one, carried from the previous
version for a partition the batch had no row of. The edge serves that
version overlaid with what it captured from there on
(``bridge/edge/retained``). Several edges writing separate streams into one
lake each find their own stream's entry in the newest commit that has one.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping

__all__ = ["coverage_entry", "coverage_metadata", "covered_offsets", "parse_coverage"]

_KEY = "lakegate"


def coverage_metadata(stream: str, offsets: Mapping[int, int], query: str, batch: int) -> str:
    """The ``userMetadata`` string of a retained commit."""
    return json.dumps({_KEY: {"stream": stream,
                              "capture_offsets": {str(p): int(o) for p, o in sorted(offsets.items())},
                              "query": query, "batch": int(batch)}}, separators=(",", ":"))


def coverage_entry(user_metadata: str | None) -> dict | None:
    """The ``lakegate`` entry of a commit's ``userMetadata`` (``stream``,
    ``capture_offsets`` with int keys and values, ``query``, ``batch``);
    None when it has none."""
    if not user_metadata:
        return None
    try:
        doc = dict(json.loads(user_metadata)[_KEY])
        doc["stream"] = str(doc["stream"])
        doc["capture_offsets"] = {int(p): int(o) for p, o in doc["capture_offsets"].items()}
        return doc
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def parse_coverage(user_metadata: str | None) -> tuple[str, dict[int, int]] | None:
    """(stream, offsets) of a commit's ``userMetadata``; None when it has none."""
    doc = coverage_entry(user_metadata)
    return None if doc is None else (doc["stream"], doc["capture_offsets"])


def covered_offsets(history: Iterable[Mapping], stream: str) -> dict[int, int] | None:
    """The offsets of ``stream`` recorded by the newest commit in ``history``
    (commit infos, newest first, as ``DeltaTable.history`` gives them) that
    has an entry for that stream; None when none has."""
    for commit in history:
        got = parse_coverage(commit.get("userMetadata"))
        if got is not None and got[0] == stream:
            return got[1]
    return None
