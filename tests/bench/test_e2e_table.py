"""``bench e2e``'s publish -> ``messages`` watch (bridge/bench/e2e_table.py)
against a real Delta table written by delta-rs: each message is timed by
the first poll that saw its version, a compaction's rewrite is not counted
again, versions from before the watch are not the phase's."""

from __future__ import annotations

import array
import time
from types import SimpleNamespace

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from bridge.bench.e2e_table import TableWatch

BASE = "lgb/c/lat/"


def _rows(conn: int, seqs: range, prefix: str = BASE) -> pa.Table:
    return pa.table({"topic": [f"{prefix}{conn:04d}"] * len(seqs),
                     "payload": [k.to_bytes(8, "big") + b"p" * 8 for k in seqs]})


def _phase(sent: list[int], t0: float) -> SimpleNamespace:
    conns = []
    for n in sent:
        conns.append(SimpleNamespace(sent=n, acked=n, send_t=array.array("d", [t0] * n)))
    return SimpleNamespace(topic_base=BASE, conns=conns)


def test_each_message_is_timed_by_the_first_poll_that_saw_its_version(tmp_path):
    path = tmp_path / "messages"
    write_deltalake(str(path), _rows(0, range(0, 3), prefix="lgb/c/warm/"))  # before the watch
    watch = TableWatch(path, BASE)
    assert watch.poll() == 0
    t0 = time.perf_counter()
    write_deltalake(str(path), _rows(0, range(0, 5)), mode="append")
    write_deltalake(str(path), _rows(1, range(0, 5)), mode="append")
    assert watch.poll() == 2
    t1 = time.perf_counter()
    write_deltalake(str(path), _rows(0, range(5, 8)), mode="append")
    DeltaTable(str(path)).optimize.compact()  # rewrites every file: dataChange false, not new rows
    assert watch.poll() == 2
    r = watch.latency(_phase([8, 5], t0))
    assert r["in_table"] == r["acknowledged"] == 13 and r["table_duplicates"] == 0
    assert "read_errors" not in r
    lat = r["table_ms"]
    assert 0 < lat["p50"] <= (t1 - t0) * 1000 < lat["max"]  # ten in the first poll, three in the second


def test_messages_not_there_are_counted_missing(tmp_path):
    path = tmp_path / "messages"
    write_deltalake(str(path), _rows(0, range(0, 1), prefix="other/"))
    watch = TableWatch(path, BASE)
    write_deltalake(str(path), _rows(0, range(0, 4)), mode="append")
    watch.poll()
    r = watch.latency(_phase([6], time.perf_counter()))
    assert r["in_table"] == 4 and r["acknowledged"] == 6
