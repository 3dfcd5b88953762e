"""Captured MQTT frames -> typed columns, vectorised over a whole batch.

:func:`parse_frames` is the Spark job's parser (wrapped as a pandas UDF in
:mod:`bridge.parse.udf`). It takes a batch of raw frames -- exactly one frame
per capture record -- with the protocol level of each and the topic the edge
resolved for a Topic Alias, and returns one row per frame with exactly the
columns of :data:`schemas.frames.PARSED_FRAME_DDL`.

Strictness: the same rules as the edge's scalar codec
(:func:`bridge.mqtt.decode_packet`), checked in the codec's order so that the
``rule`` column names the *first* rule the codec would report, plus:

* the record is shorter than its fixed header says [LG-truncated] or longer
  (bytes after the frame) [LG-trailing-bytes];
* a Topic Alias with an empty Topic Name but no resolved topic in the capture
  header [LG-topic-alias-unmapped];
* Payload Format Indicator 1 with a payload that is not UTF-8
  [LG-payload-format-invalid, reason 0x99] (the edge's session check).

Vectorisation: the frames are one Arrow ``large_binary`` array; its value and
offset buffers are read with numpy for all rows at once -- fixed header,
Remaining Length, topic length, packet id, property blocks (one step per
property *position*, see :mod:`bridge.parse.properties`), UTF-8 validation
(:mod:`bridge.parse.utf8`) -- and the output strings and binaries are cut
from the frame buffer in one C++ copy each (:func:`bridge.parse.buffers.take_ranges`),
or, for the payloads with ``payload_views=True``, left there as views
(:func:`bridge.parse.buffers.view_ranges`).
Per-row Python runs only for the rare packet types
(:mod:`bridge.parse.scalar`: CONNECT, SUBSCRIBE, DISCONNECT, ...; the benchmark
reports its share). Elsewhere Python loops run per slice of rows, per
property position, per block of payloads to validate, or per distinct error
message -- never per frame.

Output conventions: ``packet_type``, ``dup``/``qos``/``retain`` (PUBLISH) and
``remaining_length`` are filled whenever the fixed header is readable, also
for invalid frames; every other column is null for an invalid frame
(``valid`` false, ``rule``/``error``/``error_code`` set). For a valid PUBLISH
``user_properties`` and ``subscription_identifiers`` are lists (empty when
absent, and always empty for MQTT 3.x). A null or unsupported protocol level
means "no CONNECT seen": only a CONNECT is acceptable [MQTT-3.1.0-1].

Runtime contract: runs on executors, inside the pandas UDF; imports numpy,
pyarrow and the pure-Python codec tables only; no Spark, no I/O; module-level
functions are picklable.

One piece: the checks above and the passes that apply them (the fixed
header in ``_parse_slice``, then ``_publish``, ``_acks``, the ping check
and ``_publish_session_checks``) are one ordered procedure.
:class:`~bridge.parse.problems.Problems` keeps each row's first failure and
leaves a failed row out of every later check, so the order in which
``_parse_slice`` runs the ``P.fail`` calls is the codec's order of rules,
which the ``rule`` column must follow; the passes also hand each other
their arrays (``body``, ``bend``, ``out.props``). What is not that
procedure lives beside it already: buffers, property blocks, UTF-8,
varints, the output columns, the per-row path, the problem table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.mqtt.errors import MqttError
from bridge.mqtt.fixed_header import CLIENT_ONLY, REQUIRED_FLAGS, SERVER_ONLY, PacketType
from bridge.mqtt.reason_codes import check_reason
from bridge.parse import utf8
from bridge.parse.buffers import (
    frame_buffers, frames_array, read_u16, take_ranges, value_buffers,
)
from bridge.parse.columns import PARSED_SCHEMA, PARSED_VIEW_SCHEMA, Outputs, assemble, parsed_schema
from bridge.parse.problems import Problems, check
from bridge.parse.properties import SCOPES, walk_properties
from bridge.parse.scalar import SCALAR_TYPES, decode_rows
from bridge.parse.varint import NOT_MINIMAL, OK, SHORT, TOO_LONG, decode_varints

__all__ = ["PARSED_SCHEMA", "PARSED_VIEW_SCHEMA", "parse_frames"]

PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, PINGREQ, PINGRESP = 3, 4, 5, 6, 7, 12, 13
_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)
_NAMES = {int(t): t.name for t in PacketType}

_SCALAR = np.zeros(16, dtype=bool)
_SCALAR[list(SCALAR_TYPES)] = True
_SERVER_ONLY = np.zeros(16, dtype=bool)
_SERVER_ONLY[[int(t) for t in SERVER_ONLY]] = True
_CLIENT_ONLY = np.zeros(16, dtype=bool)
_CLIENT_ONLY[[int(t) for t in CLIENT_ONLY]] = True
_REQUIRED = np.full(16, -1, dtype=np.int64)
for _t, (_flags, _rule) in REQUIRED_FLAGS.items():
    _REQUIRED[int(_t)] = _flags


def _name(a: int) -> str:
    return _NAMES.get(a >> 32, f"packet type {a >> 32}")


# -- checks, in the codec's order (bridge.mqtt.codec.decode_packet) ----------
EMPTY = check("LG-truncated", "the record is empty (no fixed header)")
TYPE_RESERVED = check("LG-packet-type-reserved", lambda a: f"packet type {a} is reserved"
                      + ("" if a == 0 else " before MQTT 5"))
NOT_CONNECT = check("MQTT-3.1.0-1", lambda a: f"first packet is {_NAMES.get(a, a)}, not CONNECT")
DIRECTION_CLIENT = check("LG-packet-direction", lambda a: f"{_NAMES.get(a, a)} sent by a Client")
DIRECTION_SERVER = check("LG-packet-direction", lambda a: f"{_NAMES.get(a, a)} sent by a Server")
QOS3 = check("MQTT-3.3.1-4", "PUBLISH has both QoS bits set")
DUP_QOS0 = check("MQTT-3.3.1-2", "PUBLISH has DUP set with QoS 0")
FLAGS = {
    int(t): check(rule, lambda a, t=t, req=req: f"{t.name} fixed-header flags are 0x{a:X}, "
                  f"not 0x{req:X}")
    for t, (req, rule) in REQUIRED_FLAGS.items()
}
HEADER_SHORT = check("LG-truncated", lambda a: f"the record of {a} bytes ends inside the "
                     "fixed header")
RL_TOO_LONG = check("LG-remaining-length", "Remaining Length continues past its fourth byte")
RL_NOT_MINIMAL = check("MQTT-1.5.5-1", "Remaining Length is not minimally encoded")
TOO_LARGE_CLIENT = check("MQTT-3.2.2-15", lambda a: f"{_NAMES.get(a, a)} exceeds the Maximum "
                         "Packet Size")
TOO_LARGE_SERVER = check("MQTT-3.1.2-24", lambda a: f"{_NAMES.get(a, a)} exceeds the Maximum "
                         "Packet Size")
FRAME_SHORT = check("LG-truncated", lambda a: f"the record ends {a} bytes before the end of "
                    "the frame its Remaining Length announces")
TRAILING = check("LG-trailing-bytes", lambda a: f"the record has {a} bytes after the end of "
                 "the frame its Remaining Length announces")
# PUBLISH (bridge.mqtt.publish.decode_publish)
TOPIC_SHORT = check("MQTT-3.3.2-1", "PUBLISH ends before the Topic Name")
TOPIC_PAST_END = check("MQTT-3.3.2-1", lambda a: f"PUBLISH Topic Name of {a} bytes runs past "
                       "the end")
TOPIC_ILL = check("MQTT-1.5.4-1", "Topic Name is not well-formed UTF-8")
TOPIC_NUL = check("MQTT-1.5.4-2", "Topic Name contains U+0000")
TOPIC_DISALLOWED = check("LG-utf8-disallowed", "Topic Name contains a disallowed code point")
TOPIC_WILDCARD = check("MQTT-3.3.2-2", "PUBLISH Topic Name contains a wildcard character")
PID_SHORT = check("LG-truncated", lambda a: f"{_name(a)} ends before the Packet Identifier")
PID_ZERO_CLIENT = check("MQTT-2.2.1-3", lambda a: f"PUBLISH with QoS {a} has Packet Identifier 0")
PID_ZERO_SERVER = check("MQTT-2.2.1-4", lambda a: f"PUBLISH with QoS {a} has Packet Identifier 0")
TOPIC_EMPTY = check("LG-topic-name-empty", "PUBLISH has an empty Topic Name and no Topic Alias")
SUBID_FROM_CLIENT = check("MQTT-3.3.4-6", "PUBLISH from a Client contains a Subscription "
                          "Identifier")
ALIAS_UNMAPPED = check("LG-topic-alias-unmapped", lambda a: f"PUBLISH uses Topic Alias {a} with "
                       "an empty Topic Name and the capture has no resolved topic for it")
PAYLOAD_NOT_UTF8 = check("LG-payload-format-invalid", "PUBLISH payload is not UTF-8 although "
                         "Payload Format Indicator is 1")
# PUBACK, PUBREC, PUBREL, PUBCOMP (bridge.mqtt.acks.decode_ack)
ACK_PID_ZERO = check("MQTT-2.2.1-5", lambda a: f"{_name(a)} has Packet Identifier 0")
ACK_LEFT_OVER = check("LG-trailing-bytes", lambda a: f"{_name(a)} has {a & 0xFFFFFFFF} bytes "
                      "left over after the last field")
ACK_AFTER_PID = check("LG-trailing-bytes", lambda a: f"{_name(a)} has {a & 0xFFFFFFFF} bytes "
                      "left over after the Packet Identifier")
EXPECT_EMPTY = check("LG-trailing-bytes", lambda a: f"{_name(a)} has {a & 0xFFFFFFFF} bytes left "
                     "over after the fixed header")


def _reason_table():
    """valid[ptype, from_client, code] and the check for an invalid code,
    derived from the codec's own :func:`check_reason` (MQTT 5 acks)."""
    valid = np.zeros((16, 2, 256), dtype=bool)
    checks = {}
    for ptype in _ACKS:
        t = PacketType(ptype)
        for client in (0, 1):
            for code in range(256):
                try:
                    check_reason(t, code, 5, bool(client))
                    valid[ptype, client, code] = True
                except MqttError as err:
                    if ptype not in checks:
                        checks[ptype] = check(err.rule, lambda a, t=t: f"{t.name} reason code "
                                              f"0x{a:02X} is not valid")
    return valid, checks


_REASON_VALID, _REASON_CHECK = _reason_table()


# -- input normalisation ------------------------------------------------------

def _int_column(values, n: int, name: str) -> np.ndarray:
    """int64 numpy array (-1 for null) from a scalar, sequence, Series or Arrow array."""
    if values is None:
        return np.full(n, -1, dtype=np.int64)
    if np.isscalar(values):
        return np.full(n, int(values), dtype=np.int64)
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, from_pandas=True)
    if len(arr) != n:
        raise ValueError(f"{name}: {len(arr)} values for {n} frames")
    if pa.types.is_null(arr.type):
        return np.full(n, -1, dtype=np.int64)
    arr = pc.fill_null(arr.cast(pa.int64()), -1)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _bool_column(values, n: int, name: str) -> np.ndarray:
    if np.isscalar(values) or values is None:
        return np.full(n, True if values is None else bool(values), dtype=bool)
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, from_pandas=True)
    if len(arr) != n:
        raise ValueError(f"{name}: {len(arr)} values for {n} frames")
    arr = pc.fill_null(arr.cast(pa.bool_()), True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _string_column(values, n: int, name: str) -> pa.Array | None:
    if values is None:
        return None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    arr = values if isinstance(values, pa.Array) else pa.array(values, type=pa.string(), from_pandas=True)
    if len(arr) != n:
        raise ValueError(f"{name}: {len(arr)} values for {n} frames")
    if arr.type != pa.string():
        arr = arr.cast(pa.string())
    return arr


# -- the parser ---------------------------------------------------------------

#: Upper bound of frame bytes parsed in one pass (the output binary columns
#: use 32-bit offsets); larger batches are parsed in slices.
SLICE_BYTES = 256 << 20
SLICE_ROWS = 1 << 15


def parse_frames(frames, protocol_levels, alias_topics=None, *, from_client=True,
                 max_packet_bytes: int | None = None, payload_views: bool = False) -> pa.Table:
    """Parse a batch of captured frames into ``PARSED_FRAME_DDL`` columns.

    ``frames``: pyarrow Binary/LargeBinary array or ChunkedArray, pandas
    Series of bytes, or a sequence of bytes (one frame per record; null is an
    empty record). ``protocol_levels``: one int for all, or one per frame
    (3, 4, 5; null = no CONNECT seen). ``alias_topics``: None or one
    str/None per frame, the capture header ``alias_topic``.
    ``from_client``: bool or one per frame (False for frames a server sent,
    e.g. the tap's). ``max_packet_bytes``: the edge's Maximum Packet Size, if
    it should be re-checked. ``payload_views``: leave the payloads in the
    frames' buffer (see below).

    Returns a ``pyarrow.Table`` with :data:`PARSED_SCHEMA`, one row per frame
    in input order. With ``payload_views=True`` the ``payload`` column is a
    ``binary_view`` array pointing into the frames' buffer
    (:data:`PARSED_VIEW_SCHEMA`): no copy of the payload bytes, the same
    values (``to_pandas``/``to_pylist`` give the same bytes). The Spark UDF
    uses it, since it converts to pandas straight away; the default copies,
    because pyarrow has no ``take``/``filter``/comparison kernels for view
    types yet (``.cast(pa.binary())`` converts).

    Never raises for bad frames (they are rows with
    ``valid`` false); raises TypeError/ValueError for bad arguments.

    Runs on executors; picklable (a module-level function).
    """
    arr = frames_array(frames)
    n = len(arr)
    levels = _int_column(protocol_levels, n, "protocol_levels")
    client = _bool_column(from_client, n, "from_client")
    alias = _string_column(alias_topics, n, "alias_topics")
    schema = parsed_schema(payload_views)
    if n == 0:
        return schema.empty_table()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=arr.offset + n + 1)[arr.offset:]
    batches = []
    lo = 0
    while lo < n:
        # the largest slice within both bounds (at least one row)
        hi = int(np.searchsorted(offsets, offsets[lo] + SLICE_BYTES, side="right")) - 1
        hi = min(max(hi, lo + 1), n, lo + SLICE_ROWS)
        batches.append(_parse_slice(
            arr.slice(lo, hi - lo), levels[lo:hi], client[lo:hi],
            None if alias is None else alias.slice(lo, hi - lo), max_packet_bytes, payload_views))
        lo = hi
    return pa.Table.from_batches(batches, schema=schema)


def _parse_slice(arr: pa.LargeBinaryArray, level: np.ndarray, client: np.ndarray,
                 alias: pa.Array | None, max_packet_bytes: int | None,
                 payload_views: bool) -> pa.RecordBatch:
    fb = frame_buffers(arr)
    data, s0, fe = fb.data, fb.start, fb.end
    buffer = fb.buffer
    n = len(arr)
    last = len(data) - 1
    rows = np.arange(n, dtype=np.int64)
    P = Problems(n)
    size = fe - s0
    known = (level >= 3) & (level <= 5)
    lv = np.where(known, level, 0)
    has = size >= 1
    b0 = np.where(has, data[np.minimum(s0, last)], 0).astype(np.int64)
    ptype = b0 >> 4
    flags = b0 & 0x0F
    scalar = has & _SCALAR[ptype]
    vec = ~scalar

    # fixed header: byte 1 (codec: check_first_byte), then the Remaining Length
    P.fail(rows, EMPTY, 0, ~has)
    v = vec & has
    P.fail(rows, TYPE_RESERVED, ptype, v & (ptype == 0))
    P.fail(rows, NOT_CONNECT, ptype, v & ~known)
    P.fail(rows, DIRECTION_CLIENT, ptype, v & known & client & _SERVER_ONLY[ptype])
    P.fail(rows, DIRECTION_SERVER, ptype, v & known & ~client & _CLIENT_ONLY[ptype])
    pub = v & (ptype == PUBLISH)
    qos = (flags >> 1) & 0x03
    P.fail(rows, QOS3, 0, pub & (qos == 3))
    P.fail(rows, DUP_QOS0, 0, pub & ((flags & 0x08) != 0) & (qos == 0) & (lv >= 4))
    fl = v & (ptype != PUBLISH) & (lv >= 4) & (_REQUIRED[ptype] >= 0) & (flags != _REQUIRED[ptype])
    for t in np.unique(ptype[fl]).tolist():  # once per packet type present
        P.fail(rows, FLAGS[t], flags, fl & (ptype == t))
    P.fail(rows, HEADER_SHORT, size, v & (size < 2))
    rl, body, st = decode_varints(data, s0 + 1, fe)
    st = np.where(size >= 2, st, SHORT)
    P.fail(rows, HEADER_SHORT, size, v & (st == SHORT))
    P.fail(rows, RL_TOO_LONG, 0, v & (st == TOO_LONG))
    # MQTT-1.5.5-1 is MQTT 5's; 3.1.1 (section 2.2.3) and 3.1 accept a
    # non-minimal Remaining Length, as the codec does
    lax = (st == NOT_MINIMAL) & ((lv == 3) | (lv == 4))
    P.fail(rows, RL_NOT_MINIMAL, 0, v & (st == NOT_MINIMAL) & ~lax)
    rl_ok = (st == OK) | lax | ((st == NOT_MINIMAL) & scalar)  # the codec judges scalar rows
    total = body - s0 + rl  # frame length from the fixed header
    if max_packet_bytes is not None:
        big = v & rl_ok & (total > max_packet_bytes)
        P.fail(rows, TOO_LARGE_CLIENT, ptype, big & client)
        P.fail(rows, TOO_LARGE_SERVER, ptype, big & ~client)
    P.fail(rows, FRAME_SHORT, total - size, v & rl_ok & (total > size))
    bend = s0 + total  # end of the packet body (= fe for a well-sized record)

    out = Outputs(n)
    _publish(P, out, buffer, data, ptype, qos, lv, client, body, bend)
    _acks(P, out, data, ptype, lv, client, body, bend)
    ping = np.flatnonzero((P.code == 0) & v & ((ptype == PINGREQ) | (ptype == PINGRESP)))
    P.fail(ping, EXPECT_EMPTY, (ptype[ping] << 32) | rl[ping], rl[ping] != 0)
    # a frame decoded fine, but the record goes on after it
    P.fail(rows, TRAILING, size - total, v & rl_ok & (total < size))
    _publish_session_checks(P, out, buffer, data, alias)

    # rare packet types: the scalar codec, per row
    srows = np.flatnonzero(scalar)
    sres = decode_rows(P, data, s0, fe, srows, level, client, max_packet_bytes)
    if sres.incomplete:
        inc = np.asarray(sres.incomplete, dtype=np.int64)
        P.fail(inc, FRAME_SHORT, total[inc] - size[inc], rl_ok[inc])
        P.fail(inc, HEADER_SHORT, size[inc])
    if sres.trailing:
        tr = np.asarray(sres.trailing, dtype=np.int64)
        P.fail(tr, TRAILING, size[tr] - total[tr])

    return assemble(P, out, buffer, data, n, has, ptype, flags, qos, rl, rl_ok, sres, alias,
                    payload_views)


def _publish(P, out, buffer, data, ptype, qos, lv, client, body, bend):
    """PUBLISH bodies, in the order of bridge.mqtt.publish.decode_publish."""
    pr = np.flatnonzero((P.code == 0) & (ptype == PUBLISH))
    if len(pr) == 0:
        return
    s, e = body[pr], bend[pr]
    short = s + 2 > e
    P.fail(pr, TOPIC_SHORT, 0, short)
    tl = np.where(short, 0, read_u16(data, np.where(short, 0, s)))
    ts = s + 2
    P.fail(pr, TOPIC_PAST_END, tl, ~short & (ts + tl > e))
    ok = P.code[pr] == 0
    # Topic Name UTF-8 rules and wildcards: one gather of all topics, which is
    # also the output column (rows that fail later are masked, not copied again)
    n = len(ptype)
    start = np.zeros(n, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    start[pr[ok]] = ts[ok]
    length[pr[ok]] = tl[ok]
    topics = take_ranges(buffer, data, start, length)
    out.topics = topics
    tval, toff = value_buffers(topics)
    status = utf8.check_strings(tval, toff)[pr]
    P.fail(pr, TOPIC_ILL, 0, status == utf8.ILL_FORMED)
    P.fail(pr, TOPIC_NUL, 0, status == utf8.NUL)
    P.fail(pr, TOPIC_DISALLOWED, 0, status == utf8.DISALLOWED)
    P.fail(pr, TOPIC_WILDCARD, 0, utf8.has_wildcard(tval, toff)[pr])
    # Packet Identifier (QoS > 0)
    cur = ts + tl
    q = qos[pr]
    haspid = (q > 0) & (P.code[pr] == 0)
    pshort = haspid & (cur + 2 > e)
    P.fail(pr, PID_SHORT, np.int64(PUBLISH) << 32, pshort)
    haspid &= ~pshort
    pid = np.zeros(len(pr), dtype=np.int64)
    hi = np.flatnonzero(haspid)
    pid[hi] = read_u16(data, cur[hi])
    zero = haspid & (pid == 0)
    cl = client[pr]
    P.fail(pr, PID_ZERO_CLIENT, q, zero & cl)
    P.fail(pr, PID_ZERO_SERVER, q, zero & ~cl)
    cur = np.where(q > 0, cur + 2, cur)
    # MQTT 5 properties
    v5 = np.flatnonzero((P.code[pr] == 0) & (lv[pr] >= 5))
    alias_present = np.zeros(len(pr), dtype=bool)
    nsub = np.zeros(len(pr), dtype=np.int64)
    block = walk_properties(P, data, pr[v5], cur[v5], e[v5],
                            np.full(len(v5), SCOPES.index(_scope("PUBLISH")), dtype=np.int64),
                            np.full(len(v5), PUBLISH, dtype=np.int64))
    cur[v5] = block.end
    if 0x23 in block.numbers:
        alias_present[v5] = block.numbers[0x23][0]
    if len(block.subids[0]):
        np.add.at(nsub, v5[block.subids[0]], 1)
    empty = tl == 0
    P.fail(pr, TOPIC_EMPTY, 0, empty & ~alias_present)
    P.fail(pr, SUBID_FROM_CLIENT, 0, (nsub > 0) & cl)
    out.is_pub[pr] = True
    out.topic_start[pr] = ts
    out.topic_len[pr] = tl
    out.payload_start[pr] = cur
    out.payload_len[pr] = np.maximum(e - cur, 0)
    out.packet_id[pr] = pid
    out.has_pid[pr] = q > 0
    out.props = block
    out.prop_rows = pr[v5]


def _scope(name: str):
    return next(s for s in SCOPES if s.name == name)


def _publish_session_checks(P, out, buffer, data, alias):
    """The edge session's PUBLISH checks, after the codec's: an alias with no
    resolved topic, then the Payload Format Indicator."""
    block = out.props
    if block is None or len(out.prop_rows) == 0:
        return
    pr5 = out.prop_rows
    if 0x23 in block.numbers:
        present, value = block.numbers[0x23]
        use = present & (out.topic_len[pr5] == 0)
        if alias is None:
            missing = use
        else:
            missing = use & alias.is_null().to_numpy(zero_copy_only=False)[pr5]
        P.fail(pr5, ALIAS_UNMAPPED, value, missing)
    if 0x01 in block.numbers:
        present, value = block.numbers[0x01]
        text = np.flatnonzero(present & (value == 1) & (P.code[pr5] == 0))
        if len(text):
            rows = pr5[text]
            ps, pl = out.payload_start[rows], out.payload_len[rows]
            good = np.ones(len(rows), dtype=bool)
            # The payloads are copied back to back by Arrow; numpy finds the
            # ASCII ones (well formed; the common case). The others are
            # validated by Arrow in blocks, and the rows of the blocks that
            # fail by numpy. Python runs once per block.
            texts = take_ranges(buffer, data, ps, pl).view(pa.string())
            other = np.flatnonzero(utf8.has_non_ascii(*value_buffers(texts)))
            if len(other):
                rest = texts.take(other)
                for lo in _failing_blocks(rest, 0, len(other)):
                    blk = rest.slice(lo, _PAYLOAD_BLOCK)
                    good[other[lo:lo + len(blk)]] = utf8.well_formed(*value_buffers(blk))
            P.fail(rows, PAYLOAD_NOT_UTF8, 0, ~good)


_PAYLOAD_BLOCK = 2048


def _utf8_ok(views: pa.Array) -> bool:
    try:
        views.validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


def _failing_blocks(views: pa.Array, lo: int, hi: int) -> list[int]:
    """Starts of the blocks of ``_PAYLOAD_BLOCK`` rows whose UTF-8 Arrow rejects."""
    if _utf8_ok(views.slice(lo, hi - lo)):
        return []
    return [b for b in range(lo, hi, _PAYLOAD_BLOCK)
            if not _utf8_ok(views.slice(b, min(_PAYLOAD_BLOCK, hi - b)))]


def _acks(P, out, data, ptype, lv, client, body, bend):
    """PUBACK/PUBREC/PUBREL/PUBCOMP, in the order of bridge.mqtt.acks.decode_ack."""
    ar = np.flatnonzero((P.code == 0) & (ptype >= PUBACK) & (ptype <= PUBCOMP))
    if len(ar) == 0:
        return
    s, e, t = body[ar], bend[ar], ptype[ar]
    tag = t << 32
    short = s + 2 > e
    P.fail(ar, PID_SHORT, tag, short)
    pid = np.where(short, 0, read_u16(data, np.where(short, 0, s)))
    P.fail(ar, ACK_PID_ZERO, tag, ~short & (pid == 0))
    left = e - (s + 2)
    short_form = (lv[ar] < 5) | (left == 0)
    P.fail(ar, ACK_AFTER_PID, tag | np.maximum(left, 0), short_form & (left != 0))
    reason = np.zeros(len(ar), dtype=np.int64)
    lf = np.flatnonzero(~short_form & (P.code[ar] == 0))
    reason[lf] = data[s[lf] + 2]
    cl = client[ar].astype(np.int64)
    bad = np.zeros(len(ar), dtype=bool)
    bad[lf] = ~_REASON_VALID[t[lf], cl[lf], reason[lf]]
    for pt in np.unique(t[bad]).tolist():  # once per packet type present
        P.fail(ar, _REASON_CHECK[pt], reason, bad & (t == pt))
    wp = lf[(P.code[ar[lf]] == 0) & (s[lf] + 3 < e[lf])]
    cur = s + 3
    block = walk_properties(P, data, ar[wp], cur[wp], e[wp], _ACK_SCOPE[t[wp]], t[wp])
    cur[wp] = block.end
    rest = e - cur
    P.fail(ar, ACK_LEFT_OVER, tag | np.maximum(rest, 0), ~short_form & (rest != 0))
    out.packet_id[ar] = pid
    out.has_pid[ar] = True
    out.reason[ar] = reason
    out.has_reason[ar] = True


_ACK_SCOPE = np.zeros(16, dtype=np.int64)
for _t in _ACKS:
    _ACK_SCOPE[_t] = SCOPES.index(_scope(_NAMES[_t]))
