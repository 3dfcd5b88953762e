"""``bench edge --capture local,kafka,kafka3``: the capture logs the edge is
measured on, each in a run of its own edge process.

* ``local``: the local files (``capture.backend = "local"``), acknowledged
  once fsynced;
* ``kafka``: the one-node Kafka at ``--kafka-servers`` (default
  127.0.0.1:9092), on a fresh topic the edge creates (``kafka.create_topic``,
  the brokers' default replication) and the bench deletes after the run;
* ``kafka3``: a three-node cluster the bench starts itself with
  ``scripts/kafka up --nodes 3`` on free loopback ports in its temporary
  directory (replication factor 3, min.insync.replicas 2: a record is
  acknowledged once two replicas have it) and stops with ``scripts/kafka
  down`` after the run.

Also here: whether the log holds every acknowledged frame (read back with the
backend's own reader), the fixed-rate QoS 1 latency run (``bench e2e``'s
paced publisher, :class:`bridge.bench.e2e_load.Phase`), and the issue's
targets (issue 42: on the one-node Kafka, QoS 1 msg/s at least 0.7 of the
local log's, PUBACK p99 at 1,000 msg/s at most 20 ms).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import os
import random
import socket
import subprocess
import time
import uuid
from pathlib import Path

from bridge.bench import edge
from bridge.bench.e2e_load import Phase
from bridge.capture.errors import CaptureError

__all__ = ["CAPTURES", "Backend", "latency_phase", "measure_capture", "parse_captures", "summarize", "targets"]

CAPTURES = ("local", "kafka", "kafka3")
#: issue 42's targets on the one-node Kafka
TARGET_QOS1_RATIO = 0.7
TARGET_P99_MS = 20.0
#: librdkafka's lines of the bench's admin clients go to logging, not to the report's stderr
_RDKAFKA_LOG = logging.getLogger("bridge.bench.rdkafka")
_ROOT = Path(__file__).resolve().parents[2]
#: seconds ``scripts/kafka up`` may take (formatting three nodes' storage, three JVMs on a shared machine)
CLUSTER_UP_S = 240.0


def parse_captures(text: str) -> list[str]:
    """``local,kafka,kafka3`` -> the list, in the order given, without repeats;
    raises ValueError for an unknown name."""
    out: list[str] = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name not in CAPTURES:
            raise ValueError(f"--capture: unknown capture log {name!r} (choose from {', '.join(CAPTURES)})")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("--capture: give at least one of " + ", ".join(CAPTURES))
    return out


# ---------------------------------------------------------------- the three-node cluster
def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(tries: int = 200) -> int:
    """A port P with P..P+2 (brokers) and P+100..P+102 (controllers) all free
    on loopback (``scripts/kafka``'s layout for three nodes)."""
    rng = random.Random()
    for _ in range(tries):
        p = rng.randrange(20000, 32000)
        if all(_bindable(q) for q in (p, p + 1, p + 2, p + 100, p + 101, p + 102)):
            return p
    raise RuntimeError("no free block of loopback ports for a three-node Kafka")


class KafkaCluster:
    """Three Kafka nodes (``scripts/kafka up --nodes 3``) on free ports in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "kafka3"
        self.port = free_port_block()
        self.servers = ",".join(f"127.0.0.1:{self.port + i}" for i in range(3))
        self.started = False

    def _script(self, verb: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([str(_ROOT / "scripts" / "kafka"), verb, "--nodes", "3", "--port", str(self.port),
                               "--dir", str(self.dir)], cwd=_ROOT, capture_output=True, text=True,
                              timeout=timeout)

    def up(self) -> None:
        self.started = True  # from here on, down() has something to stop
        r = self._script("up", CLUSTER_UP_S)
        answering = [self._answers(self.port + i) for i in range(3)]
        if r.returncode != 0 or not all(answering):
            raise RuntimeError(f"the three-node Kafka did not start on {self.servers}: "
                               f"{(r.stdout + r.stderr).strip()[-400:] or 'no output'}")
        _wait_brokers(self.servers, 3, 60.0)

    def down(self) -> None:
        if self.started:
            self._script("down", 120)
            self.started = False

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False


def _wait_brokers(servers: str, brokers: int, timeout: float) -> None:
    """Until the cluster's metadata lists ``brokers`` brokers (a new KRaft
    cluster answers before every broker has registered)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers, "logger": _RDKAFKA_LOG})
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            seen = len(admin.list_topics(timeout=5).brokers)
        except Exception:  # noqa: BLE001 - not answering yet; bounded by the deadline
            seen = 0
        if seen >= brokers:
            return
        time.sleep(0.5)
    raise RuntimeError(f"Kafka at {servers}: {seen} of {brokers} brokers registered after {timeout:g} s")


# ---------------------------------------------------------------- one capture log
class Backend:
    """The capture log one edge run writes: the edge's ``--set`` lines, a
    description, and the log read back afterwards. ``start()`` before the
    edge (a cluster to start), ``close()`` after it (topic deleted, cluster
    stopped)."""

    def __init__(self, name: str, config, data_dir: Path, workdir: Path, kafka_servers: str) -> None:
        self.name = name
        self.data_dir = data_dir
        self.config = config
        self.workdir = workdir
        self.servers = kafka_servers
        self.topic = f"lg-bench-edge-{uuid.uuid4().hex[:10]}" if name != "local" else None
        self.cluster: KafkaCluster | None = None
        self.topic_created = False

    @property
    def description(self) -> str:
        if self.name == "local":
            return "local files (fsync)"
        nodes = "3 nodes, replication 3, min ISR 2" if self.name == "kafka3" else "1 node"
        return f"Kafka {self.servers} ({nodes}), topic {self.topic}"

    def start(self) -> None:
        if self.name == "kafka3":
            self.cluster = KafkaCluster(self.workdir)
            self.servers = self.cluster.servers
            self.cluster.up()

    def edge_sets(self) -> list[str]:
        if self.name == "local":
            return ["capture.backend=local"]
        self.topic_created = True  # the edge creates it at start (or fails before): delete it after
        return ["capture.backend=kafka", f"kafka.bootstrap_servers={self.servers}", f"kafka.topic={self.topic}",
                "kafka.create_topic=true", "kafka.replication_factor=-1"]

    def reader_config(self):
        cfg = copy.deepcopy(self.config)
        cfg.data_dir = str(self.data_dir)
        if self.name == "local":
            cfg.capture.backend = "local"
        else:
            cfg.capture.backend = "kafka"
            cfg.kafka.bootstrap_servers = self.servers
            cfg.kafka.topic = self.topic
        return cfg

    def captured(self) -> dict:
        """Records in the log by MQTT packet type (every durable one)."""
        from bridge.capture import open_reader

        reader = open_reader(self.reader_config())
        try:
            durable = reader.durable_offsets()
            counts: collections.Counter = collections.Counter()
            for p in range(reader.partitions):
                for batch in reader.arrow_batches(p, 0, durable[p]):
                    for v in batch.column("value").to_pylist():
                        counts[v[0] >> 4 if v else 0] += 1
        finally:
            close = getattr(reader, "close", None)
            if close is not None:
                close()
        return {"publish": counts[3], "pubrel": counts[6], "connect": counts[1],
                "records": sum(counts.values())}

    def close(self) -> None:
        try:
            if self.topic_created and self.topic:
                _delete_topic(self.servers, self.topic)
        finally:
            if self.cluster is not None:
                self.cluster.down()


def _delete_topic(servers: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    # kept in a name: a client collected at once fails its futures (_DESTROY)
    admin = AdminClient({"bootstrap.servers": servers, "logger": _RDKAFKA_LOG})
    for fut in admin.delete_topics([topic]).values():
        try:
            fut.result(30)
        except Exception:  # noqa: BLE001 - never created (the edge did not start): nothing to delete
            pass


def data_dir_for(name: str, base: Path, workdir: Path) -> Path:
    """The edge's data_dir for a capture log: ``base`` (``--dir`` or a
    temporary one) for the local log, a temporary one of its own otherwise
    (on Kafka it holds only the writer's lock and side files)."""
    return base if name == "local" else workdir / f"data-{name}"


# ---------------------------------------------------------------- one edge run
def measure_capture(args, backend, tmp: Path) -> dict:
    """The edge on one capture log (:class:`bridge.bench.edge_capture.Backend`):
    started, measured, stopped; then its log read back."""
    out: dict = {"description": backend.description}
    edge_proc = None
    errlog = tmp / f"edge-{backend.name}.stderr"
    try:
        backend.start()
        out["description"] = backend.description
        with open(errlog, "w") as err:
            try:
                edge_proc, port = edge.start_edge(args, backend.data_dir, stderr=err, extra_sets=backend.edge_sets())
            except RuntimeError as exc:
                edge._stop(edge_proc)
                tail = errlog.read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{exc}; {' | '.join(tail)}") from None
            try:
                out.update(asyncio.run(edge._measure(args, port, edge_proc.pid, backend.name)))
            finally:
                edge._stop(edge_proc)
        captured = backend.captured()
        acked = sum(out[q]["acknowledged_all_runs"] for q in ("qos0", "qos1", "qos2"))
        acked += out.get("latency", {}).get("acknowledged_all_runs", 0)
        out["capture"] = {**captured, "acknowledged_publish": acked,
                          "all_acknowledged_captured": captured["publish"] >= acked}
    except (RuntimeError, OSError, ValueError, asyncio.TimeoutError, subprocess.TimeoutExpired,
            CaptureError) as exc:  # this capture log's run failed: reported, the others still run
        out["error"] = str(exc) or type(exc).__name__
    finally:
        backend.close()
    return out


# ---------------------------------------------------------------- fixed-rate latency
async def latency_phase(port: int, args, label: str) -> dict:
    """QoS 1 at ``--latency-rate`` msg/s in all for ``--latency-seconds`` over
    ``--connections`` connections, each message sent on its schedule (at
    most ``--window`` unacknowledged per connection): PUBACK latency from
    each message's write to its PUBACK. Bounded in count (rate x seconds)
    and time (the phase's own bound, then ``--timeout`` for the PUBACKs)."""
    ph = Phase(f"bench-lat-{os.getpid()}", label, args.latency_rate, args.latency_seconds, args.connections,
               args.payload_bytes, args.window, consumed=False)
    try:
        await ph.connect("127.0.0.1", port, timeout=args.timeout)
        await ph.publish(ack_timeout=args.timeout)
    finally:
        ph.close()
    s = ph.summary()
    lat = s["puback_ms"] or {}
    out = {"rate": args.latency_rate, "seconds": args.latency_seconds, "messages": s["messages"],
           "sent": s["sent"], "acknowledged": s["acknowledged"], "send_rate": s["send_rate"],
           "complete": s["acknowledged"] == s["messages"] and "error" not in s,
           "puback_latency_ms": {"p50": lat.get("p50"), "p99": lat.get("p99"), "max": lat.get("max")}}
    if "error" in s:
        out["error"] = s["error"]
    return out


def median_latency(runs: list[dict]) -> dict:
    """The run with the median p99 (incomplete runs rank last), every run's p99 beside it."""
    ranked = sorted(runs, key=lambda r: (not r["complete"], r["puback_latency_ms"]["p99"] or float("inf")))
    out = dict(ranked[(len(ranked) - 1) // 2] if len(ranked) > 1 else ranked[0])
    out["runs_p99_ms"] = [r["puback_latency_ms"]["p99"] for r in runs]
    out["complete"] = all(r["complete"] for r in runs)
    return out


# ---------------------------------------------------------------- ratios and targets
def ratios(measured: dict, base: dict | None) -> dict | None:
    if base is None:
        return None
    out = {}
    for q in ("qos0", "qos1", "qos2"):
        a, b = measured[q]["msgs_per_s"], base[q]["msgs_per_s"]
        out[q] = round(a / b, 3) if a and b else None
    return out


def targets(captures: dict) -> dict:
    """Issue 42's targets on the one-node Kafka, each with the figure and
    whether it is met (None: not measured in this run)."""
    kafka = captures.get("kafka")
    ratio = (kafka.get("ratio_to_local") or {}).get("qos1") if kafka and "error" not in kafka else None
    p99 = None
    if kafka and "error" not in kafka and kafka.get("latency"):
        p99 = kafka["latency"]["puback_latency_ms"]["p99"]
    return {
        "kafka_qos1_ratio_to_local": {"target": f">= {TARGET_QOS1_RATIO}", "value": ratio,
                                      "met": None if ratio is None else ratio >= TARGET_QOS1_RATIO},
        "kafka_puback_p99_ms_at_rate": {"target": f"<= {TARGET_P99_MS:g}", "value": p99,
                                        "met": None if p99 is None else p99 <= TARGET_P99_MS},
    }


def summarize(result: dict, names: list[str]) -> None:
    """Add each capture's ratios, the targets (when a Kafka log ran), and the
    fields a run with the local log alone had before ``--capture``
    (``edge``, ``edge_capture``, ``ratio_edge_to_mosquitto``: the first
    capture log's)."""
    caps = result["captures"]
    local = caps.get("local")
    local = local if local is not None and "error" not in local else None
    for name, c in caps.items():
        if "error" in c:
            continue
        c["ratio_to_local"] = ratios(c, local) if name != "local" else None
        c["ratio_to_mosquitto"] = ratios(c, result.get("mosquitto"))
    if any(n != "local" for n in names):
        result["targets"] = targets(caps)
    first = caps[names[0]]
    if "error" not in first:
        result["edge"] = {k: first[k] for k in ("qos0", "qos1", "qos2", "latency") if k in first}
        result["edge_capture"] = first["capture"]
        if first["ratio_to_mosquitto"] is not None:
            result["ratio_edge_to_mosquitto"] = first["ratio_to_mosquitto"]
