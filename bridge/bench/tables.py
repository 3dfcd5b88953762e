"""``lakegate bench tables``: the job's table step through delta-rs and
through delta-spark, side by side in one run (issue 41).

One local Spark session (``spark.master``, default ``local[*]``, with the
delta-spark jars of ``.jvm/lib/delta``; without them this bench says so and
exits 2). The same micro-batches go through each engine's
:func:`bridge.tables.writer.write_tables` (the job's table step: append to
``messages`` and ``quarantine`` under the app transaction, the retained
rule, the ``retained`` MERGE with its coverage metadata), into tables of
their own:

* **batches** of ``--batches`` rows (1,000 / 20,000 / 160,000): 90 % plain
  PUBLISHes over 1,000 topics, 9 % retained over as many topics as rows,
  a tenth of those zero-byte deletes, 1 % frames the edge refused
  (quarantine). Each engine writes one untimed batch first (the tables'
  first files, the JVM's first plans), then ``--repeat`` timed ones, the
  engines taking turns batch by batch;
* **merge**: ``retained`` seeded with ``--topics`` (1,000,000) topics (by
  delta-rs, then copied: both engines start from the same files), then
  ``--repeat`` batches of ``--changes`` (20,000) retained PUBLISHes over
  them, each through the whole table step.

Per step and engine: the median wall time, the median CPU seconds of this
process and its children (the Spark JVM, Python workers: ``/proc``), and
the files the step added to the table folders; the ratio is
delta-spark / delta-rs (above 1: delta-spark takes longer). ``--quick``:
sizes a tenth of the above (a smoke run, not figures).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bridge.config import Config

__all__ = ["add_arguments", "run"]

SEQ_STRIDE = 10_000_000  # capture offsets of one batch never meet another's


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", default="1000,20000,160000", help="micro-batch sizes (rows), comma separated")
    p.add_argument("--topics", type=int, default=1_000_000, help="retained topics the merge step starts from")
    p.add_argument("--changes", type=int, default=20_000, help="retained PUBLISHes per merge batch")
    p.add_argument("--repeat", type=int, default=3, help="timed batches per step and engine (the median is shown)")
    p.add_argument("--quick", action="store_true", help="a tenth of every size: a smoke run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")


# ------------------------------------------------------------------ rows
def _frames(n: int, seq0: int, retained_topics: int, retained_share: float, quarantine_share: float) -> Any:
    """``n`` frame rows (``FRAME_ROW_DDL``) as the job hands them to the table step."""
    import pyarrow as pa

    from schemas.ddl import to_arrow
    from schemas.tables import FRAME_ROW_DDL

    now = dt.datetime.now(dt.timezone.utc)
    every_r = max(1, round(1 / retained_share)) if retained_share else 0
    every_q = max(1, round(1 / quarantine_share)) if quarantine_share else 0
    rows = []
    for i in range(n):
        seq = seq0 + i
        retain = bool(every_r) and i % every_r == 1 % every_r
        bad = bool(every_q) and i % every_q == 2
        payload = b"" if retain and (i // every_r) % 10 == 0 else b'{"v": %d, "unit": "C"}' % i
        topic = (f"site/{(seq * 7919) % retained_topics % 100}/dev/{(seq * 7919) % retained_topics}/state"
                 if retain else f"site/{i % 10}/dev/{i % 1000}/telemetry")
        rows.append({
            "stream": "mqtt-frames", "partition": 0, "offset": seq, "seq": seq, "receive_time": now,
            "receive_date": now.date(), "conn_id": f"c{i % 50}", "client_id": f"dev-{i % 1000}",
            "protocol_level": 5 if i % 2 else 4, "origin": "client", "duplicate": False,
            "frame": b"\x32" + payload[:8], "valid": True, "packet_type": 3, "qos": 1, "retain": retain,
            "dup": False, "topic": topic, "packet_id": i % 65535 + 1, "payload": payload,
            "payload_size": len(payload), "user_properties": [], "subscription_identifiers": [],
            "edge_rule": "MQTT-3.3.2-2" if bad else None, "edge_error": "topic has a wildcard" if bad else None,
        })
    return pa.Table.from_pylist(rows, schema=to_arrow(FRAME_ROW_DDL))


def _seed_retained(tables: Path, topics: int) -> None:
    """``retained`` with ``topics`` live topics, written by delta-rs in chunks."""
    from deltalake import write_deltalake

    from bridge.tables.retained_rule import retained_changes
    from bridge.tables.rows import split_batch

    chunk = 200_000
    for start in range(0, topics, chunk):
        n = min(chunk, topics - start)
        frames = _frames(n, start, topics, 1.0, 0.0)
        # every row retained, topic i for row i: no deletes while seeding
        import pyarrow as pa

        frames = frames.set_column(frames.schema.get_field_index("topic"), "topic",
                                   pa.array([f"site/{i % 100}/dev/{i}/state" for i in range(start, start + n)]))
        frames = frames.set_column(frames.schema.get_field_index("payload"), "payload",
                                   pa.array([b"seed-%d" % i for i in range(start, start + n)]))
        write_deltalake(str(tables / "retained"), retained_changes(split_batch(frames).messages), mode="append")


# ------------------------------------------------------------------ measuring
def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every descendant alive now."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    me = os.getpid()
    total = 0.0
    for pid, t in cpu.items():
        p = pid
        while p and p != me and p in parent:
            p = parent[p]
        if p == me:
            total += t
    return total


def _files(tables: Path) -> int:
    return sum(1 for _ in tables.rglob("*.parquet"))


def _timed(fn: Callable[[], Any], tables: Path) -> dict[str, float]:
    files, cpu = _files(tables), _tree_cpu()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": _tree_cpu() - cpu, "files": _files(tables) - files}


def _median(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}


def measure(spark: Any, work: Path, batches: list[int], topics: int, changes: int, repeat: int) -> dict:
    from bridge.spark.deltaspark import DeltaSparkEngine
    from bridge.tables.coverage import coverage_metadata
    from bridge.tables.deltars import DeltaRsEngine
    from bridge.tables.writer import write_tables

    makers = {"delta-rs": lambda d: DeltaRsEngine(d), "delta-spark": lambda d: DeltaSparkEngine(d, spark)}

    def step(engine: Any, frames: Any, version: int) -> None:
        last = int(frames["offset"][-1].as_py())
        write_tables(engine, frames, "bench", version, coverage_metadata("mqtt-frames", {0: last}, "bench", version))

    out: dict[str, Any] = {"batches": [], "merge": None}
    for n in batches:
        engines = {}
        for name, make in makers.items():
            d = work / f"batch-{n}-{name}"
            engines[name] = (make(d), d)
            engines[name][0].ensure()
            step(engines[name][0], _frames(n, 0, n, 0.09, 0.01), 0)  # untimed: first files, first plans
        samples: dict[str, list] = {name: [] for name in makers}
        for v in range(1, repeat + 1):
            frames = _frames(n, v * SEQ_STRIDE, n, 0.09, 0.01)
            for name, (engine, d) in engines.items():
                samples[name].append(_timed(lambda: step(engine, frames, v), d))
        out["batches"].append({"rows": n, **{name: _median(s) for name, s in samples.items()}})
        for _, d in engines.values():
            shutil.rmtree(d, ignore_errors=True)
    seed = work / "merge-seed"
    DeltaRsEngine(seed).ensure()
    shutil.rmtree(seed / "retained")
    _seed_retained(seed, topics)
    engines = {}
    for name, make in makers.items():
        d = work / f"merge-{name}"
        shutil.copytree(seed, d)
        engines[name] = (make(d), d)
        engines[name][0].ensure()
    shutil.rmtree(seed)
    samples = {name: [] for name in makers}
    for v in range(repeat):
        frames = _frames(changes, (v + 1) * SEQ_STRIDE, topics, 1.0, 0.0)
        for name, (engine, d) in engines.items():
            samples[name].append(_timed(lambda: step(engine, frames, v), d))
    out["merge"] = {"topics": topics, "changes": changes, **{name: _median(s) for name, s in samples.items()}}
    for _, d in engines.values():
        shutil.rmtree(d, ignore_errors=True)
    return out


def _ratio(row: dict, key: str) -> float | None:
    rs = row["delta-rs"][key]
    return round(row["delta-spark"][key] / rs, 2) if rs else None


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.spark.jars import problems

    bad = problems("delta")
    if bad:
        print(f"lakegate bench tables: {bad[0]}")
        return 2
    scale = 10 if args.quick else 1
    batches = [max(10, int(s) // scale) for s in args.batches.split(",") if s.strip()]
    topics, changes = max(100, args.topics // scale), max(10, args.changes // scale)
    if args.repeat < 1 or not batches:
        print("lakegate bench tables: --repeat and --batches must be positive")
        return 2
    from bridge.spark.session import build_session

    spark = build_session(config, app_name="lakegate-bench-tables")
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lakegate-bench-tables-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(spark, work, batches, topics, changes, args.repeat)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    res["master"] = config.spark.master
    res["repeat"] = args.repeat
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"the job's table step, delta-rs vs delta-spark (Spark {config.spark.master}), "
          f"medians of {args.repeat} batches")
    print(f"{'step':<28} {'engine':<12} {'wall s':>8} {'CPU s':>8} {'files':>6}")
    rows = [(f"batch of {b['rows']:,} rows", b) for b in res["batches"]]
    m = res["merge"]
    rows.append((f"merge {m['changes']:,} into {m['topics']:,}", m))
    for label, row in rows:
        for name in ("delta-rs", "delta-spark"):
            r = row[name]
            print(f"{label if name == 'delta-rs' else '':<28} {name:<12} {r['wall_s']:>8.3f} {r['cpu_s']:>8.2f} "
                  f"{r['files']:>6.0f}")
        print(f"{'':<28} {'ratio':<12} {_ratio(row, 'wall_s') or 0:>8.2f} {_ratio(row, 'cpu_s') or 0:>8.2f}")
    print("ratio = delta-spark / delta-rs (above 1: delta-spark takes longer)")
    return 0
