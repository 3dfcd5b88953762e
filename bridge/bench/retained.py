"""``lakegate bench retained``: the table step against bare delta-rs.

For retained tables of 10k, 100k and 1M topics: one micro-batch of 10k
retained publishes (updates of existing topics and zero-byte deletes) applied
by lakegate (the retained rule + the MERGE with its replay check and app
transaction) next to a bare delta-rs MERGE of the same rows on an identical
copy of the table. Then the append of 100k rows to ``messages`` by lakegate
next to a bare ``write_deltalake`` append. Rows/s and the ratio, measured side
by side in one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bridge.config import Config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="10000,100000,1000000", help="retained table sizes (topics), comma separated")
    p.add_argument("--changes", type=int, default=10000, help="retained publishes in the micro-batch")
    p.add_argument("--append-rows", type=int, default=100000, help="rows appended to messages")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dir", help="work directory (default: a temporary directory, removed afterwards)")


def _publishes(n: int, topics: int, seq0: int, delete_every: int = 5) -> pa.Table:
    """n retained publishes over existing topics; every delete_every-th is a zero-byte delete."""
    from bridge.tables.rows import MESSAGES_SCHEMA

    rng = np.random.default_rng(7)
    idx = rng.choice(topics, size=n, replace=False) if n <= topics else rng.integers(0, topics, n)
    now = dt.datetime.now(dt.timezone.utc)
    payloads = [b"" if i % delete_every == 0 else b"v%08d" % i for i in range(n)]
    cols = {
        "stream": ["mqtt-frames"] * n, "partition": [0] * n, "offset": list(range(seq0, seq0 + n)),
        "seq": list(range(seq0, seq0 + n)), "receive_time": [now] * n, "receive_date": [now.date()] * n,
        "conn_id": ["c"] * n, "client_id": ["bench"] * n, "username": [None] * n, "protocol_level": [5] * n,
        "origin": ["client"] * n, "duplicate": [False] * n, "dup": [False] * n, "qos": [1] * n,
        "retain": [True] * n, "topic": [f"site/{i % 100}/dev/{i}/status" for i in idx], "topic_alias": [None] * n,
        "packet_id": [1] * n, "payload": payloads, "payload_size": [len(p) for p in payloads],
        "payload_format_indicator": [None] * n, "message_expiry_interval": [None] * n,
        "response_topic": [None] * n, "correlation_data": [None] * n, "user_properties": [[]] * n,
        "subscription_identifiers": [[]] * n, "content_type": [None] * n,
    }
    return pa.Table.from_pydict(cols, schema=MESSAGES_SCHEMA)


def _seed_retained(path: Path, topics: int) -> None:
    from deltalake import write_deltalake

    from bridge.tables.retained_rule import retained_changes

    batch = 200_000
    for start in range(0, topics, batch):
        n = min(batch, topics - start)
        t = _publishes(n, topics, start, delete_every=10**12)  # no deletes while seeding
        t = t.set_column(t.schema.get_field_index("topic"), "topic",
                         pa.array([f"site/{i % 100}/dev/{i}/status" for i in range(start, start + n)]))
        write_deltalake(str(path), retained_changes(t), mode="append")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(work: Path, sizes: list[int], changes: int, append_rows: int) -> dict:
    from deltalake import DeltaTable, write_deltalake

    from bridge.tables.deltars import DeltaRsEngine
    from bridge.tables.retained_rule import retained_changes
    from bridge.tables.rows import MESSAGES_SCHEMA

    results: dict = {"merge": [], "append": {}}
    # Warm up both paths (first-use costs of the query engine) on a small table.
    warm = work / "warm"
    DeltaRsEngine(warm).ensure()
    _seed_retained(warm / "retained", 1000)
    DeltaRsEngine(warm).merge_retained(retained_changes(_publishes(100, 1000, seq0=10**6)), "warm", 0)
    DeltaTable(str(warm / "retained")).merge(retained_changes(_publishes(100, 1000, seq0=2 * 10**6)),
        predicate="t.topic = s.topic", source_alias="s", target_alias="t").when_matched_update_all().execute()
    shutil.rmtree(warm)
    for size in sizes:
        ours_dir, bare_dir = work / f"ours-{size}", work / f"bare-{size}"
        engine = DeltaRsEngine(ours_dir)
        engine.ensure()
        _seed_retained(ours_dir / "retained", size)
        shutil.copytree(ours_dir / "retained", bare_dir / "retained")
        batch = _publishes(changes, size, seq0=10 * size + 1)
        t_ours = _timed(lambda: engine.merge_retained(retained_changes(batch), "bench", 0))
        # Bare delta-rs: the same rows, already reduced to one per topic, one MERGE.
        src = retained_changes(batch)
        t_bare = _timed(lambda: DeltaTable(str(bare_dir / "retained")).merge(
            src, predicate="t.topic = s.topic", source_alias="s", target_alias="t")
            .when_matched_update_all().when_not_matched_insert_all().execute())
        results["merge"].append({
            "topics": size, "changes": changes,
            "lakegate_rows_per_s": round(changes / t_ours), "bare_rows_per_s": round(changes / t_bare),
            "ratio": round(t_bare / t_ours, 3),
        })
        shutil.rmtree(ours_dir)
        shutil.rmtree(bare_dir)
    ours_dir, bare_dir = work / "ours-append", work / "bare-append"
    engine = DeltaRsEngine(ours_dir)
    engine.ensure()
    DeltaRsEngine(bare_dir).ensure()
    rows = _publishes(append_rows, append_rows, seq0=1, delete_every=10**12)
    if rows.schema != MESSAGES_SCHEMA:
        raise RuntimeError("bench retained: generated rows do not have the messages schema")
    t_ours = _timed(lambda: engine.append("messages", rows, "bench", 0))
    t_bare = _timed(lambda: write_deltalake(str(bare_dir / "messages"), rows, mode="append", partition_by=["receive_date"]))
    results["append"] = {"rows": append_rows, "lakegate_rows_per_s": round(append_rows / t_ours),
                         "bare_rows_per_s": round(append_rows / t_bare), "ratio": round(t_bare / t_ours, 3)}
    return results


def run(args: argparse.Namespace, config: Config) -> int:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lakegate-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(tmp, sizes, args.changes, args.append_rows)
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
        return 0
    print("retained MERGE: one micro-batch of retained publishes (updates + zero-byte deletes)")
    print(f"{'topics':>10} {'changes':>8} {'lakegate rows/s':>16} {'bare delta-rs rows/s':>21} {'ratio':>6}")
    for r in res["merge"]:
        print(f"{r['topics']:>10} {r['changes']:>8} {r['lakegate_rows_per_s']:>16} {r['bare_rows_per_s']:>21} {r['ratio']:>6}")
    a = res["append"]
    print(f"messages append: {a['rows']} rows: lakegate {a['lakegate_rows_per_s']} rows/s, "
          f"bare write_deltalake {a['bare_rows_per_s']} rows/s, ratio {a['ratio']}")
    print("ratio = lakegate rate / bare rate (1.0 = no overhead)")
    return 0
