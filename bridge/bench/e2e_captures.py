"""``bench e2e --capture local,kafka``: lakegate's side once per capture log
(issue 42: publish -> AMQP latency on Kafka no worse than 1.5 x the local
log's), with the same publisher and consumer in the same bench run.

The first capture listed runs every lakegate phase (:meth:`_Bench.lakegate`
of :mod:`bridge.bench.e2e`); each further one runs the latency phase only
(:func:`latency_only`: a fresh ``lakegate run`` on a data_dir of its own,
the same wait as the full side's before its latency phase -- first batch,
``--idle-seconds`` --, warm-up, ``--rate`` for ``--latency-seconds``,
stopped). A Kafka capture log is a fresh topic ``lg-bench-e2e-<hex>`` the
run creates (``kafka.create_topic=true``) and the bench deletes at the end
(:func:`bridge.bench.e2e_procs.delete_topic`). The bench does not measure
publish -> ``messages`` row, so only publish -> AMQP receipt is compared."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.bench.e2e_observe import JobProbe, wait_until
from bridge.bench.e2e_procs import Lakegate

if TYPE_CHECKING:  # pragma: no cover
    from bridge.bench.e2e_phases import PhaseRunner

__all__ = ["CAPTURES", "P99_TARGET", "CaptureLog", "compare_captures", "latency_only", "parse_captures",
           "print_captures"]

CAPTURES = ("local", "kafka")
#: issue 42: the p99 of publish -> AMQP on Kafka at most this many times the local log's
P99_TARGET = 1.5


def parse_captures(text: str) -> list[str]:
    """``--capture``: a comma list of :data:`CAPTURES`, each once; ValueError otherwise."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in CAPTURES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"--capture: a comma list of {', '.join(CAPTURES)}, each at most once, not {text!r}")
    return names


class CaptureLog:
    """One capture log of the bench: the ``--set`` lines that choose it and,
    on Kafka, the fresh topic (deleted by :meth:`cleanup`)."""

    def __init__(self, name: str, kafka_servers: str, alone: bool = False) -> None:
        self.name = name
        self.alone = alone  # the only capture log of the run: local is then whatever the configuration says
        self.servers = kafka_servers
        self.topic = f"lg-bench-e2e-{uuid.uuid4().hex[:12]}" if name == "kafka" else None
        self.deleted: str | None = None

    def sets(self) -> list[str]:
        if self.name == "local":
            return [] if self.alone else ["capture.backend=local"]
        return ["capture.backend=kafka", f"kafka.bootstrap_servers={self.servers}", f"kafka.topic={self.topic}",
                "kafka.create_topic=true"]

    def args(self, args: argparse.Namespace) -> argparse.Namespace:
        """``args`` with this capture log's ``--set`` lines after the user's (they win)."""
        return argparse.Namespace(**{**vars(args), "overrides": [*(getattr(args, "overrides", None) or []),
                                                                 *self.sets()]})

    def cleanup(self) -> None:
        if self.topic and self.deleted is None:
            from bridge.bench.e2e_procs import delete_topic

            self.deleted = delete_topic(self.servers, self.topic)

    def describe(self) -> dict:
        d: dict[str, Any] = {"backend": self.name}
        if self.topic:
            d.update(kafka_servers=self.servers, kafka_topic=self.topic, kafka_topic_deleted=self.deleted)
        return d


async def latency_only(bench: "PhaseRunner", args: argparse.Namespace, tmp: Path, cap: CaptureLog) -> dict:
    """The latency phase on a fresh ``lakegate run`` with capture log ``cap``
    (``edge.ack_after=capture``, as phase 1 of the full side)."""
    o = bench.o
    lg = Lakegate(cap.args(args), tmp / f"lakegate-data-{cap.name}", tmp / f"lakegate-run-{cap.name}.log")
    extra = ["edge.ack_after=capture"]
    job = JobProbe(lg.config(extra), o.min_batches)
    result: dict = {"phases": "latency"}
    try:
        bench.say(f"lakegate on the {cap.name} capture log: starting lakegate run ...")
        t_start = time.monotonic()
        result["edge_up_s"] = round(lg.start(extra, o.startup_timeout), 1)
        if not await wait_until(lambda: job.backlog() is not None, o.startup_timeout, poll=0.05):
            raise RuntimeError(f"the job committed no batch within {o.startup_timeout:.0f}s: {lg.tail()}")
        result["job_ready_s"] = round(time.monotonic() - t_start, 1)
        # as the full side before its latency phase: the first batch's aftermath, then idle CPU
        await asyncio.sleep(2.0)
        c0, t0 = lg.cpu(), time.monotonic()
        await asyncio.sleep(o.idle_seconds)
        result["idle_cpu_pct_of_core"] = round(100 * (lg.cpu() - c0) / (time.monotonic() - t0), 2)
        bench.say(f"lakegate on the {cap.name} capture log: latency at {o.rate} msg/s ...")
        _ph, result["latency"] = await bench._latency(lg.port, f"lg-{cap.name}-lat", True, lg.cpu,
                                                      table_dir=lg.config(extra).tables_dir / "messages")
        lg.check_alive(f"after the latency phase on the {cap.name} capture log")
    finally:
        job.close()
        lg.stop()
    return result


def compare_captures(caps: dict) -> None:
    """``caps["kafka_to_local"]``: kafka / local of the publish -> AMQP
    percentiles, and whether the p99's meets :data:`P99_TARGET`."""
    lat = {n: ((caps.get(n) or {}).get("latency") or {}).get("e2e_ms") for n in CAPTURES}
    if not (lat["local"] and lat["kafka"]):
        return
    ratio: dict[str, Any] = {f"e2e_{q}": round(lat["kafka"][q] / lat["local"][q], 2) if lat["local"][q] else None
                             for q in ("p50", "p95", "p99")}
    ratio["p99_target"] = P99_TARGET
    ratio["met"] = ratio["e2e_p99"] is not None and ratio["e2e_p99"] <= P99_TARGET
    table = {n: (((caps.get(n) or {}).get("latency") or {}).get("table") or {}).get("table_ms") for n in CAPTURES}
    if table["local"] and table["kafka"]:
        for q in ("p50", "p95", "p99"):
            ratio[f"table_{q}"] = round(table["kafka"][q] / table["local"][q], 2) if table["local"][q] else None
        ratio["table_met"] = ratio["table_p99"] is not None and ratio["table_p99"] <= P99_TARGET
    caps["kafka_to_local"] = ratio


def capture_lines(caps: dict) -> list[str]:
    """Per capture log: its publish -> AMQP figures; then the ratio with the issue's target."""
    lines = []
    for name in CAPTURES:
        c = caps.get(name)
        if not c:
            continue
        if "error" in c:
            lines.append(f"capture {name}: failed: {c['error']}")
            continue
        lat = c["latency"]
        e2e, pub = lat.get("e2e_ms") or {}, lat.get("puback_ms") or {}
        where = f" (topic {c['kafka_topic']}, {c['kafka_topic_deleted']})" if c.get("kafka_topic") else ""
        table = lat.get("table") or {}
        tms = table.get("table_ms")
        lines.append(f"capture {name}{where}: publish->AMQP p50/p95/p99 "
                     + (" / ".join(f"{e2e[q]:,.1f}" for q in ("p50", "p95", "p99")) if e2e else "-")
                     + " ms; publish->messages p50/p95/p99 "
                     + (" / ".join(f"{tms[q]:,.0f}" for q in ("p50", "p95", "p99")) if tms else "-")
                     + " ms; PUBACK p50/p99 "
                     + (" / ".join(f"{pub[q]:,.1f}" for q in ("p50", "p99")) if pub else "-")
                     + f" ms; received {lat.get('received')} / acknowledged {lat.get('acknowledged')}"
                     + (f" / in the table {table.get('in_table')}" if table else ""))
    r = caps.get("kafka_to_local")
    if r:
        lines.append(f"kafka/local publish->AMQP p99 {r['e2e_p99']} (p50 {r['e2e_p50']}, p95 {r['e2e_p95']}); "
                     f"issue 42 target at most {r['p99_target']:g}: {'met' if r['met'] else 'MISSED'}")
        if "table_p99" in r:
            lines.append(f"kafka/local publish->messages p99 {r['table_p99']} (p50 {r['table_p50']}, "
                         f"p95 {r['table_p95']}); issue 42 target at most {r['p99_target']:g}: "
                         f"{'met' if r['table_met'] else 'MISSED'}")
    return lines


def print_captures(r: dict) -> None:
    for line in capture_lines(r.get("captures") or {}):
        print(line)
