"""The output columns of the frame parser, built from what it collected.

:class:`Outputs` holds, per batch row, the positions (in the frame buffer)
and values the parser found; :func:`assemble` turns them into one
``pyarrow.RecordBatch`` with exactly :data:`PARSED_SCHEMA`
(``schemas.frames.PARSED_FRAME_DDL``), or :data:`PARSED_VIEW_SCHEMA` when
payloads are to stay in the frames' buffer. Every column is built from numpy
arrays and Arrow buffers (:func:`bridge.parse.buffers.take_ranges` for
strings and binaries, :func:`~bridge.parse.buffers.view_ranges` for payloads
left in place, validity bitmaps packed by numpy); only the values of
the rare rows the scalar codec decoded pass through Python lists.

Runs on executors; numpy and pyarrow only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.parse.buffers import take_ranges, value_buffers, view_ranges
from schemas.ddl import to_arrow
from schemas.frames import PARSED_FRAME_DDL

__all__ = ["Outputs", "PARSED_SCHEMA", "PARSED_VIEW_SCHEMA", "assemble", "parsed_schema"]

#: The Arrow schema of the parser's result (from ``schemas.frames``).
PARSED_SCHEMA: pa.Schema = to_arrow(PARSED_FRAME_DDL)

#: The same with ``payload`` as ``binary_view``: the same values, as views
#: into the frames' buffer instead of a copy (``parse_frames(...,
#: payload_views=True)``; the Spark UDF's choice).
PARSED_VIEW_SCHEMA: pa.Schema = PARSED_SCHEMA.set(
    PARSED_SCHEMA.get_field_index("payload"),
    PARSED_SCHEMA.field("payload").with_type(pa.binary_view()))


def parsed_schema(payload_views: bool) -> pa.Schema:
    """The result's schema: :data:`PARSED_VIEW_SCHEMA` or :data:`PARSED_SCHEMA`."""
    return PARSED_VIEW_SCHEMA if payload_views else PARSED_SCHEMA

PUBLISH = 3


class Outputs:
    """Positions and values collected for the output columns (batch rows)."""

    def __init__(self, n: int) -> None:
        z = np.zeros
        self.is_pub = z(n, dtype=bool)
        self.topic_start = z(n, dtype=np.int64)
        self.topic_len = z(n, dtype=np.int64)
        self.payload_start = z(n, dtype=np.int64)
        self.payload_len = z(n, dtype=np.int64)
        self.packet_id = z(n, dtype=np.int64)
        self.has_pid = z(n, dtype=bool)
        self.reason = z(n, dtype=np.int64)
        self.has_reason = z(n, dtype=bool)
        self.topics = None       # binary array (n rows) of the PUBLISH Topic Names
        self.props = None        # PropertyBlock of the MQTT 5 PUBLISH rows
        self.prop_rows = z(0, dtype=np.int64)


def _bitmap(mask: np.ndarray) -> pa.Buffer | None:
    return None if mask.all() else pa.py_buffer(np.packbits(mask, bitorder="little"))


_NP = {pa.int32(): np.int32, pa.int64(): np.int64}


def _offsets(sizes: np.ndarray) -> np.ndarray:
    """The int32 offsets (one more than rows) of rows of these sizes."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _ints(values: np.ndarray, present: np.ndarray, typ) -> pa.Array:
    """An int32/int64 array from numpy values and a presence mask (no copy
    beyond the width conversion; the bitmap is packed by numpy)."""
    n = len(values)
    if not present.any():
        return pa.nulls(n, type=typ)
    data = np.ascontiguousarray(values, dtype=_NP[typ])
    return pa.Array.from_buffers(typ, n, [_bitmap(present), pa.py_buffer(data)],
                                 null_count=int(n - np.count_nonzero(present)))


def _bools(values: np.ndarray, present: np.ndarray) -> pa.Array:
    n = len(values)
    if not present.any():
        return pa.nulls(n, type=pa.bool_())
    return pa.Array.from_buffers(pa.bool_(), n, [_bitmap(present), pa.py_buffer(
        np.packbits(values, bitorder="little"))], null_count=int(n - np.count_nonzero(present)))


def _scatter(values: list, rows: np.ndarray, n: int, typ) -> pa.Array:
    """An n-row array with ``values`` at ``rows`` (the rare rows decoded by
    the scalar codec) and null elsewhere."""
    keep = [i for i, v in enumerate(values) if v is not None]  # rare rows only
    if not keep:
        return pa.nulls(n, type=typ)
    at = rows[keep]
    present = np.zeros(n, dtype=bool)
    present[at] = True
    if typ in _NP or typ == pa.bool_():
        vals = np.zeros(n, dtype=bool if typ == pa.bool_() else np.int64)
        vals[at] = [values[i] for i in keep]
        return _bools(vals, present) if typ == pa.bool_() else _ints(vals, present, typ)
    if typ in (pa.string(), pa.binary()):
        raw = [values[i].encode() if typ == pa.string() else values[i] for i in keep]
        lengths = np.zeros(n, dtype=np.int64)
        lengths[at] = [len(x) for x in raw]
        return pa.Array.from_buffers(typ, n, [_bitmap(present), pa.py_buffer(_offsets(lengths)),
                                              pa.py_buffer(b"".join(raw))],
                                     null_count=int(n - len(keep)))
    idx = np.full(n, -1, dtype=np.int64)
    idx[at] = np.arange(len(keep))
    return pa.array([values[i] for i in keep], type=typ).take(pa.array(idx, mask=idx < 0))


def assemble(P, out, buffer, data, n, has, ptype, flags, qos, rl, rl_ok, sres, alias,
             payload_views=False):
    schema = parsed_schema(payload_views)
    valid = P.code == 0
    pub = out.is_pub & valid
    cols: dict[str, pa.Array] = {}
    cols["packet_type"] = _ints(np.where(has, ptype, 0), np.ones(n, dtype=bool), pa.int32())
    is_pub_type = has & (ptype == PUBLISH)
    cols["dup"] = _bools((flags & 0x08) != 0, is_pub_type)
    cols["qos"] = _ints(qos, is_pub_type, pa.int32())
    cols["retain"] = _bools((flags & 0x01) != 0, is_pub_type)
    cols["remaining_length"] = _ints(rl, rl_ok, pa.int32())
    cols["valid"] = _bools(valid, np.ones(n, dtype=bool))
    cols["rule"], cols["error"], cols["error_code"] = P.columns()

    # PUBLISH
    if out.topics is None:
        topic = pa.nulls(n, type=pa.string())
    else:  # the gather made for validation, with the final validity
        _, tob, tvb = out.topics.buffers()
        topic = pa.Array.from_buffers(pa.string(), n, [_bitmap(pub), tob, tvb])
    if alias is not None:
        use_alias = pub & (out.topic_len == 0)
        if use_alias.any():
            topic = pc.if_else(pa.array(use_alias), alias, topic)
    cols["topic"] = topic
    sc = np.zeros(n, dtype=bool)
    sc[sres.rows] = True
    spid = sres.values["packet_id"]
    pid_vals = out.packet_id.copy()
    pid_present = out.has_pid & valid
    if len(sres.rows):
        sp = np.array([-1 if x is None else x for x in spid], dtype=np.int64)  # rare rows only
        keep = (sp >= 0) & valid[sres.rows]
        pid_vals[sres.rows[keep]] = sp[keep]
        pid_present[sres.rows[keep]] = True
    cols["packet_id"] = _ints(pid_vals, pid_present, pa.int32())
    cut = view_ranges if payload_views else take_ranges
    cols["payload"] = cut(buffer, data, out.payload_start, out.payload_len, pub)
    cols["payload_size"] = _ints(out.payload_len, pub, pa.int32())

    block = out.props
    pr5 = out.prop_rows
    m5 = np.zeros(n, dtype=bool)
    m5[pr5] = True
    for name, pid, typ in (("payload_format_indicator", 0x01, pa.int32()),
                           ("message_expiry_interval", 0x02, pa.int64()),
                           ("topic_alias", 0x23, pa.int32())):
        vals = np.zeros(n, dtype=np.int64)
        present = np.zeros(n, dtype=bool)
        if block is not None and pid in block.numbers:
            p, v = block.numbers[pid]
            vals[pr5] = v
            present[pr5] = p
        cols[name] = _ints(vals, present & pub, typ)
    for name, pid, typ in (("response_topic", 0x08, pa.string()),
                           ("correlation_data", 0x09, pa.binary()),
                           ("content_type", 0x03, pa.string())):
        if block is not None and pid in block.values:
            # the bytes the walk cut (and checked) for the rows that have the
            # property, spread over all rows, with the final validity
            arr = block.values[pid]
            at = pr5[block.ranges[pid][0]]
            present = np.zeros(n, dtype=bool)
            present[at] = True
            present &= pub
            lengths = np.zeros(n, dtype=np.int64)
            lengths[at] = np.diff(value_buffers(arr)[1])
            cols[name] = pa.Array.from_buffers(
                typ, n, [_bitmap(present), pa.py_buffer(_offsets(lengths)), arr.buffers()[2]],
                null_count=int(n - np.count_nonzero(present)))
        else:
            cols[name] = pa.nulls(n, type=typ)

    # user properties: list<struct<key, value>>, wire order and duplicates kept
    kv_type = schema.field("user_properties").type
    if block is not None and len(block.user[0]):
        br = pr5[block.user[0]]
        keys, values = block.user_keys, block.user_values
        keep = pub[br]
        if not keep.all():  # the entries of rows that failed are left out
            br = br[keep]
            mask = pa.array(keep)
            keys, values = keys.filter(mask), values.filter(mask)
    else:
        br = np.zeros(0, dtype=np.int64)
        keys = values = pa.array([], type=pa.string())
    offsets = _offsets(np.bincount(br, minlength=n))
    struct = pa.StructArray.from_arrays([keys, values], fields=list(kv_type.value_type))
    cols["user_properties"] = pa.ListArray.from_arrays(
        pa.array(offsets), struct, type=kv_type, mask=pa.array(~pub))
    if block is not None and len(block.subids[0]):
        lr, sv = block.subids
        br = pr5[lr]
        keep = pub[br]
        br, sv = br[keep], sv[keep]
    else:
        br = sv = np.zeros(0, dtype=np.int64)
    offsets = _offsets(np.bincount(br, minlength=n))
    cols["subscription_identifiers"] = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(sv, type=pa.int64()),
        type=schema.field("subscription_identifiers").type, mask=pa.array(~pub))

    # acknowledgements (+ reason codes of the rare types)
    rvals = out.reason.copy()
    rpresent = out.has_reason & valid
    if len(sres.rows):
        rc = sres.values["reason_code"]
        sr = np.array([-1 if x is None else x for x in rc], dtype=np.int64)  # rare rows only
        keep = (sr >= 0) & valid[sres.rows]
        rvals[sres.rows[keep]] = sr[keep]
        rpresent[sres.rows[keep]] = True
    cols["reason_code"] = _ints(rvals, rpresent, pa.int32())

    # CONNECT (rare rows, from the scalar codec)
    ok_rows = valid[sres.rows] if len(sres.rows) else np.zeros(0, dtype=bool)
    for name in ("client_id", "connect_protocol_level", "clean_start", "keepalive",
                 "will_topic", "will_payload", "will_qos", "will_retain", "will_properties"):
        typ = schema.field(name).type
        vals = [v if k else None for v, k in zip(sres.values[name], ok_rows.tolist())]
        cols[name] = _scatter(vals, sres.rows, n, typ)

    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)
