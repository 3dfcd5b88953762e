"""Split one micro-batch of parsed frames into table rows (Arrow, Spark-free).

Input: an Arrow table with the columns of ``schemas.tables.FRAME_ROW_DDL``
(capture context + parser output). Output: the rows for ``messages`` (every
valid PUBLISH the edge accepted) and ``quarantine`` (every frame that broke a
rule, whether the parser found it or the edge rejected it; the edge's rule
wins, the parser's finding is a column of its own). Other valid frames
(CONNECT, PUBREL, DISCONNECT, ...) go to no table; PUBREL is forwarded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from schemas.ddl import to_arrow
from schemas.tables import MESSAGES_DDL, QUARANTINE_DDL

__all__ = ["BatchRows", "MESSAGES_SCHEMA", "QUARANTINE_SCHEMA", "split_batch", "unforwardable_rows"]

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
    # The edge's rule first: it is why the client was disconnected (or its
    # CONNECT refused), and the edge may have recorded the frame cut short, so
    # the parser's own finding there is often just LG-truncated. The parser's
    # finding is kept beside it (parser_rule, parser_error) and is the rule
    # of a frame the edge accepted (the tap, or a check only the parser makes).
    edge_found = pc.is_valid(bad["edge_rule"])
    parser_found = pc.invert(pc.fill_null(bad["valid"], False))
    nothing = pa.nulls(bad.num_rows, pa.string())
    quarantine = _project(bad, QUARANTINE_SCHEMA, {
        "rule": pc.if_else(edge_found, bad["edge_rule"], bad["rule"]),
        "error": pc.if_else(edge_found, bad["edge_error"], bad["error"]),
        "error_code": pc.if_else(edge_found, bad["edge_code"], bad["error_code"]),
        "frame_size": pc.binary_length(bad["frame"]),
        "parser_rule": pc.if_else(parser_found, bad["rule"], nothing),
        "parser_error": pc.if_else(parser_found, bad["error"], nothing),
    })
    return BatchRows(messages=messages, quarantine=quarantine)


def unforwardable_rows(frames: pa.Table, failures: Sequence[Any]) -> pa.Table:
    """Quarantine rows for the frames AMQP forwarding could not make a message
    of: ``failures`` are :class:`bridge.amqp.sender.Unforwardable` (capture
    coordinates, ``rule``, ``error``), ``frames`` the batch's frame rows.
    The frames stay in ``messages`` too: they are valid MQTT."""
    by_coord = {(f.partition, f.offset): f for f in failures}
    if not by_coord or frames.num_rows == 0:
        return QUARANTINE_SCHEMA.empty_table()
    near = frames.filter(pc.is_in(frames["offset"], value_set=pa.array(sorted({o for _, o in by_coord}), pa.int64())))
    keep = [(p, o) in by_coord for p, o in zip(near["partition"].to_pylist(), near["offset"].to_pylist())]
    hit = near.filter(pa.array(keep, pa.bool_()))
    found = [by_coord[(p, o)] for p, o in zip(hit["partition"].to_pylist(), hit["offset"].to_pylist())]
    n = hit.num_rows
    return _project(hit, QUARANTINE_SCHEMA, {
        "rule": pa.array([f.rule for f in found], pa.string()),
        "error": pa.array([f.error for f in found], pa.string()),
        "error_code": pa.nulls(n, pa.int32()),
        "frame_size": pc.binary_length(hit["frame"]),
        "parser_rule": pa.nulls(n, pa.string()),
        "parser_error": pa.nulls(n, pa.string()),
    })
