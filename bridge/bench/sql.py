"""``lakegate bench sql``: one query from a fresh client process, through the
Spark Connect endpoint of a running ``lakegate run`` and through a local
Spark session (``sql.connect_port=0``), side by side in one run.

Starts ``lakegate run`` on a temporary data directory (AMQP off, the
endpoint on a free port), publishes ``--topics`` retained messages at QoS 1
and waits until the ``retained`` table holds them; then runs ``lakegate sql
QUERY`` as a new process ``--runs`` times per path, alternating, checks
that each printed the expected count, and reports the wall time of each
(median, min, max) and the ratio local / endpoint. Target (issue 26): the
endpoint path <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bridge.config import Config

__all__ = ["add_arguments", "run"]

ROOT = Path(__file__).resolve().parents[2]
TARGET_S = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=5, help="client processes per path (default 5)")
    p.add_argument("--topics", type=int, default=100, help="retained topics published first (default 100)")
    p.add_argument("--query", default="SELECT count(*) FROM retained")
    p.add_argument("--json", action="store_true")


def _publish(port: int, topics: int) -> None:
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-sql", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [c.publish(f"bench/{i}/state", b"v%d" % i, qos=1, retain=True) for i in range(topics)]
        for info in infos:
            info.wait_for_publish(30)
    finally:
        c.loop_stop()
        c.disconnect()


def _retained_count(tables: Path) -> int:
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(tables / "retained")).to_pyarrow_table(columns=["topic"]).num_rows
    except Exception:  # not created yet
        return 0


def _client(data_dir: Path, port: int, query: str, timeout_s: float = 120.0) -> tuple[float, str, str]:
    cmd = [sys.executable, "-m", "bridge", "sql", "--set", f"data_dir={data_dir}",
           "--set", f"sql.connect_port={port}", "--format", "csv", query]
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise RuntimeError(f"lakegate sql exited {res.returncode}: {res.stderr.strip()[-400:]}")
    return took, res.stdout.strip(), res.stderr.strip()


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.bench.e2e_procs import Lakegate
    from bridge.ports import free_loopback_port
    from bridge.sqlserve.client import endpoint_answers
    from bridge.config import load_config

    if args.runs < 1 or args.topics < 1:
        print("bench sql: --runs and --topics must be positive", file=sys.stderr)
        return 2
    port = free_loopback_port()
    out: dict = {"query": args.query, "runs": args.runs, "topics": args.topics, "target_s": TARGET_S}
    with tempfile.TemporaryDirectory(prefix="lg-bench-sql-") as tmp:
        data = Path(tmp) / "data"
        lg = Lakegate(args, data, Path(tmp) / "run.log")
        extra = ["amqp.url=", f"sql.connect_port={port}"]
        try:
            out["edge_ready_s"] = round(lg.start(extra, timeout=120), 2)
            cfg = load_config(None, [f"data_dir={data}", f"sql.connect_port={port}"], env={})
            deadline = time.monotonic() + 120
            while not endpoint_answers(cfg):
                if time.monotonic() > deadline or lg.proc.poll() is not None:
                    raise RuntimeError(f"the SQL endpoint did not answer: {lg.tail()}")
                time.sleep(0.2)  # start-up poll, bounded
            _publish(lg.port, args.topics)
            while _retained_count(cfg.tables_dir) < args.topics:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the retained table did not reach {args.topics} topics: {lg.tail()}")
                time.sleep(0.2)  # bounded by the deadline
            _client(data, port, args.query)  # the endpoint's first session (its warm-up), not counted
            times: dict[str, list[float]] = {"endpoint": [], "local": []}
            answers = set()
            for _ in range(args.runs):
                for side, p in (("endpoint", port), ("local", 0)):
                    took, stdout, stderr = _client(data, p, args.query)
                    if side == "endpoint" and "starting a local Spark session" in stderr:
                        raise RuntimeError(f"the endpoint path fell back to a local session: {stderr}")
                    times[side].append(took)
                    answers.add(stdout.splitlines()[-1] if stdout else "")
            if len(answers) != 1:
                raise RuntimeError(f"the two paths answered differently: {sorted(answers)}")
            out["answer"] = answers.pop()
        finally:
            lg.stop()
    for side, xs in times.items():
        out[side] = {"median_s": round(statistics.median(xs), 3), "min_s": round(min(xs), 3),
                     "max_s": round(max(xs), 3)}
    out["ratio_local_over_endpoint"] = round(out["local"]["median_s"] / out["endpoint"]["median_s"], 2)
    out["target_met"] = out["endpoint"]["median_s"] <= TARGET_S
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"bench sql: {args.query!r} from a new client process, {args.runs} runs per path "
          f"({args.topics} retained topics; answer {out['answer']})")
    for side, label in (("endpoint", "Spark Connect endpoint of lakegate run"), ("local", "local Spark session")):
        r = out[side]
        print(f"  {label:<40} median {r['median_s']:6.2f} s  (min {r['min_s']:.2f}, max {r['max_s']:.2f})")
    print(f"  ratio local / endpoint: {out['ratio_local_over_endpoint']:.1f}x; target endpoint <= {TARGET_S:.0f} s: "
          f"{'met' if out['target_met'] else 'NOT met'}")
    return 0
