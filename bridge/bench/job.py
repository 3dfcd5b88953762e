"""``lakegate bench job``: the streaming job's cost per micro-batch next to
Spark's floor, measured side by side in one run (issue 25).

A capture log is filled once by a real edge (``--records`` QoS 1 PUBLISHes
of ``--payload-bytes`` from one client over 10 topics). Then, in one local
Spark session, alternating ``--repeat`` times, each with a fresh checkpoint
over a copy of that log and the same trigger (``processingTime`` of
``job.trigger_interval_s``, ``maxRecordsPerTrigger`` = ``--batch``, by
default what ``--rate`` (200 msg/s) brings in one trigger: 1,000 records
at the default 5 s):

* **floor**: ``spark.readStream.format("lakegate")`` into a
  ``foreachBatch`` that only does ``toArrow()`` and returns;
* **job**: the lakegate job as ``lakegate run`` starts it
  (``bridge.job.pipeline.start_query``: the pandas UDF parser, the Delta
  tables under the app transaction; forwarding in the job only when it
  forwards in ``lakegate run``: ``amqp.forward_by = "job"``, since the
  default forwards live, outside the micro-batch, ``bridge.amqp.live``).

Per batch: wall time (Spark's ``triggerExecution``) and its parts
(``latestOffset``, ``getBatch``, ``queryPlanning``, ``walCommit`` -- the
offset log --, ``addBatch`` -- the foreachBatch --, ``commitOffsets`` -- the
commit log), and the CPU seconds of the whole process tree (this Python
driver, the Spark JVM, its Python workers) from one batch's end to the
next. The first ``--warmup`` batches of each run are left out (Spark
plans, JIT). Then ``--idle`` seconds without data and one more batch: the
first batch after an idle period, against the warm median.

Printed: p50/p99 per side, the job/floor ratios, and where the job's time
goes. The issue's targets: wall and CPU per batch <= 1.5 x the floor's;
first batch after idle <= 1.5 x a warm one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bridge.config import Config

__all__ = ["add_arguments", "run"]

#: batches per run when --records is not given (the first --warmup are left out)
BATCHES = 15

PARTS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--rate", type=float, default=200.0,
                   help="the message rate a batch stands for, msg/s (default 200): --batch defaults to it "
                        "times job.trigger_interval_s")
    p.add_argument("--batch", type=int, default=None,
                   help="records per micro-batch, maxRecordsPerTrigger (default --rate x the trigger: "
                        "1,000 at the default 5 s)")
    p.add_argument("--records", type=int, default=None,
                   help=f"records in the capture log (default {BATCHES} batches' worth)")
    p.add_argument("--repeat", type=int, default=2, help="runs per side, alternating (default 2)")
    p.add_argument("--warmup", type=int, default=2, help="first batches of a run left out (default 2)")
    p.add_argument("--idle", type=float, default=60.0,
                   help="seconds without data before the idle batch (default 60; 0: not measured)")
    p.add_argument("--payload-bytes", type=int, default=64, help="payload size (default 64)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most")


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _tree_cpu() -> float:
    """CPU seconds of this process and every descendant, alive or reaped."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def _fill(data_dir: Path, records: int, payload_bytes: int) -> None:
    """``records`` QoS 1 PUBLISHes through a real edge into ``data_dir/capture``."""
    from bridge.config import load_config
    from bridge.edge.thread import EdgeThread
    from bridge.mqtt import Connect, Properties, Publish, encode

    cfg = load_config(None, [f"data_dir={data_dir}", "edge.port=0", "log_level=WARNING"], env={})
    edge = EdgeThread(cfg).start()
    try:
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=30)
        s.sendall(encode(Connect(protocol_level=5, client_id="bench-job", clean_start=True), 5))
        if s.recv(64)[:1] != b"\x20":
            raise RuntimeError("the edge did not answer the bench's CONNECT with CONNACK")
        payload = b"x" * payload_bytes
        frames = [encode(Publish(qos=1, retain=False, topic=f"bench/job/{i % 10}",
                                 packet_id=i % 65535 + 1, payload=payload, properties=Properties()), 5)
                  for i in range(records)]
        acked = 0
        done = threading.Event()

        def read() -> None:
            nonlocal acked
            buf = b""
            while acked < records:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                n = len(buf) // 4  # PUBACK without properties: 4 bytes
                acked += n
                buf = buf[n * 4:]
            done.set()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        window = 500  # within the edge's Receive Maximum
        deadline = time.monotonic() + 120
        for start in range(0, records, window):
            while acked < start - window and time.monotonic() < deadline:
                time.sleep(0.005)
            s.sendall(b"".join(frames[start:start + window]))
        if not done.wait(max(0.0, deadline - time.monotonic())) or acked < records:
            raise RuntimeError(f"the edge acknowledged {acked} of {records} PUBLISHes")
        s.close()
    finally:
        edge.stop()


class _Meter:
    """Progress events of one query, with the process tree's CPU at each."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def on_progress(self, progress) -> None:
        cpu, wall = _tree_cpu(), time.monotonic()
        with self.lock:
            self.events.append({"batch": progress.batchId, "rows": progress.numInputRows,
                                "durations": dict(progress.durationMs or {}), "cpu": cpu, "wall": wall})


def _listener_class():
    from bridge.spark.listener import JsonEventListener  # as the job's own listener

    class Listener(JsonEventListener):
        def __init__(self) -> None:
            self.meters: dict[str, _Meter] = {}

        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            m = self.meters.get(str(event.progress.id))
            if m is not None:
                m.on_progress(event.progress)

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            pass

    return Listener


def _start_floor(spark, config: Config, checkpoint: Path, batch: int):
    from bridge.spark.source import register
    from schemas.capture import CAPTURE_RECORD_DDL

    register(spark)
    return (spark.readStream.format("lakegate").schema(CAPTURE_RECORD_DDL).option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", batch).load(str(config.capture_dir))
            .writeStream.foreachBatch(lambda df, i: df.toArrow())
            .option("checkpointLocation", str(checkpoint)).queryName(f"floor-{checkpoint.name}")
            .trigger(processingTime=f"{config.job.trigger_interval_s} seconds").start())


def _side_config(base: Path, run_dir: Path, config: Config, batch: int) -> Config:
    from bridge.config import load_config

    run_dir.mkdir(parents=True)
    shutil.copytree(base / "capture", run_dir / "capture")  # every run reads the same records
    sets = [f"data_dir={run_dir}", f"job.max_records_per_trigger={batch}",
            f"job.trigger_interval_s={config.job.trigger_interval_s}", f"job.query_name=bench{run_dir.name}",
            f"job.forward_on_driver_max_rows={config.job.forward_on_driver_max_rows}",
            f"job.parse_on_driver_max_rows={config.job.parse_on_driver_max_rows}",
            f"amqp.url={config.amqp.url}", f"amqp.forward_by={config.amqp.forward_by}", "log_level=WARNING"]
    return load_config(None, sets, env={})


def _job_forwards(config: Config) -> bool:
    """Whether the job forwards as ``lakegate run`` starts it (not with live
    forwarding, its default: ``amqp.forward_by = "job"`` to measure the job's)."""
    from bridge.amqp.live import forwards_live
    from bridge.job.pipeline import job_forwards

    return job_forwards(config, live_elsewhere=forwards_live(config, hosts_edge=True, runs_job=True))


def _run_side(spark, listener, side: str, base: Path, run_dir: Path, config: Config,
              args: argparse.Namespace) -> dict:
    from bridge.job.pipeline import progress_listener, release, start_query

    cfg = _side_config(base, run_dir, config, args.batch)
    meter = _Meter()
    steps: dict[int, dict] = {}  # the job's own timing per batch (bridge.job.batch)
    if side == "floor":
        query = _start_floor(spark, cfg, run_dir / "checkpoint", args.batch)
    else:
        pl = progress_listener(spark, cfg)
        record = pl.record

        def record_and_keep(stats) -> None:
            steps[stats.batch_id] = dict(stats.extra.get("timing_s") or {})
            record(stats)

        pl.record = record_and_keep
        query = start_query(spark, cfg, listener=pl, forwarding=_job_forwards(cfg))
    listener.meters[str(query.id)] = meter
    deadline = time.monotonic() + args.timeout
    in_log = _log_records(run_dir)  # the PUBLISHes, and the CONNECT and close the edge captured too
    expected = -(-in_log // args.batch)
    try:
        while time.monotonic() < deadline:
            with meter.lock:
                rows = sum(e["rows"] for e in meter.events)
            if rows >= in_log:
                break
            if query.exception() is not None:
                raise RuntimeError(f"{side} query failed: {query.exception()}")
            time.sleep(0.2)
        idle_event = None
        if args.idle > 0:
            time.sleep(args.idle)
            n_before = len(meter.events)
            _fill(run_dir, args.batch, args.payload_bytes)  # one batch's worth more, to this run's copy
            while time.monotonic() < deadline + args.idle:
                with meter.lock:
                    fresh = [e for e in meter.events[n_before:] if e["rows"] > 0]
                if fresh:
                    idle_event = fresh[0]
                    break
                time.sleep(0.1)
    finally:
        query.stop()
        if side == "job":
            release(spark)
    events = [e for e in meter.events if e["rows"] > 0]
    # CPU of a batch: from the previous progress event (any, empty ones too) to its own
    cpu_of = {}
    prev = None
    for e in meter.events:
        if prev is not None:
            cpu_of[id(e)] = e["cpu"] - prev["cpu"]
        prev = e
    warm = events[args.warmup:expected]
    walls = [e["durations"].get("triggerExecution", 0) / 1000 for e in warm]
    cpus = [cpu_of[id(e)] for e in warm if id(e) in cpu_of]
    parts = {k: statistics.median([e["durations"].get(k, 0) / 1000 for e in warm]) for k in PARTS} if warm else {}
    inside = {}
    if steps:
        keys = sorted({k for e in warm for k in steps.get(e["batch"], {})})
        inside = {k: round(statistics.median([steps.get(e["batch"], {}).get(k, 0) for e in warm]), 3)
                  for k in keys}
    empty = [e for e in meter.events if e["rows"] == 0]
    out = {"batches": len(events), "warm_batches": len(warm),
           "wall_p50_s": _pct(walls, 0.5), "wall_p99_s": _pct(walls, 0.99),
           "cpu_p50_s": _pct(cpus, 0.5), "cpu_p99_s": _pct(cpus, 0.99),
           "parts_p50_s": {k: round(v, 3) for k, v in parts.items()},
           "foreach_batch_p50_s": inside,
           "empty_batches": len(empty)}
    if idle_event is not None:
        out["after_idle_wall_s"] = idle_event["durations"].get("triggerExecution", 0) / 1000
        out["after_idle_parts_s"] = {k: idle_event["durations"].get(k, 0) / 1000 for k in PARTS}
    return out


def _log_records(base: Path) -> int:
    from bridge.capture.reader import LogReader

    return sum(LogReader(base / "capture").durable_offsets())


def _sizes(args: argparse.Namespace, config: Config) -> argparse.Namespace:
    """--batch and --records from --rate and the trigger when not given: a
    batch is what ``--rate`` msg/s bring in one trigger interval."""
    from bridge.cli import UsageError

    args = argparse.Namespace(**vars(args))
    if args.rate <= 0:
        raise UsageError(f"bench job: --rate must be positive, got {args.rate:g}")
    if args.batch is None:
        args.batch = max(1, round(args.rate * config.job.trigger_interval_s))
    if args.records is None:
        args.records = BATCHES * args.batch
    if args.batch < 1 or args.records < 1:
        raise UsageError(f"bench job: --batch and --records must be at least 1, got {args.batch} and {args.records}")
    return args


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.spark.session import build_session

    args = _sizes(args, config)
    with tempfile.TemporaryDirectory(prefix="lg-bench-job-") as tmp:
        base = Path(tmp) / "log"
        t0 = time.monotonic()
        _fill(base, args.records, args.payload_bytes)
        fill_s = time.monotonic() - t0
        spark = build_session(config, app_name="lakegate-bench-job")
        listener = _listener_class()()
        spark.streams.addListener(listener)
        runs: dict[str, list[dict]] = {"floor": [], "job": []}
        try:
            for i in range(args.repeat):
                for side in ("floor", "job"):
                    run_dir = Path(tmp) / f"{side}{i}-{uuid.uuid4().hex[:6]}"
                    runs[side].append(_run_side(spark, listener, side, base, run_dir, config, args))
        finally:
            spark.streams.removeListener(listener)
    med: dict[str, dict] = {}
    for side, rs in runs.items():
        def m(key: str) -> float | None:
            xs = [r[key] for r in rs if r.get(key) is not None]
            return round(statistics.median(xs), 3) if xs else None
        med[side] = {k: m(k) for k in ("wall_p50_s", "wall_p99_s", "cpu_p50_s", "cpu_p99_s", "after_idle_wall_s")}
        med[side]["parts_p50_s"] = {k: round(statistics.median([r["parts_p50_s"].get(k, 0) for r in rs]), 3)
                                    for k in PARTS}
        inside_keys = sorted({k for r in rs for k in r["foreach_batch_p50_s"]})
        med[side]["foreach_batch_p50_s"] = {k: round(statistics.median([r["foreach_batch_p50_s"].get(k, 0)
                                                                        for r in rs]), 3) for k in inside_keys}
        med[side]["runs"] = rs

    def ratio(key: str) -> float | None:
        a, b = med["job"].get(key), med["floor"].get(key)
        return round(a / b, 2) if a is not None and b else None

    result = {"records": args.records, "batch": args.batch, "trigger_s": config.job.trigger_interval_s,
              "rate": round(args.batch / config.job.trigger_interval_s, 1),
              "forward_on_driver_max_rows": config.job.forward_on_driver_max_rows,
              "repeat": args.repeat, "forwarding": _job_forwards(config), "fill_s": round(fill_s, 1),
              **med, "ratio_wall_p50": ratio("wall_p50_s"), "ratio_cpu_p50": ratio("cpu_p50_s"),
              "ratio_wall_p99": ratio("wall_p99_s")}
    for side in ("floor", "job"):
        warm, idle = med[side]["wall_p50_s"], med[side]["after_idle_wall_s"]
        result[f"{side}_idle_over_warm"] = round(idle / warm, 2) if idle and warm else None
    if args.json:
        print(json.dumps(result))
        return 0
    if _job_forwards(config):
        forwarding = f"the job forwards (from the driver up to {config.job.forward_on_driver_max_rows} rows)"
    elif config.amqp.url:
        forwarding = "forwarding live, outside the job (amqp.forward_by=job: in the job)"
    else:
        forwarding = "forwarding off"
    print(f"bench job: {args.records} records, {args.batch} per batch, trigger "
          f"{config.job.trigger_interval_s:g} s ({result['rate']:g} msg/s), {forwarding}, {args.repeat} runs per side (medians)")
    for side in ("floor", "job"):
        s = med[side]
        print(f"  {side:5s} wall p50 {s['wall_p50_s']} s p99 {s['wall_p99_s']} s  "
              f"CPU p50 {s['cpu_p50_s']} s p99 {s['cpu_p99_s']} s  "
              f"first batch after {args.idle:g} s idle {s['after_idle_wall_s']} s")
        print("        parts p50: " + ", ".join(f"{k} {v}" for k, v in s["parts_p50_s"].items()))
        if s["foreach_batch_p50_s"]:
            print("        inside addBatch p50: "
                  + ", ".join(f"{k} {v}" for k, v in s["foreach_batch_p50_s"].items()))
    print(f"  job/floor: wall p50 {result['ratio_wall_p50']}, p99 {result['ratio_wall_p99']}, "
          f"CPU p50 {result['ratio_cpu_p50']} (target <= 1.5)")
    print(f"  after idle / warm: floor {result['floor_idle_over_warm']}, job {result['job_idle_over_warm']} "
          f"(target <= 1.5)")
    return 0
