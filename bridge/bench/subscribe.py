"""``lakegate bench subscribe``: delivery to subscribers, the edge next to a
Mosquitto, same load generator (:mod:`bridge.bench.subload`), same run.

The bench starts both servers itself, each as its own process on a free
loopback port: the edge as ``python -m bridge edge`` (this command's
``--config``/``--set``, a fresh ``data_dir`` in a temporary directory),
delivering a QoS 1 message only once it is durable (fsync); Mosquitto
(``mosquitto`` on the PATH or in /usr/sbin) with its own configuration file:
``persistence false``, otherwise its defaults, which the edge's match:
20 unacknowledged QoS 1 messages in flight per subscriber
(``max_inflight_messages`` / ``edge.max_inflight_messages``), 1,000 queued
(``max_queued_messages`` / ``edge.max_queued_messages``; ``--window`` stays
below it, so neither drops), Nagle's algorithm on (``set_tcp_nodelay true``
halved its fan-out rate in trials; the edge, like every asyncio server, sets
TCP_NODELAY). The load generator runs in this process, MQTT 3.1.1,
``--payload-bytes`` payloads.

Three measurements, each point ``--repeat`` times with the servers taking
turns run by run (a shared machine's noise falls on both), each run once
both servers are idle (the last run's server may still be writing), the
median run reported with every run's value beside it:

* **fan-out** (a): 1 publisher, ``--subscribers`` (10 and 100) subscribers to
  one filter that matches (``bench/<run>/+``), at each ``--qos`` (0 and 1,
  publish and subscription alike); the publisher publishes for ``--seconds``
  as fast as two windows allow (``--publish-window`` unacknowledged QoS 1
  PUBLISH, ``--window`` messages not yet received by the slowest
  subscriber), then everything is delivered. Delivered messages/s =
  messages received by all subscribers / (first PUBLISH written -> last
  delivery). Ratio edge/Mosquitto per point; target >= 0.5.
* **latency** (b): the same at ``--latency-rate`` (1,000) msg/s paced, QoS 1,
  ``--latency-subscribers`` (1) subscriber(s), ``--latency-seconds``; each
  message carries its ``time.monotonic_ns()`` at write, the subscriber's
  receive time minus it is one latency (the first 0.5 s are warm-up). p50
  and p99 per run, the medians reported, and the publisher's PUBACK
  latency beside them; target p99 <= 10 ms.
* **memory** (c): a fresh server per run; ``--sessions`` (10,000) persistent
  sessions (Clean Session 0), each holding ``--session-subscriptions`` (10)
  QoS 1 subscriptions of its own, disconnected (idle). The server's RSS
  (psutil, or VmRSS in /proc) before and after (1 s to settle); target:
  the edge <= 200 MB.

Server CPU seconds and the generator's CPU seconds are reported per run: a
generator near one CPU second per second is the limit, not the server. The
load average at start and end is in the result. Every run is bounded by
``--timeout``; by default the whole bench takes under 2 minutes. Exit code 1 when an edge run failed or was incomplete (missed
targets are reported, not an error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bridge.bench.edge import _cpu_seconds, _stop, start_edge
from bridge.bench.edge import start_mosquitto as _start_mosquitto
from bridge.bench.subload import FanOut, Refused
from bridge.bench.subscribe_idle import idle_sessions
from bridge.config import Config

__all__ = ["TARGETS", "add_arguments", "run", "rss_bytes", "start_mosquitto"]

#: the issue's targets (issue 22, item 7)
TARGETS = {"fanout_ratio_min": 0.5, "latency_p99_ms_max": 10.0, "edge_memory_mb_max": 200.0}

_SERVERS = ("edge", "mosquitto")
_WARMUP_S = 0.5  # the start of each latency run that is not counted


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--subscribers", type=_ints, default=[10, 100],
                   help="fan-out sizes, comma separated (default 10,100)")
    p.add_argument("--qos", type=_ints, default=[0, 1], help="QoS levels of the fan-out (default 0,1)")
    p.add_argument("--seconds", type=float, default=1.5,
                   help="publishing time of each fan-out run (default 1.5)")
    p.add_argument("--publish-window", type=int, default=100,
                   help="unacknowledged QoS 1 PUBLISH of the publisher (default 100)")
    p.add_argument("--window", type=int, default=500,
                   help="messages published and not yet received by the slowest subscriber "
                        "(default 500)")
    p.add_argument("--payload-bytes", type=int, default=64, help="payload size, >= 16 (default 64)")
    p.add_argument("--latency-rate", type=float, default=1000.0,
                   help="paced publish rate of the latency runs, msg/s (default 1000)")
    p.add_argument("--latency-seconds", type=float, default=3.0,
                   help="length of each latency run, warm-up included (default 3)")
    p.add_argument("--latency-subscribers", type=int, default=1,
                   help="subscribers of the latency runs (default 1)")
    p.add_argument("--sessions", type=int, default=10000,
                   help="idle persistent sessions of the memory runs (default 10000)")
    p.add_argument("--session-subscriptions", type=int, default=10,
                   help="subscriptions per idle session (default 10)")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per point and server; the median is reported (default 3)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per run at most (default 30)")
    p.add_argument("--phases", default="fanout,latency,memory",
                   help="which measurements, comma separated (default fanout,latency,memory)")
    p.add_argument("--only", choices=_SERVERS, help="measure one server only")


# ---------------------------------------------------------------- servers
def start_mosquitto(workdir: Path) -> tuple[subprocess.Popen, int]:
    """A Mosquitto on a free loopback port with its own defaults (20 in flight
    and 1,000 queued per client, as the edge's) and no persistence; stop it
    with :func:`bridge.bench.edge._stop`."""
    return _start_mosquitto(workdir, settings="", name="mosquitto-subscribe.conf")


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid``: psutil when installed, else VmRSS."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _start(server: str, args: argparse.Namespace, workdir: Path, tag: str):
    if server == "edge":
        return start_edge(args, workdir / f"data-{tag}", profile=os.environ.get("LAKEGATE_BENCH_EDGE_PROFILE"))
    return start_mosquitto(workdir)


# ---------------------------------------------------------------- measurements
def _settle(pids: list[int], limit_s: float = 10.0) -> float:
    """Wait until none of ``pids`` used more than 5 ms of CPU in 0.1 s (the
    last run's server may still be writing and acknowledging), at most
    ``limit_s``; returns the seconds waited."""
    t0 = time.monotonic()
    last = [_cpu_seconds(p) or 0.0 for p in pids]
    while time.monotonic() - t0 < limit_s:
        time.sleep(0.1)
        now = [_cpu_seconds(p) or 0.0 for p in pids]
        if all(b - a <= 0.005 for a, b in zip(last, now)):
            break
        last = now
    return round(time.monotonic() - t0, 2)


def _one(port: int, pid: int, others: list[int], **kw) -> dict:
    """One FanOut run with CPU accounting, after every server is idle; a
    refusal becomes the run's error."""
    settled = _settle([pid, *others])
    c0, g0 = _cpu_seconds(pid), time.process_time()
    o0 = [_cpu_seconds(p) or 0.0 for p in others]
    try:
        r = asyncio.run(FanOut("127.0.0.1", port, **kw).run())
    except (Refused, OSError, asyncio.TimeoutError) as exc:
        r = {"complete": False, "error": f"{type(exc).__name__}: {exc}", "delivered_per_s": None}
    c1, g1 = _cpu_seconds(pid), time.process_time()
    if c0 is not None and c1 is not None:
        r["server_cpu_s"] = round(c1 - c0, 2)
    r["generator_cpu_s"] = round(g1 - g0, 2)
    if others:
        r["other_server_cpu_s"] = round(sum((_cpu_seconds(p) or 0.0) - a
                                            for p, a in zip(others, o0)), 2)
    r["settle_s"] = settled
    return r


def _others(servers: dict, s: str) -> list[int]:
    return [proc.pid for name, (proc, _port) in servers.items() if name != s]


def _median_run(runs: list[dict], key: str) -> dict:
    """The run with the median ``key`` (of those that have one), with every
    run's ``key`` as ``runs``; complete only when every run was."""
    ok = sorted((r for r in runs if r.get(key) is not None), key=lambda r: r[key])
    out = dict(ok[len(ok) // 2] if ok else runs[0])
    out["runs"] = [r.get(key) for r in runs]
    out["complete"] = all(r.get("complete") for r in runs)
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["error"] = errors[0]
    return out


def _fanout(args, servers: dict) -> dict:
    out = {s: {} for s in servers}
    for qos in args.qos:
        for n in args.subscribers:
            runs = {s: [] for s in servers}
            for i in range(args.repeat):
                for s, (proc, port) in servers.items():
                    runs[s].append(_one(
                        port, proc.pid, _others(servers, s), label=f"f{s[0]}q{qos}n{n}r{i}",
                        subscribers=n, qos=qos, payload_bytes=args.payload_bytes,
                        publish_window=args.publish_window, window=args.window,
                        seconds=args.seconds, timeout=args.timeout))
            for s in servers:
                out[s].setdefault(f"qos{qos}", {})[str(n)] = _median_run(runs[s], "delivered_per_s")
    return out


def _pct(values, q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _latency(args, servers: dict) -> dict:
    runs = {s: [] for s in servers}
    for i in range(args.repeat):
        for s, (proc, port) in servers.items():
            r = _one(port, proc.pid, _others(servers, s), label=f"l{s[0]}r{i}",
                     subscribers=args.latency_subscribers, qos=1,
                     payload_bytes=args.payload_bytes, publish_window=args.publish_window,
                     window=args.window, seconds=args.latency_seconds, rate=args.latency_rate,
                     record_latency=True, warmup_s=_WARMUP_S, timeout=args.timeout)
            lat = sorted(r.pop("latencies_ns", []))
            if lat:
                r.update(samples=len(lat), p50_ms=round(lat[len(lat) // 2] / 1e6, 3),
                         p99_ms=round(_pct(lat, 0.99) / 1e6, 3), max_ms=round(lat[-1] / 1e6, 3))
            else:
                r.update(samples=0, p50_ms=None, p99_ms=None, max_ms=None)
            ack = sorted(r.pop("puback_latencies_ns", []))
            r["puback_p50_ms"] = round(ack[len(ack) // 2] / 1e6, 3) if ack else None
            r["puback_p99_ms"] = round(_pct(ack, 0.99) / 1e6, 3) if ack else None
            runs[s].append(r)
    out = {}
    for s in servers:
        med = _median_run(runs[s], "p99_ms")
        out[s] = {"p50_ms": _median([r["p50_ms"] for r in runs[s]]),
                  "p99_ms": _median([r["p99_ms"] for r in runs[s]]),
                  "runs_p50_ms": [r["p50_ms"] for r in runs[s]],
                  "runs_p99_ms": [r["p99_ms"] for r in runs[s]],
                  "runs_max_ms": [r["max_ms"] for r in runs[s]],
                  "puback_p50_ms": _median([r["puback_p50_ms"] for r in runs[s]]),
                  "puback_p99_ms": _median([r["puback_p99_ms"] for r in runs[s]]),
                  "samples": [r["samples"] for r in runs[s]],
                  "delivered": [r.get("delivered") for r in runs[s]],
                  "expected": [r.get("expected") for r in runs[s]],
                  "complete": med["complete"]}
        if "error" in med:
            out[s]["error"] = med["error"]
    return out


def _memory(args, server_names, workdir: Path) -> dict:
    runs = {s: [] for s in server_names}
    for i in range(args.repeat):
        for s in server_names:
            proc, port = _start(s, args, workdir, f"mem{i}")
            try:
                time.sleep(0.5)  # let the fresh process finish starting
                before = rss_bytes(proc.pid)
                r = asyncio.run(idle_sessions("127.0.0.1", port, sessions=args.sessions,
                                              subscriptions=args.session_subscriptions,
                                              prefix=f"idle{i}",
                                              timeout=max(args.timeout, args.sessions / 100)))
                time.sleep(1.0)  # what the server does once the last session is idle
                after = rss_bytes(proc.pid)
                r["complete"] = r["sessions"] == args.sessions
                r["rss_before_mb"] = round(before / 1e6, 1) if before else None
                r["rss_mb"] = round(after / 1e6, 1) if after else None
                if before and after and r["sessions"]:
                    r["bytes_per_session"] = round((after - before) / r["sessions"])
                r["sessions_per_s"] = round(r["sessions"] / r["seconds"], 1) if r["seconds"] else None
                if proc.poll() is not None:
                    r["complete"] = False
                    r["errors"].append(f"{s} exited with code {proc.returncode}")
            finally:
                _stop(proc)
            if r["errors"]:
                r["error"] = r["errors"][0]
            runs[s].append(r)
    out = {}
    for s in server_names:
        med = _median_run(runs[s], "rss_mb")
        med.pop("errors", None)
        out[s] = med
    return out


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


# ---------------------------------------------------------------- the command
def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"fanout", "latency", "memory"}
    if unknown:
        raise UsageError(f"--phases: unknown {', '.join(sorted(unknown))} "
                         "(fanout, latency, memory)")
    if min(args.repeat, args.publish_window, args.window, args.sessions,
           args.session_subscriptions, args.latency_subscribers, *args.subscribers) < 1:
        raise UsageError("--repeat, the windows, --sessions, --session-subscriptions and the "
                         "subscriber counts must be positive")
    if set(args.qos) - {0, 1}:
        raise UsageError("--qos: 0 and/or 1")
    if args.payload_bytes < 16:
        raise UsageError("--payload-bytes must be at least 16 (sequence number and timestamp)")
    names = [s for s in _SERVERS if args.only in (None, s)]
    result: dict = {
        "protocol": "3.1.1", "payload_bytes": args.payload_bytes, "repeat": args.repeat,
        "cpus": os.cpu_count(), "targets": TARGETS,
        "settings": {"seconds": args.seconds, "publish_window": args.publish_window,
                     "window": args.window, "subscribers": args.subscribers, "qos": args.qos,
                     "latency_rate": args.latency_rate, "latency_seconds": args.latency_seconds,
                     "latency_subscribers": args.latency_subscribers, "latency_warmup_s": _WARMUP_S,
                     "sessions": args.sessions,
                     "session_subscriptions": args.session_subscriptions},
        "edge_settings": _edge_settings(config),
    }
    tmp = Path(tempfile.mkdtemp(prefix="lakegate-bench-subscribe-"))
    t_start = time.monotonic()
    load0 = [round(x, 2) for x in os.getloadavg()]  # other work on the machine moves the numbers
    servers: dict = {}
    try:
        if "fanout" in phases or "latency" in phases:
            for s in names:
                servers[s] = _start(s, args, tmp, "live")
            if "fanout" in phases:
                result["fanout"] = _fanout(args, servers)
            if "latency" in phases:
                result["latency"] = _latency(args, servers)
            for proc, _port in servers.values():
                _stop(proc)
            servers = {}
        if "memory" in phases:
            result["memory"] = _memory(args, names, tmp)
    finally:
        for proc, _port in servers.values():
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    result["loadavg"] = {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]}
    _judge(result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0 if _edge_complete(result) else 1


def _edge_settings(config: Config) -> dict:
    out = {"fsync_interval_ms": config.capture.fsync_interval_ms,
           "fsync_records": config.capture.fsync_records,
           "partitions": config.capture.partitions}
    for key in ("ack_after", "receive_maximum", "max_queued_messages", "max_queued_bytes",
                "max_inflight_messages", "max_subscriptions_per_client"):
        if hasattr(config.edge, key):
            out[key] = getattr(config.edge, key)
    return out


def _judge(r: dict) -> None:
    """Ratios and targets met (None when a side was not measured)."""
    met = {}
    fan = r.get("fanout")
    if fan and "edge" in fan and "mosquitto" in fan:
        ratios = {q: {n: _ratio(fan["edge"][q][n]["delivered_per_s"],
                                fan["mosquitto"][q][n]["delivered_per_s"]) for n in fan["edge"][q]}
                  for q in fan["edge"]}
        r["ratio_edge_to_mosquitto"] = ratios
        values = [v for per in ratios.values() for v in per.values()]
        met["fanout_ratio"] = (all(v is not None and v >= TARGETS["fanout_ratio_min"]
                                   for v in values) if values else None)
    lat = r.get("latency", {}).get("edge")
    if lat:
        met["latency_p99"] = (lat["p99_ms"] is not None and lat["complete"]
                              and lat["p99_ms"] <= TARGETS["latency_p99_ms_max"])
    mem = r.get("memory", {}).get("edge")
    if mem:
        met["edge_memory"] = (mem.get("rss_mb") is not None and mem["complete"]
                              and mem["rss_mb"] <= TARGETS["edge_memory_mb_max"])
    r["targets_met"] = met


def _edge_complete(r: dict) -> bool:
    parts = []
    for q in r.get("fanout", {}).get("edge", {}).values():
        parts += [x["complete"] for x in q.values()]
    for key in ("latency", "memory"):
        if "edge" in r.get(key, {}):
            parts.append(r[key]["edge"]["complete"])
    return all(parts)


def _fmt(v, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def _print(r: dict) -> None:
    st = r["settings"]
    print(f"bench subscribe: MQTT {r['protocol']}, {r['payload_bytes']}-byte payloads, "
          f"median of {r['repeat']} runs, {r['cpus']} CPUs, {r['seconds']} s, load average "
          f"{r['loadavg']['start'][0]:.2f} at start, {r['loadavg']['end'][0]:.2f} at end")
    fan = r.get("fanout")
    if fan:
        servers = list(fan)
        print(f"(a) fan-out, 1 publisher, {st['seconds']:g} s per run, windows "
              f"{st['publish_window']} (PUBACK) / {st['window']} (slowest subscriber): "
              "delivered msg/s")
        print(f"{'':24}" + "".join(f"{s:>14}" for s in servers)
              + ("   edge/mosquitto" if "ratio_edge_to_mosquitto" in r else ""))
        for q in fan[servers[0]]:
            for n in fan[servers[0]][q]:
                row = f"  QoS {q[-1]}, {n:>4} subscribers" + "".join(
                    f"{_fmt(fan[s][q][n]['delivered_per_s']):>14}" for s in servers)
                if "ratio_edge_to_mosquitto" in r:
                    row += f"{_fmt(r['ratio_edge_to_mosquitto'][q][n], '.2f'):>17}"
                cpu = ", ".join(f"{s} {_fmt(fan[s][q][n].get('server_cpu_s'), '.2f')}/"
                                f"{_fmt(fan[s][q][n].get('generator_cpu_s'), '.2f')}" for s in servers)
                errs = [f"{s}: {fan[s][q][n]['error']}" for s in servers if fan[s][q][n].get("error")]
                print(row + f"   CPU s server/generator: {cpu}"
                      + ("   " + "; ".join(errs) if errs else ""))
    lat = r.get("latency")
    if lat:
        print(f"(b) publish-to-subscriber latency, QoS 1, {st['latency_rate']:,.0f} msg/s, "
              f"{st['latency_subscribers']} subscriber(s), {st['latency_seconds']:g} s per run")
        for s, d in lat.items():
            print(f"  {s:10} p50 {_fmt(d['p50_ms'], '.2f')} ms, p99 {_fmt(d['p99_ms'], '.2f')} ms"
                  f"  (runs p99 {d['runs_p99_ms']}); the publisher's PUBACK p50 "
                  f"{_fmt(d['puback_p50_ms'], '.2f')} ms, p99 {_fmt(d['puback_p99_ms'], '.2f')} ms"
                  + (f"   {d['error']}" if d.get("error") else ""))
    mem = r.get("memory")
    if mem:
        print(f"(c) memory, {st['sessions']:,} idle persistent sessions x "
              f"{st['session_subscriptions']} subscriptions")
        for s, d in mem.items():
            print(f"  {s:10} RSS {_fmt(d.get('rss_mb'), '.1f')} MB (at start "
                  f"{_fmt(d.get('rss_before_mb'), '.1f')} MB), {d['sessions']:,} sessions in "
                  f"{d['seconds']} s" + (f"   {d['error']}" if d.get("error") else ""))
    met = r.get("targets_met")
    if met:
        t = r["targets"]
        names = {"fanout_ratio": f"ratio >= {t['fanout_ratio_min']}",
                 "latency_p99": f"p99 <= {t['latency_p99_ms_max']:g} ms",
                 "edge_memory": f"edge RSS <= {t['edge_memory_mb_max']:g} MB"}
        print("targets: " + ", ".join(f"{names[k]}: {'met' if v else 'NOT met'}"
                                      for k, v in met.items() if v is not None))
