"""``lakegate bench e2e``: publish-to-AMQP-receipt, lakegate next to the glue a
user would otherwise write, in one run, with the same publisher.

**lakegate**: the bench starts its own ``lakegate run`` (``python -m bridge
run``, this command's ``--config``/``--set``, a temporary ``data_dir``, a free
loopback edge port, its own process group) forwarding to ``amqp.url``.

**glue**: a Mosquitto of its own (the one ``bench edge`` starts: free loopback
port, ``persistence false`` -- the bench never kills Mosquitto --, no
inflight or queue limits, so Mosquitto itself drops nothing) and
:data:`GLUE_SCRIPT`, written into the temporary directory and run with this
Python: a paho subscriber (MQTT 3.1.1, QoS 1, a persistent session --
``clean_session=False`` and a fixed client id, so Mosquitto queues for it
while it is down) whose ``on_message`` hands each message to a proton
``Container`` sender thread that sends it to ``/topic/<routing key>`` and
counts the dispositions. paho acknowledges a QoS 1 message when
``on_message`` returns (its default), so what sits in the hand-off queue or
is in flight to the AMQP peer is acknowledged to Mosquitto and not yet
forwarded: that is what a SIGKILL of the glue loses. ``--glue-mode sync``
sends from ``on_message`` over a ``BlockingConnection`` and waits for the
peer to settle each message before paho acknowledges (no such window, one
round trip per message).

**Publisher** (this process, asyncio): the load generator of ``bench edge``
(:class:`bridge.bench.edge._LoadConn`: pre-encoded frames, acknowledgements
read and counted in bulk), paced: MQTT 3.1.1, QoS 1, ``--connections``
connections, each message due at a fixed time for the offered rate, at most
``--window`` unacknowledged per connection. Each payload starts with its
sequence number (8 bytes, big-endian); the topic names the phase and the
connection. The bench keeps every message's send and PUBACK time.

**Consumer** (this process, a proton thread): a receiver on
``/topic/<prefix>.c.#`` (RabbitMQ binds a new queue to ``amq.topic``;
the bench deletes it at the end with ``rabbitmqctl``). Latency = receipt
time - send time, same clock. Messages are told apart by (topic,
sequence): repeats are counted as duplicates.

Phases, the glue first, then lakegate (nothing else of the bench runs
meanwhile; the glue goes first so that its overload rate is known):

1. **latency**: ``--rate`` msg/s for ``--latency-seconds`` (after a short
   warm-up): publish-to-receipt p50/p95/p99, PUBACK p50/p99;
2. **sustained rate**: steps from ``--start-rate``, times ``--step-factor``,
   at most ``--max-steps``, to topics nothing is bound to (RabbitMQ accepts
   and drops them: the consumer is out of the way). A step publishes for
   ``--step-seconds``; a lakegate step goes on until ``--min-batches``
   batches committed after the first ``--settle-seconds`` (at most three
   times as long), so that slow batches still give a trend. A step holds
   when the publisher sent at >= 95 % of the rate, every message was
   acknowledged, and the backlog did not grow: its least-squares slope
   after the settle time is at most :data:`bridge.bench.e2e_phases.SLOPE_LIMIT` of the rate per
   second (a micro-batch job's backlog is a saw-tooth; what counts is its
   trend). Backlog: lakegate -- the job's lag (capture log end minus the
   checkpoint's committed offsets, as ``lakegate status``), one sample per
   committed batch; glue -- messages Mosquitto acknowledged minus messages
   the AMQP peer accepted from the glue (its status file), every 0.05 s.
   The steps stop at the first that does not hold;
3. **kill**: ``--rate`` for ``--kill-seconds``; halfway, SIGKILL of the
   lakegate run's whole process group (driver, Spark JVM, Python workers)
   or of the glue process. The glue is started again at once and the
   publisher goes on; lakegate is started again on the same ``data_dir``
   after the phase (its clients lost their connections). Lost = messages
   the publisher got a PUBACK for that the consumer has not received by
   the time everything is idle again (lakegate: the job's lag is 0; glue:
   it has settled all it received) and nothing arrived for 3 s, or at
   ``--recovery-timeout`` seconds after the restart. ``--overload-kill``
   repeats the kill on both sides at ``--overload-rate`` (default: the
   glue's first step that did not hold);
4. **ack after forward** (lakegate only): the restarted run has
   ``edge.ack_after = "forward"``; ``--rate`` for ``--latency-seconds``:
   PUBACK p50/p99 next to the capture-mode PUBACK of phase 1.

**Capture logs** (``--capture local,kafka``, issue 42): the first capture
log listed runs every lakegate phase above; each further one only the
latency phase, on a fresh ``lakegate run`` (Kafka: a fresh topic
``lg-bench-e2e-<hex>`` at ``--kafka-servers``, deleted at the end), with the
same publisher and consumer: :mod:`bridge.bench.e2e_captures`. The
``captures`` key has each one's latency and kafka/local of the p99s against
the issue's target (at most 1.5; a miss is reported, not an error).

Output: a table, or ``--json`` with every number. Exit code 0 when every
phase ran and lakegate lost no acknowledged message, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bridge.bench.e2e_captures import CaptureLog, compare_captures, latency_only, parse_captures, print_captures
from bridge.bench.e2e_load import Phase
from bridge.bench.e2e_observe import GlueProbe, JobProbe, Probe, Receiver, wait_until
from bridge.bench.e2e_phases import PhaseRunner
from bridge.bench.e2e_procs import GLUE_SCRIPT, Glue, Lakegate, delete_queue
from bridge.bench.e2e_report import compare, print_table
from bridge.bench.edge import _cpu_seconds, _stop, start_mosquitto
from bridge.config import Config, mask_secret

__all__ = ["GLUE_SCRIPT", "add_arguments", "run"]

#: --quick values (the test), then the defaults; an explicit option wins over both.
_PRESETS: dict[str, tuple[Any, Any]] = {
    "rate": (100, 200),
    "latency_seconds": (6.0, 15.0),
    "warmup_seconds": (2.0, 3.0),
    "start_rate": (1000, 1000),
    "step_factor": (4.0, 2.0),
    "max_steps": (1, 6),
    "refine": (0, 1),
    "step_seconds": (6.0, 12.0),
    "settle_seconds": (2.0, 3.0),
    "kill_seconds": (6.0, 10.0),
    "overload_kill": (False, False),
    "min_batches": (3, 6),
    "idle_seconds": (5.0, 30.0),
    "bare_messages": (2000, 20000),
    "at_bare_rate": (False, True),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--quick", action="store_true",
                   help="short phases (about 2-3 minutes in all; the test uses it)")
    p.add_argument("--rate", type=int, help="offered rate of the latency and kill phases, msg/s (default 200)")
    p.add_argument("--connections", type=int, default=4, help="publisher connections (default 4)")
    p.add_argument("--payload-bytes", type=int, default=64, help="payload size, at least 8 (default 64)")
    p.add_argument("--window", type=int, default=2000,
                   help="unacknowledged messages per connection before the publisher waits (default 2000)")
    p.add_argument("--latency-seconds", type=float, help="latency phase length (default 15)")
    p.add_argument("--warmup-seconds", type=float, help="warm-up before the latency phase (default 3)")
    p.add_argument("--start-rate", type=int, help="first sustained-rate step, msg/s (default 1000)")
    p.add_argument("--step-factor", type=float, help="rate factor between steps (default 2)")
    p.add_argument("--max-steps", type=int,
                   help="at most this many rising steps (default 6: 1,000 to 32,000 msg/s)")
    p.add_argument("--refine", type=int,
                   help="steps between the highest rate that held and the lowest that did not (default 1)")
    p.add_argument("--step-seconds", type=float, help="step length (default 12)")
    p.add_argument("--settle-seconds", type=float,
                   help="start of each step left out of the backlog slope (default 3)")
    p.add_argument("--min-batches", type=int,
                   help="lakegate steps run until this many batches committed after the settle time, "
                        "at most 3 x --step-seconds (default 6)")
    p.add_argument("--kill-seconds", type=float, help="kill phase length; SIGKILL halfway (default 10)")
    p.add_argument("--overload-rate", type=int,
                   help="rate of the second kill test (default: the glue's first step that did not hold)")
    p.add_argument("--overload-kill", action=argparse.BooleanOptionalAction, default=None,
                   help="also kill both sides at the overload rate (default: off)")
    p.add_argument("--recovery-timeout", type=float, default=120.0,
                   help="seconds after a restart for acknowledged messages to arrive (default 120)")
    p.add_argument("--startup-timeout", type=float, default=240.0,
                   help="seconds for lakegate run to start (default 240)")
    p.add_argument("--glue-mode", choices=("async", "sync"), default="async",
                   help="glue design: proton Container thread (paho acks on hand-off) or a "
                        "BlockingConnection send per message (default async)")
    p.add_argument("--idle-seconds", type=float,
                   help="lakegate run's CPU with no traffic is measured for this long after start-up (default 30)")
    p.add_argument("--bare-messages", type=int,
                   help="messages per run of the bare proton sender, the forwarding reference (default 20000)")
    p.add_argument("--forwarding-off", action=argparse.BooleanOptionalAction, default=True,
                   help="also step the rate with lakegate's forwarding off (amqp.url empty; default: on)")
    p.add_argument("--at-bare-rate", action=argparse.BooleanOptionalAction, default=None,
                   help="one more lakegate step at the bare proton sender's rate when the steps leave it open "
                        "(default: on; off with --quick)")
    p.add_argument("--only", choices=("lakegate", "glue"), help="measure one side only")
    p.add_argument("--capture", default="local",
                   help="capture logs of lakegate's side, a comma list of local, kafka (default local: the "
                        "configuration's). The first runs every phase; each further one the latency phase only "
                        "(sustained rate, kill and ack-after-forward stay on the first), on a fresh lakegate run, "
                        "same publisher and consumer; with local and kafka, kafka/local of the publish->AMQP "
                        "p99s against issue 42's target (at most 1.5)")
    p.add_argument("--kafka-servers", default="127.0.0.1:9092",
                   help="Kafka for --capture kafka: a fresh topic lg-bench-e2e-<hex> there, created by the run, "
                        "deleted at the end (default 127.0.0.1:9092)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) and say where")


def _opts(args: argparse.Namespace) -> argparse.Namespace:
    o = argparse.Namespace(**vars(args))
    for name, (quick, default) in _PRESETS.items():
        if getattr(o, name, None) is None:
            setattr(o, name, quick if args.quick else default)
    return o


class _Bench(PhaseRunner):
    def __init__(self, args: argparse.Namespace, config: Config, tmp: Path) -> None:
        super().__init__(_opts(args), f"lge2e{uuid.uuid4().hex[:8]}",
                         lambda s: print(f"bench e2e: {s}", file=sys.stderr, flush=True))
        self.args = args
        self.config = config
        self.tmp = tmp
        names = parse_captures(args.capture)
        self.captures = [CaptureLog(n, args.kafka_servers, alone=len(names) == 1) for n in names]

    def overload_rate(self, out: dict) -> float | None:
        """The rate of the overload kill test: --overload-rate, else the glue's
        first step that did not hold (its highest step if all held)."""
        if self.o.overload_rate:
            return float(self.o.overload_rate)
        for side in ("glue", "lakegate"):
            steps = ((out.get(side) or {}).get("sustained") or {}).get("steps") or []
            if steps:
                failed = [st["offered_rate"] for st in steps if not st["sustained"]]
                return float(failed[0] if failed else steps[-1]["offered_rate"])
        return None

    # -- lakegate
    async def lakegate(self, out: dict, cap: CaptureLog) -> dict:
        o = self.o
        data_dir = self.tmp / "lakegate-data"
        lg = Lakegate(cap.args(self.args), data_dir, self.tmp / "lakegate-run.log")
        capture = ["edge.ack_after=capture"]  # phase 1 measures the default mode, whatever the config says
        cfg = lg.config(capture)
        result: dict = {"config": {
            "partitions": cfg.capture.partitions, "max_records_per_trigger": cfg.job.max_records_per_trigger,
            "trigger_interval_s": cfg.job.trigger_interval_s, "spark_master": cfg.spark.master,
            "cores": os.cpu_count(), "shuffle_partitions": cfg.spark.shuffle_partitions,
            "fsync_interval_ms": cfg.capture.fsync_interval_ms, "fsync_records": cfg.capture.fsync_records,
            "tables_engine": cfg.tables.engine, "ack_after": cfg.edge.ack_after,
            "amqp_url": mask_secret("amqp.url", cfg.amqp.url), "address_template": cfg.amqp.address_template,
            "forward_by": cfg.amqp.forward_by, "live_interval_ms": cfg.amqp.live_interval_ms,
            "capture_backend": cfg.capture.backend,
        }}
        job = JobProbe(cfg, o.min_batches)
        self.trigger_s = cfg.job.trigger_interval_s  # the steps from here on are lakegate's

        def drained() -> bool:
            return job.drained()

        try:
            self.say(f"lakegate: starting lakegate run (data in {data_dir}) ...")
            t_start = time.monotonic()
            result["edge_up_s"] = round(lg.start(capture, o.startup_timeout), 1)
            started: list[float] = []

            def first_batch() -> bool:
                if not started and "job started:" in lg.log_text():
                    started.append(time.monotonic() - t_start)
                return job.backlog() is not None

            if not await wait_until(first_batch, o.startup_timeout, poll=0.05):
                raise RuntimeError(f"the job committed no batch within {o.startup_timeout:.0f}s: {lg.tail()}")
            result["job_ready_s"] = round(time.monotonic() - t_start, 1)
            result["job_started_s"] = round(started[0], 1) if started else None
            self.say(f"lakegate: edge up in {result['edge_up_s']} s, query started at {result['job_started_s']} s, "
                     f"first batch committed at {result['job_ready_s']} s; CPU with no traffic for "
                     f"{o.idle_seconds:g} s ...")
            await asyncio.sleep(2.0)  # the first batch's aftermath (retained cache reload)
            c0, t0 = lg.cpu(), time.monotonic()
            await asyncio.sleep(o.idle_seconds)
            result["idle_cpu_pct_of_core"] = round(100 * (lg.cpu() - c0) / (time.monotonic() - t0), 2)
            result["config"]["tables_engine_used"] = _engine_from_log(lg.log_path)
            self.say(f"lakegate: edge on 127.0.0.1:{lg.port}; latency at {o.rate} msg/s ...")
            _ph, result["latency"] = await self._latency(lg.port, "lg-lat", True, lg.cpu,
                                                         table_dir=cfg.tables_dir / "messages")
            self.say(f"lakegate: sustained rate, steps of {max(o.step_seconds, 6 * self.trigger_s):g} s "
                     f"(six job triggers at least) ...")

            def job_probe(_ph: Phase) -> Probe:
                job.reset()
                return job

            result["sustained"] = await self._steps(lg.port, "lg", job_probe, lg.cpu)
            # the forwarding reference, measured here, between lakegate's steps and its kill
            self.say(f"lakegate: a bare proton sender to the same RabbitMQ, {o.bare_messages:,} messages x 3 ...")
            result["bare_proton"] = bare = _bare_proton(self.config, self.prefix, o.bare_messages, o.payload_bytes)
            if o.at_bare_rate:
                result["at_bare_rate"] = await self._at_rate(lg.port, "lg-bare", result["sustained"],
                                                             bare["msgs_per_s"], job_probe, lg.cpu)
            over = self.overload_rate(out) if o.overload_kill else None
            if over:
                result["kill_overload"] = await self._lakegate_kill(lg, "lg-kill-over", over, capture, drained)
                await wait_until(drained, 120)
                lg.check_alive("after the overload kill test")
            result["kill"] = await self._lakegate_kill(lg, "lg-kill", o.rate, ["edge.ack_after=forward"], drained)
            await wait_until(drained, 120)
            lg.check_alive("after the kill test (started again with edge.ack_after=forward)")
            self.say(f"lakegate: ack_after=forward, latency at {o.rate} msg/s ...")
            # no warm-up: the recovery after the kill already ran the restarted job's forwarding
            _ph, result["ack_after_forward"] = await self._latency(lg.port, "lg-fwd", False, lg.cpu)
            if o.forwarding_off:
                lg.stop()
                off = ["amqp.url=", *capture]
                lg.start(off, o.startup_timeout)
                job.live = False  # nothing forwards now: the backlog is the job's lag alone
                # the checkpoint has batches already: wait for this incarnation's query, then
                # let it run a few batches of a warm-up before the steps
                if not await wait_until(lambda: "job started:" in lg.log_text(), o.startup_timeout):
                    raise RuntimeError(f"the job (forwarding off) did not start: {lg.tail()}")
                w = self.phase("lg-off-warm", o.rate, o.warmup_seconds, consumed=False)
                await w.connect("127.0.0.1", lg.port)
                await w.publish()
                w.close()
                await wait_until(drained, 120)
                lg.check_alive("with forwarding off")
                held = (result.get("sustained") or {}).get("max_sustained_rate")
                self.say(f"lakegate: forwarding off, sustained rate from {held or o.start_rate:,.0f} msg/s ...")
                result["sustained_forwarding_off"] = await self._steps(lg.port, "lg-off", job_probe, lg.cpu,
                                                                       start_rate=held)
        finally:
            job.close()
            lg.stop()
        return result

    async def per_capture(self, out: dict) -> dict:
        """lakegate's side on every capture log: all phases on the first (``out["lakegate"]``),
        the latency phase on each further one; ``captures``: each one's latency."""
        caps: dict = {}
        for n, cap in enumerate(self.captures):
            t = time.monotonic()
            try:
                if n == 0:
                    out["lakegate"] = await self.lakegate(out, cap)
                    out["lakegate"]["seconds"] = round(time.monotonic() - t, 1)
                    lg = out["lakegate"]
                    entry = {"phases": "all", "latency": lg["latency"], "edge_up_s": lg["edge_up_s"],
                             "job_ready_s": lg["job_ready_s"]}
                else:
                    try:
                        entry = await latency_only(self, self.args, self.tmp, cap)
                    except Exception as exc:  # noqa: BLE001 - reported; the first capture's figures stand
                        self.say(f"lakegate on the {cap.name} capture log failed: {exc}")
                        entry = {"phases": "latency", "error": str(exc)}
            finally:
                cap.cleanup()
            entry.update(cap.describe(), seconds=round(time.monotonic() - t, 1))
            caps[cap.name] = entry
        compare_captures(caps)
        return caps

    # -- glue
    async def glue(self) -> dict:
        o = self.o
        self.trigger_s = 0.0
        mosq = None
        glue: Glue | None = None
        result: dict = {"config": {
            "mosquitto": "private instance, persistence false (never killed), max_inflight_messages 0, "
                         "max_queued_messages 0 (no limits: Mosquitto drops nothing)",
            "subscriber": "paho-mqtt 2, MQTT 3.1.1, QoS 1, clean_session=False (persistent session), "
                          "automatic PUBACK when on_message returns",
            "mode": o.glue_mode,
            "forwarder": ("on_message hands the message to a proton Container thread (queue + "
                          "EventInjector), which sends it as far as link credit goes and counts "
                          "dispositions; the PUBACK to Mosquitto does not wait for them"
                          if o.glue_mode == "async" else
                          "on_message sends over a proton BlockingConnection and waits until the peer "
                          "settled the message; paho acknowledges after that"),
        }}
        try:
            mosq, mport = start_mosquitto(self.tmp)
            glue = Glue(self.tmp, mport, f"{self.prefix}/#", self.config.amqp, o.glue_mode,
                         f"{self.prefix}-glue")
            glue.start()
            t0 = time.perf_counter()
            if not await wait_until(glue.ready, 60):
                raise RuntimeError(f"the glue did not subscribe and connect within 60 s; see {glue.log_path}")
            result["startup_s"] = round(time.perf_counter() - t0, 2)

            def cpu() -> float:
                return glue.cpu() + (_cpu_seconds(mosq.pid) or 0.0)

            self.say(f"glue: Mosquitto on 127.0.0.1:{mport}; latency at {o.rate} msg/s ...")
            _ph, result["latency"] = await self._latency(mport, "glue-lat", True, cpu)

            self.say(f"glue: sustained rate, steps of {o.step_seconds:g} s ...")
            result["sustained"] = await self._steps(mport, "glue", lambda ph: GlueProbe(ph, glue), cpu)
            result["kill"] = await self._glue_kill(glue, mport, "glue-kill", o.rate)
            over = self.overload_rate({"glue": result}) if o.overload_kill else None
            if over:
                result["kill_overload"] = await self._glue_kill(glue, mport, "glue-kill-over", over)
        finally:
            if glue is not None:
                glue.stop()
            _stop(mosq)
        return result

    async def main(self) -> dict:
        o = self.o
        out: dict = {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "protocol": "3.1.1", "qos": 1, "connections": o.connections, "payload_bytes": o.payload_bytes,
            "window": o.window, "offered_rate": o.rate, "latency_seconds": o.latency_seconds,
            "step_seconds": o.step_seconds, "kill_seconds": o.kill_seconds, "quick": bool(o.quick),
            "topic_prefix": self.prefix,
        }
        binding = f"{self.prefix}.c.#"
        self.rx = Receiver(self.config.amqp, binding)
        t0 = time.monotonic()
        try:
            if o.only in (None, "glue"):
                t = time.monotonic()
                out["glue"] = await self.glue()
                out["glue"]["seconds"] = round(time.monotonic() - t, 1)
            if o.only in (None, "lakegate"):
                out["captures"] = await self.per_capture(out)
        finally:
            self.rx.close()
            out["consumer_queue"] = delete_queue(binding)
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        compare(out)
        return out


def _bare_proton(config: Config, prefix: str, messages: int, payload_bytes: int, repeat: int = 3) -> dict:
    """The rate a bare python-qpid-proton sender reaches against the AMQP peer
    (``bridge.bench.amqp.bare_send``: mapped messages sent as fast as link
    credit allows, every disposition awaited), to topics nothing is bound to
    like the sustained steps': the reference for lakegate's rate with
    forwarding on. Median of ``repeat`` runs."""
    from bridge.amqp.mapping import PROFILES, map_row
    from bridge.bench.amqp import _rows, bare_send

    amqp = config.amqp
    topics = [f"{prefix}/bare/{i}" for i in range(10)]
    rows = _rows(messages, bytes(payload_bytes), 1, topics)
    runs = []
    for _ in range(repeat):
        outgoing = [map_row(r, PROFILES[amqp.profile], amqp.address_template, time.time()) for r in rows]
        runs.append(bare_send(amqp, outgoing))
    return {"messages": messages, "runs_s": [round(x, 3) for x in runs],
            "msgs_per_s": round(messages / statistics.median(runs), 1)}


def _engine_from_log(path: Path) -> str | None:
    try:
        for line in path.read_text(errors="replace").splitlines():
            if "tables: engine=" in line:
                return line.split("tables: engine=", 1)[1].split()[0]
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- command
def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError

    o = _opts(args)
    if min(o.connections, o.window, o.rate, o.start_rate, o.max_steps) < 1 or o.payload_bytes < 8:
        raise UsageError("--connections, --window, the rates and --max-steps must be positive, "
                         "--payload-bytes at least 8")
    if o.step_factor <= 1:
        raise UsageError("--step-factor must be more than 1")
    if not config.amqp.url:
        raise UsageError("bench e2e: amqp.url is empty (forwarding off); set it with --set amqp.url=...")
    if config.amqp.address_template != "/topic/{routing_key}":
        raise UsageError("bench e2e: the consumer needs amqp.address_template = \"/topic/{routing_key}\" "
                         "(RabbitMQ's amq.topic)")
    try:
        parse_captures(args.capture)
    except ValueError as exc:
        raise UsageError(f"bench e2e: {exc}") from None
    tmp = Path(tempfile.mkdtemp(prefix="lakegate-bench-e2e-"))
    try:
        result = asyncio.run(_Bench(args, config, tmp).main())
    finally:
        if args.keep:
            print(f"bench e2e: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
        print_captures(result)
    lg = result.get("lakegate")
    ok = lg is None or (lg.get("kill", {}).get("lost_acknowledged") == 0
                        and lg["latency"].get("lost_acknowledged") == 0)
    # every further capture log's latency phase ran and lost nothing (a missed target is not a failure)
    ok = ok and all("error" not in c and c["latency"].get("lost_acknowledged") == 0
                    for name, c in (result.get("captures") or {}).items() if name != "kafka_to_local")
    return 0 if ok else 1

