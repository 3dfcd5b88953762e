"""``lakegate bench NAME``: benchmarks, one module per subject under ``bridge.bench``.

A benchmark is a command, not a timed test: it prints what it measured (and
``--json`` for machines). To add one, write ``bridge/bench/<name>.py`` with
``add_arguments(parser)`` and ``run(args, config) -> int`` and list it in
:data:`BENCHES`. Modules are imported when the parser is built, so they
must import heavy dependencies (pyspark) inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib

from bridge.cli import common_parser
from bridge.config import Config

__all__ = ["BENCHES", "add_arguments", "run"]

#: name -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "log": ("bridge.bench.log", "capture log: appends/s and durable wait, read rate (Spark source), raw disk"),
    "amqp": ("bridge.bench.amqp", "AMQP forwarding: the sink's Forwarder vs a bare proton sender, msg/s and ratio"),
    "retained": ("bridge.bench.retained", "retained MERGE and messages append vs bare delta-rs"),
    "parse": ("bridge.bench.parse", "frame parser: vectorised vs the scalar codec per frame vs a slicing floor, frames/s"),
    "edge": ("bridge.bench.edge", "MQTT edge vs Mosquitto: msg/s at QoS 0/1/2, PUBACK latency, ratio"),
    "auth": ("bridge.bench.auth", "password checks: a legitimate client's CONNACK latency p50/p99, quiet and under a "
                                  "flood of wrong-password CONNECTs, and the ratio"),
    "subscribe": ("bridge.bench.subscribe", "delivery to subscribers, edge vs Mosquitto: fan-out msg/s at QoS 0/1 "
                                            "to 10 and 100 subscribers, latency p50/p99, memory of idle sessions"),
    "retained-subscribe": ("bridge.bench.retained_subscribe",
                           "retained messages on SUBSCRIBE, edge (from the lakehouse) vs Mosquitto: time to "
                           "the last retained message for 100, 10,000 and all of 100,000 topics; the edge's "
                           "start-up and RSS with 1,000,000 retained topics"),
    "downlink": ("bridge.bench.downlink", "AMQP -> MQTT: producer -> edge -> subscriber msg/s and latency "
                                          "p50/p99 at QoS 1 vs a bare proton receiver, ratio"),
    "job": ("bridge.bench.job", "the streaming job per micro-batch vs Spark's floor (the same source into a "
                                "foreachBatch doing toArrow only): wall and CPU p50/p99, where the time goes, "
                                "the first batch after an idle period"),
    "sql": ("bridge.bench.sql", "one SQL query from a new client process: through lakegate run's Spark Connect "
                                "endpoint vs a local Spark session, wall time median and ratio"),
    "hostile": ("bridge.bench.hostile", "the good client's PUBACK latency p50/p99 through issue 38's hostile "
                                        "scenarios (slow readers, retained flood, subscription and "
                                        "connection floods, churn, SIGKILL, fuzz), edge vs Mosquitto, "
                                        "ratio; RSS, liveness and findings per scenario"),
    "tables": ("bridge.bench.tables", "the job's table step (messages, quarantine, the retained MERGE) through "
                                      "delta-rs vs delta-spark, side by side: wall, CPU, files written, ratio"),
    "cluster": ("bridge.bench.cluster", "1, 2 and 3 edges of a cluster on one Kafka vs one Mosquitto: publish "
                                        "msg/s at QoS 0/1, fan-out delivered/s with subscribers spread over the "
                                        "edges, cross-edge publish -> subscriber p50/p99, CPU per process"),
    "e2e": ("bridge.bench.e2e", "end to end: publish-to-AMQP latency, sustained rate and losses on SIGKILL, "
                                "lakegate run vs Mosquitto + paho/proton glue; PUBACK latency per ack mode"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="BENCH")
    sub.required = True
    for name, (module, help_text) in BENCHES.items():
        sp = sub.add_parser(name, help=help_text, description=help_text, parents=[common_parser()])
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # one broken benchmark must not break the whole command line
            sp.set_defaults(_bench=None, _bench_error=f"bench {name}: cannot import {module}: {exc}")
            continue
        mod.add_arguments(sp)
        sp.set_defaults(_bench=mod)


def run(args: argparse.Namespace, config: Config) -> int:
    if args._bench is None:
        from bridge.cli import UsageError

        raise UsageError(args._bench_error)
    return int(args._bench.run(args, config) or 0)
