"""Split one micro-batch of parsed frames into table rows (Arrow, Spark-free).

Input: an Arrow table with the columns of ``schemas.tables.FRAME_ROW_DDL``
(capture context + parser output). Output: the rows for ``messages`` (every
valid PUBLISH the edge accepted) and ``quarantine`` (every frame that broke a
rule, whether the parser found it or the edge rejected it). Other valid frames
(CONNECT, PUBREL, DISCONNECT, ...) go to no table; PUBREL is forwarded.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from schemas.ddl import to_arrow
from schemas.tables import MESSAGES_DDL, QUARANTINE_DDL

__all__ = ["BatchRows", "MESSAGES_SCHEMA", "QUARANTINE_SCHEMA", "split_batch"]

MESSAGES_SCHEMA = to_arrow(MESSAGES_DDL)
QUARANTINE_SCHEMA = to_arrow(QUARANTINE_DDL)
PUBLISH = 3


@dataclass(frozen=True)
class BatchRows:
    messages: pa.Table
    quarantine: pa.Table


def _project(t: pa.Table, schema: pa.Schema, computed: dict[str, pa.Array] | None = None) -> pa.Table:
    computed = computed or {}
    cols = []
    for f in schema:
        col = computed[f.name] if f.name in computed else t[f.name]
        cols.append(pc.cast(col, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def split_batch(frames: pa.Table) -> BatchRows:
    """Rows for ``messages`` and ``quarantine`` from one batch of parsed frames."""
    valid = pc.fill_null(frames["valid"], False)
    edge_ok = pc.is_null(frames["edge_rule"])
    is_publish = pc.equal(pc.fill_null(frames["packet_type"], 0), PUBLISH)
    msg_mask = pc.and_(pc.and_(valid, edge_ok), is_publish)
    bad_mask = pc.or_(pc.invert(valid), pc.invert(edge_ok))
    messages = _project(frames.filter(msg_mask), MESSAGES_SCHEMA)
    bad = frames.filter(bad_mask)
    # The parser's finding first; a frame the parser accepts but the edge
    # rejected (session-level rules: aliases, receive maximum) carries the edge's.
    parser_found = pc.invert(pc.fill_null(bad["valid"], False))
    quarantine = _project(bad, QUARANTINE_SCHEMA, {
        "rule": pc.if_else(parser_found, bad["rule"], bad["edge_rule"]),
        "error": pc.if_else(parser_found, bad["error"], bad["edge_error"]),
        "error_code": pc.if_else(parser_found, bad["error_code"], bad["edge_code"]),
        "frame_size": pc.binary_length(bad["frame"]),
    })
    return BatchRows(messages=messages, quarantine=quarantine)
