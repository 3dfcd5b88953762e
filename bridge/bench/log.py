"""``lakegate bench log``: how fast the capture log is, next to the disk under it.

Measures, in one run and on one directory (default: a fresh directory under
``data_dir``, removed afterwards):

* the raw disk: sequential write rate (1 MiB writes, one fdatasync at the
  end) and fsync rate (4 KiB append + fdatasync, one after the other);
* appends per second from one thread under the configured fsync policy
  (``capture.fsync_interval_ms`` / ``fsync_records``; the defaults unless
  overridden with ``--set``), and how long an append waits to become
  durable (p50/p99, from ``append`` returning to its group's fsync);
* the read rate of ``LogReader`` to Arrow (no Spark) and of the Spark source
  (``spark.read.format("lakegate")`` into the ``noop`` sink), records/s and
  MB/s of log bytes.

Payloads are synthetic MQTT PUBLISH frames of ``--payload-bytes``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bridge.config import Config

__all__ = ["add_arguments", "run", "disk_rates"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--records", type=int, default=200_000, help="records to append (default 200000)")
    p.add_argument("--payload-bytes", type=int, default=200, help="size of each synthetic frame (default 200)")
    p.add_argument("--clients", type=int, default=100, help="distinct connections (default 100)")
    p.add_argument("--dir", metavar="DIR", help="where to write (default: a new directory under data_dir)")
    p.add_argument("--keep", action="store_true", help="keep the benchmark's log directory")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark source read")
    p.add_argument("--disk-mib", type=int, default=128, help="MiB written for the raw sequential rate (default 128)")
    p.add_argument("--fsync-seconds", type=float, default=2.0, help="seconds of raw fsync probing (default 2)")


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def disk_rates(directory: Path, write_mib: int = 128, fsync_seconds: float = 2.0) -> dict:
    """Raw sequential write MB/s and fsyncs/s of the disk under ``directory``."""
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = os.urandom(1 << 20)
        t0 = time.perf_counter()
        for _ in range(write_mib):
            os.write(fd, chunk)
        os.fdatasync(fd)
        write_s = time.perf_counter() - t0
        os.ftruncate(fd, 0)
        os.fsync(fd)
        block = os.urandom(4096)
        lat: list[float] = []
        deadline = time.perf_counter() + fsync_seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        fsync_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    lat.sort()
    return {
        "seq_write_mb_s": write_mib * 1.048576 / write_s,
        "fsync_per_s": len(lat) / fsync_s,
        "fsync_p50_ms": _pct(lat, 0.50) * 1e3,
        "fsync_p99_ms": _pct(lat, 0.99) * 1e3,
    }


def _frame(i: int, payload_bytes: int) -> bytes:
    """A QoS 1 PUBLISH frame with ``payload_bytes`` in total (approximately)."""
    topic = f"bench/device/{i % 1000}".encode()
    body_len = max(payload_bytes - 2, len(topic) + 4)
    payload = (b"%08d" % i) * (max(0, body_len - len(topic) - 4) // 8 + 1)
    payload = payload[: max(0, body_len - len(topic) - 4)]
    var = len(topic).to_bytes(2, "big") + topic + (i % 65535 + 1).to_bytes(2, "big") + payload
    n = len(var)
    rl = bytearray()
    while True:
        b, n = n % 128, n // 128
        rl.append(b | (0x80 if n else 0))
        if not n:
            break
    return bytes([0x32]) + bytes(rl) + var


def append_rates(root: Path, config: Config, records: int, payload_bytes: int, clients: int) -> dict:
    from bridge.capture import CaptureLog

    frames = [_frame(i, payload_bytes) for i in range(min(records, 1000))]
    conns = [(f"edge-1:{c}", f"device-{c}".encode(), [
        ("conn_id", f"edge-1:{c}".encode()), ("proto", b"5"), ("remote", f"10.0.{c // 256}.{c % 256}:50000".encode()),
        ("username", f"user{c}".encode()), ("origin", b"client"),
    ]) for c in range(clients)]
    log = CaptureLog.open(root, config.capture)
    t_append: list[float] = []
    group_of: list[int] = []
    done_at: list[float] = []
    last = None
    perf = time.perf_counter
    try:
        t0 = perf()
        for i in range(records):
            conn, key, headers = conns[i % clients]
            ack = log.append(conn, key, frames[i % len(frames)], headers)
            t_append.append(perf())
            if ack.future is not last:
                last = ack.future
                slot = len(done_at)
                done_at.append(0.0)
                last.add_done_callback(lambda _f, slot=slot: done_at.__setitem__(slot, perf()))
            group_of.append(len(done_at) - 1)
        t_appended = perf()
        log.flush()
        t_durable = perf()
        stats = dict(log.stats)
    finally:
        log.close()
    waits = sorted(max(0.0, done_at[g] - t) for g, t in zip(group_of, t_append))
    return {
        "records": records,
        "appends_per_s": records / (t_appended - t0),
        "durable_records_per_s": records / (t_durable - t0),
        "durable_wait_p50_ms": _pct(waits, 0.50) * 1e3,
        "durable_wait_p99_ms": _pct(waits, 0.99) * 1e3,
        "durable_wait_mean_ms": statistics.fmean(waits) * 1e3 if waits else float("nan"),
        "group_commits": stats["commits"],
        "fsyncs": stats["fsyncs"],
        "records_per_commit": records / max(1, stats["commits"]),
        "log_bytes": stats["bytes"],
    }


def read_rates(root: Path) -> dict:
    from bridge.capture import LogReader

    r = LogReader(root)
    durable = r.durable_offsets()
    nbytes = sum(s.bytes for s in r.stats())
    t0 = time.perf_counter()
    n = 0
    for p in range(r.partitions):
        for b in r.arrow_batches(p, r.earliest_offsets()[p], durable[p]):
            n += b.num_rows
    dt = time.perf_counter() - t0
    return {"records": n, "records_per_s": n / dt, "mb_per_s": nbytes / 1e6 / dt, "seconds": dt}


def spark_read_rates(root: Path, config: Config) -> dict:
    from bridge.capture import LogReader
    from bridge.spark.session import build_session
    from bridge.spark.source import register

    spark = build_session(config, app_name="lakegate-bench")
    register(spark)
    r = LogReader(root)
    nbytes = sum(s.bytes for s in r.stats())
    # Warm up (Python workers, planning) on a few records first.
    spark.read.format("lakegate").option("endingOffsets", json.dumps({"0": min(1000, r.durable_offsets()[0])})) \
        .option("startingOffsets", "earliest").load(str(root)).write.format("noop").mode("overwrite").save()
    t0 = time.perf_counter()
    df = spark.read.format("lakegate").load(str(root))
    df.write.format("noop").mode("overwrite").save()
    dt = time.perf_counter() - t0
    n = sum(r.durable_offsets()) - sum(r.earliest_offsets())
    return {"records": n, "records_per_s": n / dt, "mb_per_s": nbytes / 1e6 / dt, "seconds": dt,
            "master": spark.sparkContext.master}


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError

    if min(args.records, args.payload_bytes, args.clients, args.disk_mib) <= 0 or args.fsync_seconds <= 0:
        raise UsageError("--records, --payload-bytes, --clients, --disk-mib and --fsync-seconds must be positive")
    if args.dir:
        base = Path(args.dir).expanduser().resolve()
        if base.exists() and any(base.iterdir()):
            raise UsageError(f"--dir {base}: not empty; give a new or empty directory")
        base.mkdir(parents=True, exist_ok=True)
    else:
        config.data_path.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="bench-log-", dir=config.data_path))
    result: dict = {"dir": str(base), "payload_bytes": args.payload_bytes, "clients": args.clients,
                    "policy": {"partitions": config.capture.partitions,
                               "fsync_interval_ms": config.capture.fsync_interval_ms,
                               "fsync_records": config.capture.fsync_records,
                               "max_pending_bytes": config.capture.max_pending_bytes}}
    try:
        result["disk"] = disk_rates(base, args.disk_mib, args.fsync_seconds)
        log_dir = base / "capture"
        result["append"] = append_rates(log_dir, config, args.records, args.payload_bytes, args.clients)
        result["read"] = read_rates(log_dir)
        if not args.no_spark:
            result["spark_read"] = spark_read_rates(log_dir, config)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    d, a, rd = result["disk"], result["append"], result["read"]
    pol = result["policy"]
    print(f"lakegate bench log: {a['records']} records, {args.payload_bytes}-byte frames, {args.clients} connections, "
          f"{pol['partitions']} partitions, fsync_interval_ms={pol['fsync_interval_ms']}, "
          f"fsync_records={pol['fsync_records']}  ({base})")
    print(f"  disk    sequential write   {d['seq_write_mb_s']:10.1f} MB/s")
    print(f"  disk    fsync              {d['fsync_per_s']:10.0f} /s     "
          f"(4 KiB + fdatasync; p50 {d['fsync_p50_ms']:.2f} ms, p99 {d['fsync_p99_ms']:.2f} ms)")
    print(f"  log     append             {a['appends_per_s']:10.0f} /s     "
          f"(all durable at {a['durable_records_per_s']:.0f} /s; {a['group_commits']} group commits, "
          f"{a['records_per_commit']:.0f} records each, {a['fsyncs']} fsyncs)")
    print(f"  log     durable wait       p50 {a['durable_wait_p50_ms']:.2f} ms, p99 {a['durable_wait_p99_ms']:.2f} ms")
    print(f"  read    LogReader->Arrow   {rd['records_per_s']:10.0f} records/s {rd['mb_per_s']:8.1f} MB/s")
    if "spark_read" in result:
        s = result["spark_read"]
        print(f"  read    Spark source       {s['records_per_s']:10.0f} records/s {s['mb_per_s']:8.1f} MB/s"
              f"  ({s['master']})")
    return 0
