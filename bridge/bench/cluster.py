"""``lakegate bench cluster``: 1, 2 and 3 edges of a cluster on one Kafka,
next to one Mosquitto, with the same load generators, in one run
(``docs/cluster.md``, issue 43).

For each size in ``--edges`` (default 1,2,3) the bench starts that many
``lakegate edge`` processes (``cluster.edges`` = size, a fresh topic of
``--partitions`` partitions on the Kafka at ``--kafka-servers``, deleted
after) and measures, then stops them:

* **publish**: msg/s the cluster accepts at QoS 0 and acknowledges at QoS 1,
  ``bench edge``'s load generator with its connections spread over the
  edges (one generator per edge, at once; the rate is all messages over the
  slowest generator's time);
* **fan-out**: messages delivered per second at QoS 1 to ``--subscribers``
  subscribers spread over the edges, one publisher on edge 0 (``bench
  subscribe``'s closed-loop generator), for ``--seconds``;
* **cross-edge latency**: one publisher on edge 0 at ``--latency-rate``
  msg/s QoS 1, one subscriber on the last edge: publish -> subscriber
  p50/p99 (CLOCK_MONOTONIC on both ends).

Mosquitto (one process, the same three measurements) is the reference.
Each measurement runs ``--runs`` times; the median run is reported, every
run's figure beside it. The CPU seconds each process used (each edge,
Kafka, Mosquitto, the generator) are given per measurement, so the reader
sees what limits a size on this machine. Targets (reported, never an
error): 2 edges deliver at least 1.6x one edge's QoS 1 fan-out where CPU
allows; cross-edge p99 at most 25 ms at 1,000 msg/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bridge.config import Config

__all__ = ["add_arguments", "run"]

TARGET_FANOUT_2 = 1.6
TARGET_P99_MS = 25.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--edges", default="1,2,3", help="cluster sizes to measure, comma-separated (default 1,2,3)")
    p.add_argument("--kafka-servers", default="127.0.0.1:9092", help="the Kafka (default 127.0.0.1:9092)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of each size's topic (default 6)")
    p.add_argument("--connections", type=int, default=6, help="publishing connections in all (default 6)")
    p.add_argument("--messages", type=int, default=60_000, help="QoS 0 messages per publish run (default 60000)")
    p.add_argument("--acked-messages", type=int, default=30_000,
                   help="QoS 1 messages per publish run (default 30000)")
    p.add_argument("--subscribers", type=int, default=12, help="fan-out subscribers (default 12)")
    p.add_argument("--seconds", type=float, default=6.0, help="seconds of each fan-out run (default 6)")
    p.add_argument("--latency-rate", type=float, default=1000.0, help="msg/s of the latency run (default 1000)")
    p.add_argument("--latency-seconds", type=float, default=6.0, help="seconds of the latency run (default 6)")
    p.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is reported (default 3)")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds each run may take (default 90)")
    p.add_argument("--no-mosquitto", action="store_true", help="measure the cluster only")


# ---------------------------------------------------------------- processes
def _cpu(pids: list[int]) -> float:
    from bridge.bench.edge import _cpu_seconds

    return sum(_cpu_seconds(p) or 0.0 for p in pids)


def _kafka_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "kafka.Kafka"], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _start_cluster(args, config: Config, n: int, topic: str, workdir: Path) -> list[tuple[subprocess.Popen, int]]:
    from bridge.bench.edge import start_edge

    edges = []
    for i in range(n):
        sets = ["capture.backend=kafka", f"kafka.bootstrap_servers={args.kafka_servers}", f"kafka.topic={topic}",
                "kafka.create_topic=true", f"capture.partitions={args.partitions}", f"cluster.edges={n}",
                f"cluster.edge_id={i}", "amqp.url="]
        log = open(workdir / f"edge{n}-{i}.log", "ab")
        try:
            edges.append(start_edge(args, workdir / f"data{n}-{i}", port=0, stderr=log, extra_sets=sets))
        finally:
            log.close()
    return edges


def _delete_topic(servers: str, topic: str) -> None:
    try:
        from confluent_kafka.admin import AdminClient

        AdminClient({"bootstrap.servers": servers}).delete_topics([topic], operation_timeout=10)[topic].result(15)
    except Exception:  # noqa: BLE001 - a leftover topic is only a leftover
        pass


# ---------------------------------------------------------------- measurements
async def _publish(args, ports: list[int], qos: int, messages: int, label: str) -> dict:
    from bridge.bench.edge import LoadGenerator

    per = max(1, args.connections // len(ports))
    gens = [LoadGenerator("127.0.0.1", port, per, 64, 250, args.timeout) for port in ports]
    n = messages // len(ports)
    results = await asyncio.gather(*(g.phase(qos, n, f"{label}e{i}") for i, g in enumerate(gens)))
    done = sum(r["messages"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return {"messages": done, "seconds": seconds, "msgs_per_s": round(done / seconds, 1) if seconds else None,
            "complete": all(r["complete"] for r in results)}


async def _fanout(args, ports: list[int], label: str) -> dict:
    from bridge.bench.subload import FanOut

    r = await FanOut("127.0.0.1", ports[0], label=label, subscribers=args.subscribers, qos=1,
                     seconds=args.seconds, timeout=args.timeout, sub_ports=ports).run()
    return {k: r.get(k) for k in ("delivered", "expected", "delivered_per_s", "duplicates", "gaps", "complete",
                                  "error") if r.get(k) is not None}


async def _latency(args, ports: list[int], label: str) -> dict:
    from bridge.bench.subload import FanOut

    f = FanOut("127.0.0.1", ports[0], label=label, subscribers=1, qos=1, seconds=args.latency_seconds,
               rate=args.latency_rate, record_latency=True, warmup_s=1.0, timeout=args.timeout,
               sub_ports=[ports[-1]])
    r = await f.run()
    lat = sorted(f.latencies)
    out = {"messages": r.get("delivered"), "complete": r.get("complete")}
    if lat:
        out["p50_ms"] = round(lat[len(lat) // 2] / 1e6, 3)
        out["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6, 3)
    return out


def _median(runs: list[dict], key: str) -> dict:
    ok = sorted((r for r in runs if r.get(key) is not None), key=lambda r: r[key])
    out = dict(ok[len(ok) // 2] if ok else runs[0])
    out["runs"] = [r.get(key) for r in runs]
    out["complete"] = all(r.get("complete") for r in runs)
    return out


def _measure(args, ports: list[int], pids: dict[str, int], label: str) -> dict:
    """The measurements, ``--runs`` each, with the CPU seconds of ``pids``
    (name -> pid) and of this process (the generators)."""
    out = {}
    steps = [("publish_qos0", lambda i: _publish(args, ports, 0, args.messages, f"{label}p0{i}"), "msgs_per_s"),
             ("publish_qos1", lambda i: _publish(args, ports, 1, args.acked_messages, f"{label}p1{i}"), "msgs_per_s"),
             ("fanout_qos1", lambda i: _fanout(args, ports, f"{label}f{i}"), "delivered_per_s"),
             ("latency", lambda i: _latency(args, ports, f"{label}l{i}"), "p99_ms")]
    for name, make, key in steps:
        runs = []
        for i in range(args.runs):
            c0 = {name: _cpu([pid]) for name, pid in pids.items()}
            g0 = time.process_time()
            try:
                r = asyncio.run(make(i))
            except (OSError, asyncio.TimeoutError, RuntimeError) as exc:
                r = {"complete": False, "error": f"{type(exc).__name__}: {exc}"}
            r["cpu_s"] = {name: round(_cpu([pid]) - c0[name], 2) for name, pid in pids.items()}
            r["cpu_s"]["generator"] = round(time.process_time() - g0, 2)
            runs.append(r)
        out[name] = _median(runs, key)
    return out


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.bench.edge import _stop, start_mosquitto
    from bridge.cli import UsageError

    try:
        sizes = [int(x) for x in args.edges.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--edges {args.edges!r}: cluster sizes, e.g. 1,2,3") from None
    if not sizes or min(sizes) < 1 or max(sizes) > args.partitions:
        raise UsageError("--edges: sizes from 1 to --partitions")
    if min(args.runs, args.subscribers, args.connections) < 1:
        raise UsageError("--runs, --subscribers and --connections must be positive")
    result: dict = {"sizes": {}, "mosquitto": None, "targets": {}, "machine": {"cpus": os.cpu_count()}}
    kafka = _kafka_pids()
    with tempfile.TemporaryDirectory(prefix="lakegate-bench-cluster-") as tmp:
        work = Path(tmp)
        for n in sizes:
            topic = f"lg-bench-cluster-{n}-{uuid.uuid4().hex[:8]}"
            edges = _start_cluster(args, config, n, topic, work)
            try:
                time.sleep(2.0)  # the edges' first beats
                ports = [port for _p, port in edges]
                pids = {f"edge{i}": p.pid for i, (p, _port) in enumerate(edges)}
                pids.update({f"kafka{j}": pid for j, pid in enumerate(kafka)})
                m = _measure(args, ports, pids, f"c{n}")
                result["sizes"][str(n)] = m
            finally:
                for p, _port in edges:
                    _stop(p)
                _delete_topic(args.kafka_servers, topic)
        if not args.no_mosquitto:
            proc, port = start_mosquitto(work, settings="max_inflight_messages 0\nmax_queued_messages 0\n")
            try:
                m = _measure(args, [port], {"mosquitto": proc.pid}, "mq")
                result["mosquitto"] = m
            finally:
                _stop(proc)
    one = result["sizes"].get("1", {}).get("fanout_qos1", {}).get("delivered_per_s")
    two = result["sizes"].get("2", {}).get("fanout_qos1", {}).get("delivered_per_s")
    if one and two:
        result["targets"]["fanout_2_over_1"] = {"value": round(two / one, 3), "target": TARGET_FANOUT_2,
                                                "met": two / one >= TARGET_FANOUT_2}
    cross = [(n, s["latency"].get("p99_ms")) for n, s in result["sizes"].items() if n != "1"]
    for n, p99 in cross:
        if p99 is not None:
            result["targets"][f"cross_edge_p99_ms_{n}"] = {"value": p99, "target": TARGET_P99_MS,
                                                           "met": p99 <= TARGET_P99_MS}
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


def _print(result: dict) -> None:
    rows = [("publish QoS 0 msg/s", "publish_qos0", "msgs_per_s"), ("publish QoS 1 msg/s", "publish_qos1",
                                                                      "msgs_per_s"),
            ("fan-out QoS 1 delivered/s", "fanout_qos1", "delivered_per_s"),
            ("cross-edge latency p50 ms", "latency", "p50_ms"), ("cross-edge latency p99 ms", "latency", "p99_ms")]
    cols = [(f"{n} edge{'s' if n != '1' else ''}", s) for n, s in result["sizes"].items()]
    if result["mosquitto"] is not None:
        cols.append(("Mosquitto", result["mosquitto"]))
    print("lakegate bench cluster (medians; each run's figure in --json)")
    print(f"{'':28}" + "".join(f"{c:>14}" for c, _ in cols))
    for label, step, key in rows:
        vals = []
        for _c, s in cols:
            v = s.get(step, {}).get(key)
            vals.append(f"{v:>14,.1f}" if isinstance(v, (int, float)) else f"{'-':>14}")
        print(f"{label:28}" + "".join(vals))
    for name, t in result["targets"].items():
        print(f"target {name}: {t['value']} (target {t['target']}): {'met' if t['met'] else 'MISSED'}")
    for c, s in cols:
        cpu = s.get("fanout_qos1", {}).get("cpu_s", {})
        if cpu:
            print(f"CPU s during the median fan-out run, {c}: " + ", ".join(f"{k} {v}" for k, v in cpu.items()))
