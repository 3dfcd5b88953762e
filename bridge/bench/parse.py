"""``lakegate bench parse``: the vectorised frame parser against the scalar codec.

One batch of frames (default one million) of a realistic MQTT 5 mix is
generated -- vectorised, in a second or two -- and parsed three ways in the
same run:

(a) **vectorised**: :func:`bridge.parse.parse_frames`, all rules, all
    columns, from the Arrow array to the Arrow table, called as the Spark
    UDF calls it (``payload_views=True``: payloads left in the frames'
    buffer, since the UDF hands them to pandas, which copies each into its
    ``bytes``). Also timed and reported beside it: the same with the
    payloads copied (the function's default);
(b) **scalar**: the edge's codec in a per-frame loop producing the same
    table as (a): the frames as Python ``bytes``, ``decode_packet`` and the
    checks the parser adds, one row of values per frame, one Arrow array per
    column -- what a per-frame UDF must do. Also timed: the loop that only
    decodes (no columns), the cheapest a per-frame loop can be. Both run with
    the cyclic GC paused (their best case), on ``--scalar-frames`` frames;
(c) **floor**: one numpy pass that finds and slices the same topic and
    payload bytes with no validation at all (Remaining Length, topic length,
    packet id and Property Length skipped; topics copied and payloads left
    in place by the routines (a) uses).

The measurements are interleaved in ``--rounds`` rounds (default 5): each
round runs (a), (a) with copied payloads and (c) on the whole batch and (b)
on the next fifth of it, so a shared machine that changes speed during the
run slows all of them alike. Each rate is all the frames of its runs over
all their time -- no best-of, for anyone.

Reported: frames/s of each (wall clock; CPU-time rates too), a/b, a/c, a/b
against the decode-only loop, c over the decode-only loop (the ceiling: a
can never beat c), the rounds one by one (and a/b's min, median and max
over them), the share of (a) spent in the per-row Python path (the rare
packet types decoded by the scalar codec), and whether (a) and (b) agree
column by column.

Before the rounds, one untimed warm-up runs (a) (both ways) and (c) on the
whole batch and (b) on a few thousand frames (imports, first-use
allocations).

Copying payloads into fresh memory is page-fault bound on this kind of VM:
with the measurements interleaved, every run faults in its output memory
afresh (Arrow's default allocator returns freed pages to the kernel within
milliseconds), and that is counted -- it is what a process that does other
work between batches pays. That is most of the difference between (a) and
(a) with copied payloads. The JSON names the Arrow pool.

The mix of frames: :mod:`bridge.bench.parse_mix`.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from bridge.bench.parse_mix import generate
from bridge.config import Config

__all__ = ["add_arguments", "floor", "measure", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--frames", type=int, default=1_000_000, help="frames in the batch (default 1,000,000)")
    p.add_argument("--scalar-frames", type=int, default=0,
                   help="frames timed for the scalar codec (default: all of them)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rounds", "--repeat", type=int, default=5, dest="rounds",
                   help="interleaved rounds: (a) (both ways) and (c) on the whole batch, "
                        "(b) on 1/rounds of it, per round (default 5)")
    p.add_argument("--json", action="store_true")


# -- the three measurements ----------------------------------------------------------

def floor(frames) -> tuple:
    """(c): topics and payloads of the PUBLISH frames, cut with no validation
    by the routines (a) uses: topics copied, payloads left in place as views."""
    from bridge.parse.buffers import frame_buffers, read_u16, take_ranges, view_ranges
    from bridge.parse.varint import decode_varints

    fb = frame_buffers(frames)
    d, s, e = fb.data, fb.start, fb.end
    pub = (d[s] >> 4) == 3
    rl, body, _ = decode_varints(d, s + 1, e)
    tl = read_u16(d, body)
    ts = body + 2
    pos = ts + tl + np.where((d[s] & 0x06) != 0, 2, 0)
    plen, pos, _ = decode_varints(d, pos, e)
    ps = pos + plen
    topics = take_ranges(fb.buffer, d, ts, tl, pub)
    payloads = view_ranges(fb.buffer, d, ps, np.maximum(e - ps, 0), pub)
    return topics, payloads


def scalar_decode(frames_py: list, level: int = 5) -> int:
    """(b, decode only): the codec per frame, no columns; returns the number
    of frames that decode cleanly."""
    from bridge.mqtt import IncompleteData, MqttError, Publish, check_payload_format, decode_packet

    ok = 0
    for f in frames_py:
        try:
            packet, used = decode_packet(f, level)
            if type(packet) is Publish:
                check_payload_format(packet)
            ok += used == len(f)
        except (MqttError, IncompleteData):
            pass
    return ok


_PUBLISH_COLUMNS = ("dup", "qos", "retain", "topic", "payload", "payload_size",
                    "payload_format_indicator", "message_expiry_interval", "topic_alias",
                    "response_topic", "correlation_data", "user_properties",
                    "subscription_identifiers", "content_type")
_CONNECT_COLUMNS = ("client_id", "connect_protocol_level", "clean_start", "keepalive")


def scalar_table(frames, alias, level: int = 5):
    """(b): the codec per frame producing the same table as (a): the frames
    as Python bytes, decode + the checks the parser adds (record length,
    unmapped alias, Payload Format Indicator), one list per row, then one
    Arrow array per column. Will columns are left null (the mix's CONNECTs
    have no Will)."""
    import pyarrow as pa

    from bridge.mqtt import (
        Connect, IncompleteData, MqttError, Publish, check_payload_format, decode_packet,
    )
    from bridge.mqtt.fixed_header import parse_fixed_header
    from bridge.parse.frames import PARSED_SCHEMA

    names = PARSED_SCHEMA.names
    width = len(names)
    col = {name: i for i, name in enumerate(names)}
    i_valid, i_rule, i_err, i_code = col["valid"], col["rule"], col["error"], col["error_code"]
    i_type, i_rl, i_pid, i_rc = col["packet_type"], col["remaining_length"], col["packet_id"], \
        col["reason_code"]
    i_pub = [col[c] for c in _PUBLISH_COLUMNS]
    i_con = [col[c] for c in _CONNECT_COLUMNS]
    rows = []
    for f, resolved in zip(frames.to_pylist(), alias.to_pylist()):
        row = [None] * width
        rows.append(row)
        row[i_type] = f[0] >> 4 if f else 0
        row[i_valid] = False
        try:
            packet, used = decode_packet(f, level)
            if used != len(f):
                row[i_rule], row[i_code] = "LG-trailing-bytes", 0x81
                continue
            if type(packet) is Publish:
                if not packet.topic and resolved is None:
                    row[i_rule], row[i_code] = "LG-topic-alias-unmapped", 0x82
                    continue
                check_payload_format(packet)
        except IncompleteData:
            row[i_rule], row[i_code] = "LG-truncated", 0x81
            continue
        except MqttError as err:
            row[i_rule], row[i_err], row[i_code] = err.rule, str(err), err.reason_code
            continue
        row[i_valid] = True
        row[i_rl] = parse_fixed_header(f, minimal=False).remaining_length  # 3.x: any
        row[i_pid] = getattr(packet, "packet_id", None)
        row[i_rc] = getattr(packet, "reason_code", None)
        if type(packet) is Publish:
            p = packet.properties
            values = (packet.dup, packet.qos, packet.retain, packet.topic or resolved,
                      packet.payload, len(packet.payload), p.payload_format_indicator,
                      p.message_expiry_interval, p.topic_alias, p.response_topic,
                      p.correlation_data, [{"key": k, "value": v} for k, v in p.user_properties],
                      p.subscription_identifiers, p.content_type)
            for i, v in zip(i_pub, values):
                row[i] = v
        elif type(packet) is Connect:
            for i, v in zip(i_con, (packet.client_id, packet.protocol_level,
                                    packet.clean_start, packet.keepalive)):
                row[i] = v
    columns = list(zip(*rows)) if rows else [[] for _ in names]
    return pa.Table.from_arrays(
        [pa.array(c, type=PARSED_SCHEMA.field(name).type) for c, name in zip(columns, names)],
        schema=PARSED_SCHEMA)


#: Columns on which (a) and (b) must agree (error texts differ by design).
AGREE_COLUMNS = ("packet_type", "valid", "rule", "error_code", "remaining_length", "packet_id",
                 "reason_code") + _PUBLISH_COLUMNS + _CONNECT_COLUMNS


def _copied_payloads(t):
    """``t`` with a ``binary`` payload column (pyarrow cannot filter views)."""
    import pyarrow as pa

    i = t.schema.get_field_index("payload")
    return t.set_column(i, "payload", t.column("payload").cast(pa.binary()))


def _agree(a, b) -> bool:
    """(a) and (b) agree: validity, rule and reason code everywhere; every
    compared column on the valid rows ((a) also keeps the readable fixed
    header of an invalid frame, the codec cannot)."""
    if not a.select(["valid", "rule", "error_code"]).equals(b.select(["valid", "rule", "error_code"])):
        return False
    a, b = _copied_payloads(a), _copied_payloads(b)
    ok = a.column("valid")
    return a.filter(ok).select(list(AGREE_COLUMNS)).equals(b.filter(ok).select(list(AGREE_COLUMNS)))


def _without_gc(fn, *args):
    """Run ``fn`` with Python's cyclic GC paused: the scalar loops allocate
    a few objects per frame, and GC passes over them would slow (b) down by a
    third -- (b) is measured at its best."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn(*args)
    finally:
        if enabled:
            gc.enable()


def _timed(fn, *args):
    """(wall seconds, CPU seconds, result) of one call."""
    w, c = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - w, time.process_time() - c, result


def measure(n: int, seed: int = 7, scalar_frames: int = 0, rounds: int = 5) -> dict:
    """Generate the batch and time (a), (b), (c); see the module docstring.

    The five measurements are interleaved in ``rounds`` rounds: each round
    runs (a) (both ways) and (c) on the whole batch and (b) -- full, then
    decode only -- on the next 1/rounds of the frames (at least one each). A
    machine that changes speed while the benchmark runs (a shared host does)
    then slows all of them alike, instead of whichever happened to run at
    that moment.
    Every rate is total frames over total time: no best-of for anyone."""
    import pyarrow as pa

    import bridge.parse.frames as frames_mod
    from bridge.parse import parse_frames

    rounds = max(1, rounds)
    t0 = time.perf_counter()
    frames, levels, alias = generate(n, seed)
    t_gen = time.perf_counter() - t0

    def vectorised(payload_views):
        return lambda: parse_frames(frames, levels, alias, payload_views=payload_views)

    a_views, a_copy = vectorised(True), vectorised(False)

    # warm-up, untimed: one run of (a) (both ways) and (c) on the whole batch
    # and (b) on a small part (imports, first-use allocations)
    a_views()
    a_copy()
    floor(frames)
    warm = min(n, 5000)
    _without_gc(scalar_table, frames.slice(0, warm), alias.slice(0, warm))
    _without_gc(scalar_decode, frames.slice(0, warm).to_pylist())

    # (a) times the per-row Python path (rare packet types) inside it
    per_row = [0.0]
    inner = frames_mod.decode_rows

    def timed_decode_rows(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            per_row[0] += time.perf_counter() - t

    m = min(scalar_frames or n, n)
    cuts = np.linspace(0, m, min(rounds, m) + 1).astype(np.int64) if m else np.zeros(1, np.int64)
    wall = {k: 0.0 for k in ("a", "a_copy", "b", "bd", "c")}
    cpu = dict(wall)
    per_round = []
    table = None
    scalar_tables = []
    frames_mod.decode_rows = timed_decode_rows
    try:
        for r in range(rounds):
            table = None
            wa, ca, table = _timed(a_views)
            wac, cac, _ = _timed(a_copy)
            wc, cc, _ = _timed(floor, frames)
            wb = cb = wbd = cbd = 0.0
            k = 0
            if r + 1 < len(cuts):
                lo, k = int(cuts[r]), int(cuts[r + 1] - cuts[r])
                sub, sub_alias = frames.slice(lo, k), alias.slice(lo, k)
                wb, cb, tb = _timed(_without_gc, scalar_table, sub, sub_alias)
                scalar_tables.append(tb)
                py = sub.to_pylist()
                wbd, cbd, _ = _timed(_without_gc, scalar_decode, py)
                del py
            for key, w_, c_ in (("a", wa, ca), ("a_copy", wac, cac), ("c", wc, cc),
                                ("b", wb, cb), ("bd", wbd, cbd)):
                wall[key] += w_
                cpu[key] += c_
            per_round.append({"a_s": round(wa, 3), "a_copy_s": round(wac, 3),
                              "c_s": round(wc, 3), "b_frames": k,
                              "b_s": round(wb, 3),
                              "a_over_b": round((n / wa) / (k / wb), 2) if k and wb else None})
    finally:
        frames_mod.decode_rows = inner
    valid = table.column("valid").to_numpy(zero_copy_only=False)
    ptypes = table.column("packet_type").to_numpy()
    per_row_rows = int(np.isin(ptypes, [1, 2, 8, 9, 10, 11, 14, 15]).sum())
    agree = _agree(table.slice(0, m), pa.concat_tables(scalar_tables)) if m else True

    a, c = rounds * n / wall["a"], rounds * n / wall["c"]
    a_cp = rounds * n / wall["a_copy"]
    b = m / wall["b"] if m else float("nan")
    b_dec = m / wall["bd"] if m else float("nan")
    ratios = [x["a_over_b"] for x in per_round if x["a_over_b"] is not None]

    return {
        "arrow_memory_pool": pa.default_memory_pool().backend_name,
        "frames": n, "bytes": int(frames.nbytes), "generate_s": round(t_gen, 3),
        "invalid_share": round(1 - float(valid.mean()), 4),
        "rates_frames_per_s": {"vectorised": round(a), "vectorised_copied_payloads": round(a_cp),
                               "scalar": round(b),
                               "scalar_decode_only": round(b_dec), "floor": round(c)},
        "cpu_rates_frames_per_s": {"vectorised": round(rounds * n / cpu["a"]),
                                   "vectorised_copied_payloads": round(rounds * n / cpu["a_copy"]),
                                   "scalar": round(m / cpu["b"]),
                                   "scalar_decode_only": round(m / cpu["bd"]),
                                   "floor": round(rounds * n / cpu["c"])},
        "seconds": {"vectorised": round(wall["a"] / rounds, 3),
                    "vectorised_copied_payloads": round(wall["a_copy"] / rounds, 3),
                    "scalar": round(wall["b"], 3),
                    "scalar_decode_only": round(wall["bd"], 3),
                    "floor": round(wall["c"] / rounds, 3)},
        "scalar_frames": m, "rounds": rounds, "per_round": per_round,
        "a_over_b": round(a / b, 2), "a_over_c": round(a / c, 3),
        "a_copied_payloads_over_b": round(a_cp / b, 2),
        "a_over_b_per_round": {"min": min(ratios), "median": float(np.median(ratios)),
                               "max": max(ratios)} if ratios else None,
        "a_over_b_decode_only": round(a / b_dec, 2), "c_over_b_decode_only": round(c / b_dec, 2),
        "per_row_python": {"rows": per_row_rows, "seconds": round(per_row[0] / rounds, 4),
                           "share_of_vectorised": round(per_row[0] / wall["a"], 4)},
        "a_and_b_agree": bool(agree),
        "target_a_over_b": 20, "meets_target": a / b >= 20,
    }


def run(args: argparse.Namespace, config: Config) -> int:
    res = measure(args.frames, args.seed, args.scalar_frames, args.rounds)
    if args.json:
        print(json.dumps(res))
        return 0
    r, s = res["rates_frames_per_s"], res["seconds"]
    print(f"parse: {res['frames']:,} frames, {res['bytes'] / 2**20:.0f} MiB, "
          f"{res['invalid_share'] * 100:.1f} % invalid (generated in {res['generate_s']} s)")
    print(f"  (a) parse_frames as the UDF calls it   : {r['vectorised']:>10,} frames/s "
          f"({s['vectorised']} s per run, {res['rounds']} runs; payloads left in place)")
    print(f"      the same, payloads copied          : "
          f"{r['vectorised_copied_payloads']:>10,} frames/s "
          f"({s['vectorised_copied_payloads']} s per run; the default of parse_frames)")
    print(f"  (b) scalar codec per frame, columns    : {r['scalar']:>10,} frames/s "
          f"({s['scalar']} s, {res['scalar_frames']:,} frames)")
    print(f"      scalar codec per frame, decode     : {r['scalar_decode_only']:>10,} frames/s "
          f"({s['scalar_decode_only']} s)")
    print(f"  (c) floor: slice topic+payload only    : {r['floor']:>10,} frames/s "
          f"({s['floor']} s per run, {res['rounds']} runs)")
    print(f"  a/b = {res['a_over_b']} (target >= {res['target_a_over_b']}: "
          f"{'met' if res['meets_target'] else 'NOT met'}), a/c = {res['a_over_c']}, "
          f"a/b(decode only) = {res['a_over_b_decode_only']}, "
          f"a/b(payloads copied) = {res['a_copied_payloads_over_b']}")
    if res["a_over_b_per_round"]:
        q = res["a_over_b_per_round"]
        print(f"  a/b round by round ({res['rounds']} interleaved rounds): min {q['min']}, "
              f"median {q['median']}, max {q['max']}")
    p = res["per_row_python"]
    print(f"  per-row Python (rare packet types via the scalar codec): {p['rows']:,} rows, "
          f"{p['seconds']} s = {p['share_of_vectorised'] * 100:.2f} % of (a)")
    print(f"  (a) and (b) agree on every compared column: {res['a_and_b_agree']}")
    print(f"  ceiling: even the floor is {res['c_over_b_decode_only']}x the decode-only loop; "
          f"Arrow memory pool {res['arrow_memory_pool']}")
    return 0
