"""``lakegate bench hostile``: the good client's PUBACK latency through the
hostile scenarios of issue 38, the edge next to Mosquitto, in one run.

A well-behaved publisher (:mod:`bridge.bench.hostile_good`, its own
process) sends one QoS 1 PUBLISH of 64 bytes every 20 ms (50 msg/s) and
times each PUBLISH -> PUBACK while a scenario
(:mod:`bridge.bench.hostile_scenarios`, :mod:`bridge.bench.hostile_floods`,
:mod:`bridge.bench.hostile_sessions`)
loads the server:

* ``slow-readers``: subscribers to ``#`` that never read, while a publisher sends;
* ``retained``: 200,000 retained topics, then 20 slow subscribers to ``#``
  that disconnect with their replays queued, then a full replay;
* ``subscriptions``: clients subscribing up to their quota with long, deep
  filters, then one ~1 MB SUBSCRIBE of 95,000 filters from one at its quota;
* ``connections``: 2,000 TCP connections that send nothing or half a CONNECT;
* ``churn``: 1,000 persistent sessions connecting and disconnecting;
* ``sigkill``: ``kill -9`` of the server with QoS 1/2 deliveries in flight
  to a persistent subscriber, a restart, and what comes back;
* ``fuzz``: 20,000 seeded SUBSCRIBE/UNSUBSCRIBE packets at MQTT 3.1, 3.1.1, 5.

Each (scenario, server) runs on a **fresh** server: the edge as ``python -m
bridge edge`` (this command's ``--config``/``--set``, a temporary
``data_dir``, its log kept to read drop lines); with ``--with-run`` also
``lakegate run`` (the edge under the streaming job, the live forwarder
and, when RabbitMQ answers at ``amqp.url``, forwarding: the scenario
starts once the job committed its first batch; ``sigkill`` kills the
edge's process, which the run starts again itself; RSS is the edge
process's); Mosquitto with its
defaults (20 in flight and 1,000 queued per client, as the edge) and, for
``sigkill`` only, persistence on with a save every second. ``--runs N``
(3) runs of every scenario, the servers taking turns; the table shows the
medians of the runs' p50 and p99 and the ratio edge/Mosquitto, and the
issue's target (p99 under 50 ms). Per scenario and server it also reports
the server's RSS (``/proc/<pid>/status``) at the start, the peak and the
end, whether it is alive and accepting a new client at the end, and the
scenario's own findings (``failures``: lost messages without a logged
cause, unanswered packets, ...). ``--quick`` runs every scenario at small
size; ``--size NAME=VALUE`` changes one size (see ``Sizes``). Exit code 1
when the edge failed a scenario (a finding, a death, a missing PUBACK),
2 on a usage error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from bridge.bench.edge import _stop, start_edge, start_mosquitto
from bridge.bench.hostile_good import GoodClientProcess, RawMqtt
from bridge.bench.hostile_floods import connection_flood, subscription_flood
from bridge.bench.hostile_scenarios import FULL, QUICK, Sizes, retained_flood, slow_readers
from bridge.bench.hostile_sessions import fuzz, session_churn, sigkill
from bridge.bench.subscribe import rss_bytes
from bridge.config import Config

__all__ = ["SCENARIOS", "TARGET_P99_MS", "Server", "add_arguments", "run", "run_scenario"]

TARGET_P99_MS = 50.0  # issue 38, item 8: through every scenario
SERVERS = ("edge", "mosquitto", "run")
#: the servers measured unless ``--only``/``--with-run`` say otherwise
DEFAULT_SERVERS = ("edge", "mosquitto")
#: a run's start: its edge, the JVM, the query's first batch
RUN_START_S = 240.0
#: the scenario's clients' niceness (``--load-nice``), as ``bench auth``'s flood
LOAD_NICE = 19
SCENARIOS = {
    "slow-readers": slow_readers,
    "retained": retained_flood,
    "subscriptions": subscription_flood,
    "connections": connection_flood,
    "churn": session_churn,
    "sigkill": sigkill,
    "fuzz": fuzz,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--runs", type=int, default=3,
                   help="runs of every scenario per server; medians are reported (default 3)")
    p.add_argument("--quick", action="store_true", help="every scenario at small size")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, of {', '.join(SCENARIOS)} (default all)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                   help="one scenario size, e.g. retained_topics=50000 (repeatable)")
    p.add_argument("--only", choices=SERVERS, help="one server only")
    p.add_argument("--with-run", action="store_true",
                   help="also under lakegate run (the edge with the job and live forwarding), a third server")
    p.add_argument("--rate", type=float, default=50.0, help="the good client's msg/s (default 50)")
    p.add_argument("--load-nice", type=int, default=LOAD_NICE, metavar="N",
                   help=f"the niceness of the scenario's own clients (default {LOAD_NICE}: on a network "
                        f"the attacker's CPU is not the server's; 0 shares the CPU equally)")


# ---------------------------------------------------------------- servers
class Server:
    """A server under test, started fresh: ``name`` "edge" or "mosquitto";
    ``kill()`` sends SIGKILL; ``restart()`` starts it again on the same port
    with the same data (the edge's data_dir, Mosquitto's persistence file)."""

    def __init__(self, name: str, workdir: Path, edge_overrides: list[str] | None = None,
                 edge_config: str | None = None, mosquitto_settings: str = "") -> None:
        self.name, self.workdir = name, workdir
        self.edge_args = SimpleNamespace(config=edge_config, overrides=list(edge_overrides or []))
        self.mosquitto_settings = mosquitto_settings
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.db_dir: Path | None = None
        self.run = None  # "run": the bench e2e's Lakegate (a run in its own session)
        self._killed_edge: int | None = None
        # A restart asked by a scenario (``sigkill``) runs here: a thread made
        # by the caller's, at its niceness, not the scenario's (a child
        # process inherits its creating thread's niceness).
        self._launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="server-start")
        self._launcher.submit(lambda: None).result()
        self._start()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.name == "run":
            self._start_run()
        elif self.name == "edge":
            with open(self.log_path, "a") as log:
                self.proc, self.port = start_edge(self.edge_args, self.workdir / "data", port=self.port,
                                                  stderr=log)
        else:
            if self.db_dir is None and "{dir}" in self.mosquitto_settings:
                # started as root, Mosquitto saves as its own user: a directory it can reach
                self.db_dir = Path(tempfile.mkdtemp(prefix="lakegate-hostile-mosquitto-"))
                self.db_dir.chmod(0o777)
            settings = self.mosquitto_settings.replace("{dir}", str(self.db_dir))
            self.proc, self.port = start_mosquitto(self.workdir, settings=settings,
                                                   name="mosquitto.conf", port=self.port)
        self.starts += 1

    def _start_run(self) -> None:
        from bridge.bench.e2e_procs import Lakegate
        from bridge.job.progress import committed_offsets

        self.run = Lakegate(SimpleNamespace(config=self.edge_args.config, overrides=self.edge_args.overrides),
                            self.workdir / "data", self.log_path)
        try:
            self.run.start(["log_level=WARNING"], timeout=RUN_START_S)
            self.proc, self.port = self.run.proc, self.run.port
            checkpoint = self.run.config().checkpoint_dir / self.run.config().job.query_name
            deadline = time.monotonic() + RUN_START_S
            while committed_offsets(checkpoint)[0] is None:  # the job's first batch: its start is over
                self.run.check_alive("before its first batch")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"lakegate run committed no batch within {RUN_START_S:.0f}s")
                time.sleep(0.2)  # start-up poll, bounded by the deadline
        except BaseException:
            self.run.stop()
            raise

    def edge_pid(self) -> int | None:
        """The process the MQTT clients talk to (a run's edge process, else the server's)."""
        if self.name != "run":
            return self.proc.pid if self.alive() else None
        try:
            return int(json.loads((self.workdir / "data" / "run.pid").read_text())["edge_pid"])
        except (OSError, ValueError, KeyError):
            return None

    def kill(self) -> None:
        if self.name == "run":  # the edge's process: the run starts it again (restart() waits for that)
            self._killed_edge = self.edge_pid()
            if self._killed_edge is not None:
                os.kill(self._killed_edge, signal.SIGKILL)
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def restart(self) -> None:
        if self.name == "run":
            deadline = time.monotonic() + 60.0
            while not (self.edge_pid() not in (None, self._killed_edge) and self.accepting()):
                if time.monotonic() > deadline or not self.alive():
                    raise RuntimeError("lakegate run did not start its edge again within 60 s")
                time.sleep(0.2)  # bounded by the deadline
            self.starts += 1
            return
        deadline = time.monotonic() + 20.0
        while True:  # the old port can be busy a moment (a socket still closing)
            try:
                self._launcher.submit(self._start).result()
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def accepting(self) -> bool:
        """A new client gets a CONNACK (0) within 5 s."""
        try:
            c = RawMqtt(self.port, timeout=5.0)
            ack = c.connect("hostile-probe", keepalive=0)
            c.send(b"\xe0\x00")
            c.close()
            return bool(ack) and ack[0] == 0x20 and ack[3] == 0
        except OSError:
            return False

    def rss_mb(self) -> float | None:
        pid = self.edge_pid()
        rss = rss_bytes(pid) if pid is not None else None
        return None if rss is None else round(rss / 2**20, 1)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
        else:
            _stop(self.proc)
        self._launcher.shutdown(wait=False)
        if self.db_dir is not None:
            shutil.rmtree(self.db_dir, ignore_errors=True)


def server_settings(scenario: str, sz: Sizes) -> tuple[list[str], str]:
    """(edge ``--set`` items, Mosquitto configuration lines) a scenario needs."""
    edge: list[str] = []
    mosquitto = ""
    if scenario == "subscriptions":  # "up to their quota": the quota is the size
        edge.append(f"edge.max_subscriptions_per_client={sz.sub_per_client}")
    if scenario == "sigkill":
        mosquitto = "persistence true\npersistence_location {dir}/\nautosave_interval 1\n"
    return edge, mosquitto


class _RssPeak(threading.Thread):
    """Samples a server's RSS every 0.2 s (its current process: a restart
    changes it) and keeps the peak."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.peak = server, 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self.peak = max(self.peak, self.server.rss_mb() or 0.0)


def _niced(fn, nice: int):
    """``fn()`` in a thread of its own at niceness ``nice`` (Linux: a
    niceness is a thread's, and the threads it makes inherit it), its
    result or its exception."""
    box: dict = {}

    def body() -> None:
        try:
            if nice:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            box["result"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=body, name="scenario-load", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_scenario(name: str, server: Server, sz: Sizes, tag: str, rate: float = 50.0,
                 min_good_s: float = 5.0, load_nice: int = 0) -> dict:
    """One scenario on a running ``server``, the good client publishing
    throughout, and for ``min_good_s`` at least (a short scenario, such as
    one large SUBSCRIBE, is followed by what the server still does for it,
    so that its p99 stands on a few hundred samples); the result with its
    RSS, liveness and findings."""
    rss_start = server.rss_mb()
    sampler = _RssPeak(server)
    sampler.start()
    t0 = time.monotonic()
    good = GoodClientProcess(server.port, tag, rate=rate, max_seconds=sz.timeout_s * 6)
    try:
        detail = _niced(lambda: SCENARIOS[name](server, sz), load_nice)
    except Exception as exc:  # a scenario that could not go on is a finding, not a crash of the bench
        detail = {"failures": [f"the scenario stopped: {type(exc).__name__}: {str(exc)[:200]}"]}
    finally:
        time.sleep(max(0.0, min_good_s - (time.monotonic() - t0)))
        good_result = good.stop(drain_s=5.0)
    time.sleep(1.0)  # what the server still does for the scenario's last clients
    sampler.halt.set()
    sampler.join(2)
    alive = server.alive()
    out = {"seconds": round(time.monotonic() - t0, 1), "good": good_result,
           "rss_start_mb": rss_start, "rss_peak_mb": max(sampler.peak, server.rss_mb() or 0.0),
           "rss_end_mb": server.rss_mb(), "alive": alive,
           "accepting": alive and server.accepting(), "restarts": server.starts - 1,
           "scenario": detail}
    findings = list(detail.get("failures", []))
    if "error" in good_result:
        findings.append(good_result["error"])
    else:
        if good_result["unacked"]:
            findings.append(f"the good client: {good_result['unacked']} PUBLISHes never acknowledged")
        if good_result["witness"]["missing"]:
            findings.append(f"the good client: {good_result['witness']['missing']} acknowledged messages "
                            f"never reached its persistent subscriber")
    if not alive:
        findings.append("the server process died")
    elif not out["accepting"]:
        findings.append("the server no longer accepts a new client")
    out["findings"] = findings
    return out


# ---------------------------------------------------------------- the run
def _not_started(why: str) -> dict:
    return {"seconds": 0.0, "good": {"error": "no server"}, "rss_start_mb": None, "rss_peak_mb": None,
            "rss_end_mb": None, "alive": False, "accepting": False, "restarts": 0, "scenario": {},
            "findings": [f"the server did not start: {why[:200]}"]}


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError

    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names:
        raise UsageError(f"--scenarios: unknown {', '.join(unknown) or '(none)'}; "
                         f"known: {', '.join(SCENARIOS)}")
    if args.runs < 1 or args.rate <= 0:
        raise UsageError("--runs and --rate must be positive")
    if not 0 <= args.load_nice <= 19:
        raise UsageError(f"--load-nice must be 0-19, got {args.load_nice}")
    try:
        sz = (QUICK if args.quick else FULL).replace(args.size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    servers = [args.only] if args.only else [*DEFAULT_SERVERS, *(["run"] if args.with_run else [])]
    if "mosquitto" in servers and shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        raise UsageError("mosquitto is not installed (scripts/services up installs it); "
                         "or measure the edge alone with --only edge")
    tmp = Path(tempfile.mkdtemp(prefix="lakegate-bench-hostile-"))
    runs: dict = {n: {s: [] for s in servers} for n in names}
    try:
        for i in range(args.runs):
            for name in names:
                order = servers if i % 2 == 0 else servers[::-1]  # taking turns
                for s in order:
                    edge_set, mosq_conf = server_settings(name, sz)
                    try:
                        server = Server(s, tmp / f"{name}-{s}-{i}",
                                        edge_overrides=[*(getattr(args, "overrides", None) or []), *edge_set],
                                        edge_config=getattr(args, "config", None),
                                        mosquitto_settings=mosq_conf)
                    except RuntimeError as exc:  # did not start: a finding of this run, the others go on
                        runs[name][s].append(_not_started(str(exc)))
                        continue
                    try:
                        runs[name][s].append(run_scenario(name, server, sz, f"{s[0]}{i}", args.rate,
                                                          min_good_s=3.0 if args.quick else 5.0,
                                                          load_nice=args.load_nice))
                    finally:
                        server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"quick": args.quick, "runs": args.runs, "rate": args.rate,
              "target_p99_ms": TARGET_P99_MS, "sizes": vars(sz), "scenarios": {}}
    for name in names:
        entry = {}
        for s in servers:
            rs = runs[name][s]
            entry[s] = {"p50_ms": _median(r["good"].get("p50_ms") for r in rs),
                        "p99_ms": _median(r["good"].get("p99_ms") for r in rs),
                        "runs_p99_ms": [r["good"].get("p99_ms") for r in rs],
                        "alive": all(r["alive"] for r in rs),
                        "accepting": all(r["accepting"] for r in rs),
                        "findings": sorted({f for r in rs for f in r["findings"]}),
                        "runs": rs}
        if "edge" in servers and "mosquitto" in servers:
            e, m = entry["edge"], entry["mosquitto"]
            entry["ratio_p50"] = _ratio(e["p50_ms"], m["p50_ms"])
            entry["ratio_p99"] = _ratio(e["p99_ms"], m["p99_ms"])
        result["scenarios"][name] = entry
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result, servers)
    ours = [s for s in servers if s != "mosquitto"]
    edge_ok = all(not result["scenarios"][n][s]["findings"] for n in names for s in ours)
    return 0 if edge_ok else 1


def _ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _print(r: dict, servers: list[str]) -> None:
    print(f"hostile scenarios: the good client's PUBLISH->PUBACK latency (QoS 1, 64 B, "
          f"{r['rate']:g} msg/s), median of {r['runs']} run(s){' (quick sizes)' if r['quick'] else ''}; "
          f"target p99 < {r['target_p99_ms']:g} ms")
    pair = "edge" in servers and "mosquitto" in servers
    head = f"{'scenario':<14}" + "".join(f"{s + ' p50':>16}{s + ' p99':>16}" for s in servers)
    if pair:
        head += f"{'ratio p50':>11}{'ratio p99':>11}"
    print(head + "  target")
    for name, e in r["scenarios"].items():
        row = f"{name:<14}" + "".join(f"{_fmt(e[s]['p50_ms'], '.2f'):>16}{_fmt(e[s]['p99_ms'], '.2f'):>16}"
                                      for s in servers)
        if pair:
            row += f"{_fmt(e['ratio_p50'], '.2f'):>11}{_fmt(e['ratio_p99'], '.2f'):>11}"
        ours = [s for s in servers if s != "mosquitto"] or servers  # the target is lakegate's (edge and run)
        p99s = [e[s]["p99_ms"] for s in ours]
        row += "  " + ("met" if all(p is not None and p < r["target_p99_ms"] for p in p99s) else "MISSED")
        print(row)
    print()
    print(f"{'scenario':<14}{'server':<10}{'RSS start':>10}{'peak':>8}{'end MB':>8}  alive  "
          f"accepting  findings   (RSS: the last run)")
    for name, e in r["scenarios"].items():
        for s in servers:
            last = e[s]["runs"][-1]
            print(f"{name:<14}{s:<10}{_fmt(last['rss_start_mb']):>10}{_fmt(last['rss_peak_mb']):>8}"
                  f"{_fmt(last['rss_end_mb']):>8}  {'yes' if e[s]['alive'] else 'NO':<5}  "
                  f"{'yes' if e[s]['accepting'] else 'NO':<9}  {len(e[s]['findings'])}")
    for name, e in r["scenarios"].items():
        for s in servers:
            for f in e[s]["findings"]:
                print(f"  {name} / {s}: {f}")
