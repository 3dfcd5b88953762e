"""Capture records (Arrow) -> frame rows (Arrow), with no Spark: the twin of
:func:`bridge.job.pipeline.frame_rows` (``bridge.job.context.with_context``
followed by the pandas UDF) for a process that reads the capture log itself.

The live forwarder (:mod:`bridge.amqp.live`) forwards from these rows as
records become durable, outside the micro-batch. Same columns
(``schemas.tables.FRAME_ROW_DDL``), same values, same parser
(:func:`bridge.parse.frames.parse_frames`); kept equal by
``tests/job/test_arrow_frames.py``, which compares the two on one capture
log. Vectorised: the headers are looked up with Arrow kernels over the
flattened header lists, not row by row.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["frame_rows_arrow", "frame_row_schema"]

#: Context columns taken from one capture header each: (column, header, Arrow type name)
_HEADER_COLUMNS = (
    ("seq", "seq", "int64"),
    ("conn_id", "conn_id", "string"),
    ("username", "username", "string"),
    ("remote", "remote", "string"),
    ("protocol_level", "proto", "int32"),
    ("alias_topic", "alias_topic", "string"),
    ("rel_topic", "rel_topic", "string"),
    ("rel_seq", "rel_seq", "int64"),
    ("edge_rule", "reject", "string"),
    ("edge_error", "reject_error", "string"),
    ("edge_code", "reject_code", "int32"),
)


@functools.lru_cache(maxsize=1)
def frame_row_schema() -> "pa.Schema":
    """``schemas.tables.FRAME_ROW_DDL`` as an Arrow schema."""
    from schemas.ddl import to_arrow
    from schemas.tables import FRAME_ROW_DDL

    return to_arrow(FRAME_ROW_DDL)


class _Headers:
    """The capture headers of a batch, flattened once: per key asked for,
    each row's first value. Dictionary-encodes the keys (a handful of
    distinct ones) so that each lookup is a few numpy operations and one
    ``take``, whatever the batch's size."""

    def __init__(self, headers: "pa.Array", n: int) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        flat = pc.list_flatten(headers)
        self.n = n
        self.parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        encoded = pc.dictionary_encode(flat.field("key"))
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        self.codes = encoded.indices.to_numpy(zero_copy_only=False)
        self.code_of = {k: i for i, k in enumerate(encoded.dictionary.to_pylist())}
        self.values = flat.field("value")
        self._np = np

    def first(self, name: str) -> "pa.Array":
        """Per row, the first header called ``name`` (binary; null when absent)."""
        import pyarrow as pa

        np = self._np
        code = self.code_of.get(name)
        if code is None:
            return pa.nulls(self.n, pa.binary())
        at = np.flatnonzero(self.codes == code)
        rows = self.parents[at]
        if len(rows) > 1:  # parents are in row order: keep each row's first
            keep = np.empty(len(rows), dtype=bool)
            keep[0] = True
            np.not_equal(rows[1:], rows[:-1], out=keep[1:])
            at, rows = at[keep], rows[keep]
        slot = np.full(self.n, -1, dtype=np.int64)
        slot[rows] = at
        return self.values.take(pa.array(slot, mask=slot < 0))


def _cast(arr: "pa.Array", type_name: str) -> "pa.Array":
    """A header's bytes as ``type_name`` (string: UTF-8; numbers: decimal
    text), null where Spark's CAST would give null (not a number)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = arr.cast(pa.string())
    if type_name == "string":
        return text
    target = getattr(pa, type_name)()
    try:
        return pc.cast(text, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = []
        for v in text.to_pylist():
            try:
                out.append(int(v) if v is not None else None)
            except ValueError:
                out.append(None)
        return pa.array(out, target)


def _context(batch: "pa.RecordBatch") -> tuple[dict[str, "pa.Array"], "pa.Array"]:
    """CONTEXT_DDL columns of capture records, and what drops a record when not null: the
    ack_refs header, or a cluster edge's own record (header edge)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    header = _Headers(batch.column("headers"), n).first

    ts = batch.column("timestamp")
    cols: dict[str, pa.Array] = {
        "stream": batch.column("topic"),
        "partition": batch.column("partition").cast(pa.int32()),
        "offset": batch.column("offset").cast(pa.int64()),
        "receive_time": ts,
        "receive_date": pc.cast(ts, pa.timestamp("us", tz="UTC")).cast(pa.date32()),
        "client_id": batch.column("key").cast(pa.string()),
    }
    for column, name, type_name in _HEADER_COLUMNS:
        cols[column] = _cast(header(name), type_name)
    cols["origin"] = pc.coalesce(_cast(header("origin"), "string"), pa.scalar("client"))
    cols["duplicate"] = pc.fill_null(pc.equal(_cast(header("dup"), "string"), "1"), False)
    cols["frame"] = batch.column("value")
    skip = header("ack_refs")
    edge = header("edge")  # a cluster edge's own records: not frames
    if edge.null_count != len(edge):
        skip = pc.coalesce(skip, edge)
    return cols, skip


def frame_rows_arrow(batches: Iterable["pa.RecordBatch"]) -> "pa.Table":
    """Frame rows (``FRAME_ROW_DDL``) of capture record batches
    (``bridge.capture.reader.LogReader.arrow_batches``), in their order; the
    records of a run of subscriber PUBACKs (header ``ack_refs``) and a
    cluster edge's own records (header ``edge``) left out, as the job does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from bridge.parse.frames import parse_frames
    from schemas.tables import PARSED_RENAMES

    schema = frame_row_schema()
    batches = [b for b in batches if b.num_rows]
    if len(batches) > 1:  # one pass over everything: the cost per call is fixed, not per row
        batches = pa.Table.from_batches(batches).combine_chunks().to_batches()
    parts = []
    for batch in batches:
        cols, ack_refs = _context(batch)
        keep = pc.is_null(ack_refs)
        if not pc.all(keep).as_py():
            cols = {k: v.filter(keep) for k, v in cols.items()}
        if len(cols["frame"]) == 0:
            continue
        from_client = pc.not_equal(cols["origin"], "tap").to_numpy(zero_copy_only=False)
        parsed = parse_frames(cols["frame"], cols["protocol_level"], cols["alias_topic"], from_client=from_client)
        for name in parsed.column_names:
            cols[PARSED_RENAMES.get(name, name)] = parsed.column(name)
        parts.append(pa.table([cols[f.name] for f in schema], schema=schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
