"""The rows AMQP forwarding sends, from a batch already on the driver as
Arrow: the driver path's twin of :func:`bridge.job.batch.select_forward`
(the Spark projection the executor path uses). Same filter, same columns
(``schemas.forward.FORWARD_DDL``), same values; kept equal by
``tests/job/test_forward_rows.py``, which compares the two on the same
batch. Computing them here costs no Spark job: for a small batch that job
was most of the forwarding time (``lakegate bench job``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["forward_mask", "forward_rows_of"]

PUBLISH, PUBREL = 3, 6

#: FORWARD_DDL's columns that only a PUBLISH has (None on a PUBREL's row)
_PUB_ONLY = ("retain", "dup", "payload", "payload_format_indicator", "message_expiry_interval",
             "response_topic", "correlation_data", "user_properties", "content_type")
_COORDS = ("stream", "partition", "offset", "seq", "conn_id", "client_id", "receive_time")


def forward_mask(table: "pa.Table") -> "pa.ChunkedArray":
    """Which frame rows are forwarded: valid, not refused by the edge, and a
    PUBLISH (not an edge-marked QoS 2 duplicate) or a PUBREL that names its
    topic."""
    import pyarrow.compute as pc

    ok = pc.and_(pc.fill_null(table["valid"], False), pc.is_null(table["edge_rule"]))
    ptype = pc.fill_null(table["packet_type"], 0)
    pub = pc.and_(pc.equal(ptype, PUBLISH), pc.invert(pc.fill_null(table["duplicate"], False)))
    rel = pc.and_(pc.equal(ptype, PUBREL), pc.is_valid(table["rel_topic"]))
    return pc.and_(ok, pc.or_(pub, rel))


def _epoch_seconds(col: "pa.ChunkedArray") -> list[float | None]:
    """A timestamp column as epoch seconds (floats): what the mapping reads
    (``bridge.amqp.mapping.expires_at``), 0.02 us a row where tz-aware
    datetimes cost 3.9 us (measured on 50,000 rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    per_s = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[col.type.unit]
    return _pylist(pc.divide(pc.cast(pc.cast(col, pa.int64()), pa.float64()), per_s))


def _pylist(col: "pa.ChunkedArray | pa.Array") -> list[Any]:
    """``col.to_pylist()``, the same values, at a fraction of its cost for
    the columns forwarding reads (pyarrow makes a scalar per element: 0.2 us
    for an int, 0.5 for a string): all null -> one list of None; numbers and
    booleans without nulls through numpy; strings without nulls through
    their dictionary (topics, client ids and streams repeat)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    if col.null_count == n:
        return [None] * n
    t = col.type
    if col.null_count == 0:
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return (col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)).tolist()
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            enc = pc.dictionary_encode(col)
            values = enc.dictionary.to_pylist()
            return [values[i] for i in enc.indices.to_numpy().tolist()]
    return col.to_pylist()


def forward_rows_of(table: "pa.Table") -> list[dict[str, Any]]:
    """FORWARD_DDL rows (dicts) of the frame-row ``table``, in capture order
    ((partition, offset), as the executor path sorts them); ``receive_time``
    as epoch seconds (a float; the Spark path gives a datetime: the mapping
    takes both)."""
    if table.num_rows == 0:
        return []
    t = table.filter(forward_mask(table))
    if t.num_rows > 1:
        t = t.sort_by([("partition", "ascending"), ("offset", "ascending")])
    # column by column (_pylist), PUBREL rows' values made by Arrow, then one dict per row
    import pyarrow as pa
    import pyarrow.compute as pc

    pub = pc.equal(t["packet_type"], PUBLISH)
    if pc.all(pub).as_py():
        kind = ["publish"] * t.num_rows
        cols = [t["topic"], t["packet_id"], t["qos"], *(t[c] for c in _PUB_ONLY)]
    else:
        kind = pc.if_else(pub, "publish", "pubrel").to_pylist()
        cols = [pc.if_else(pub, t["topic"], t["rel_topic"]), t["packet_id"],
                pc.if_else(pub, t["qos"], pa.scalar(2, t["qos"].type)),
                *(pc.if_else(pub, t[c], pa.scalar(None, t[c].type)) for c in _PUB_ONLY)]
    values = [kind, *(_pylist(c) for c in cols), *(_pylist(t[c]) for c in _COORDS[:-1]),
              _epoch_seconds(t["receive_time"])]
    names = ("kind", "topic", "packet_id", "qos", *_PUB_ONLY, *_COORDS)
    return [dict(zip(names, row)) for row in zip(*values)]
