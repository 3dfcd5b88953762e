"""``bench e2e``'s measurements, one phase at a time: latency, the
sustained-rate steps (and one step at the bare sender's rate), the SIGKILL
tests. What each measures and how a step is judged: the module doc of
:mod:`bridge.bench.e2e`, which runs them in order for each side."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bridge.bench.e2e_load import Phase
from bridge.bench.e2e_observe import Probe, Receiver, all_received, backlog_slope, delivery, settle, wait_until
from bridge.bench.e2e_table import TableWatch

if TYPE_CHECKING:  # pragma: no cover
    from bridge.bench.e2e_procs import Glue, Lakegate

__all__ = ["PhaseRunner", "SLOPE_LIMIT"]

#: a step holds when the backlog grows by at most this fraction of the offered rate per second
SLOPE_LIMIT = 0.10


class PhaseRunner:
    """The phases, with what they share: the options (``o``), the topic
    prefix, the AMQP consumer (``rx``), the job's trigger while lakegate's
    steps run (a step spans six at least; 0 for the glue) and ``say``."""

    def __init__(self, o: argparse.Namespace, prefix: str, say: Callable[[str], None]) -> None:
        self.o = o
        self.prefix = prefix
        self.say = say
        self.trigger_s = 0.0
        self.rx: Receiver | None = None

    def phase(self, label: str, rate: float, seconds: float, consumed: bool = True) -> Phase:
        o = self.o
        return Phase(self.prefix, label, rate, seconds, o.connections, o.payload_bytes, o.window, consumed)

    async def _latency(self, port: int, label: str, warm: bool, cpu: Callable[[], float],
                       table_dir: Path | None = None) -> tuple[Phase, dict]:
        """The latency phase; with ``table_dir`` (lakegate's ``messages``
        table) also publish -> visible in the table (:mod:`bridge.bench.e2e_table`),
        waiting up to 120 s for every acknowledged message to be there."""
        o, rx = self.o, self.rx
        if warm and o.warmup_seconds > 0:
            w = self.phase(f"{label}-warm", o.rate, o.warmup_seconds)
            await w.connect("127.0.0.1", port)
            await w.publish()
            w.close()
            await wait_until(all_received(w, rx), 120)
        ph = self.phase(label, o.rate, o.latency_seconds)
        watch = stop = task = None
        if table_dir is not None:
            watch, stop = TableWatch(table_dir, ph.topic_base), asyncio.Event()
            task = asyncio.ensure_future(watch.run(stop))
        await ph.connect("127.0.0.1", port)
        c0 = cpu()
        await ph.publish(ack_timeout=120)
        ph.close()
        await wait_until(all_received(ph, rx), 120)
        cpu_s = cpu() - c0
        out = {**ph.summary(), **delivery(ph, rx), "cpu_s": round(cpu_s, 2),
               "cpu_s_per_1000_msgs": round(1000 * cpu_s / ph.sent, 2) if ph.sent else None}
        if watch is not None:
            await wait_until(lambda: watch.found() >= ph.acked, 120)
            stop.set()
            await task
            out["table"] = watch.latency(ph)
        return ph, out

    async def _steps(self, port: int, label: str, probe: Callable[[Phase], "Probe"],
                     cpu: Callable[[], float], start_rate: float | None = None) -> dict:
        """Step the rate up until a step does not hold, then ``--refine``
        steps between the highest that held and the lowest that did not (at
        their geometric mean, rounded to 100 msg/s)."""
        o = self.o
        steps: list[dict] = []
        best: float | None = None
        failed: float | None = None
        rate = float(start_rate or o.start_rate)
        for n in range(o.max_steps):
            step = await self._step(port, f"{label}-s{n}", rate, probe, cpu)
            steps.append(step)
            if not step["sustained"]:
                failed = rate
                break
            best = rate
            rate = float(round(rate * o.step_factor))
        for n in range(o.refine if best is not None and failed is not None else 0):
            mid = float(round((best * failed) ** 0.5, -2))
            if not best < mid < failed:
                break
            step = await self._step(port, f"{label}-r{n}", mid, probe, cpu)
            step["refinement"] = True
            steps.append(step)
            if step["sustained"]:
                best = mid
            else:
                failed = mid
        return {"steps": steps, "max_sustained_rate": best, "lowest_failed_rate": failed,
                "criterion": f"send rate >= 95% of offered, every message acknowledged, backlog slope "
                             f"<= {SLOPE_LIMIT:.0%} of offered per s after the first {o.settle_seconds:g} s, "
                             f"backlog under half the step's messages"}

    async def _at_rate(self, port: int, label: str, sustained: dict, rate: float,
                       probe: Callable[[Phase], "Probe"], cpu: Callable[[], float]) -> dict:
        """Whether lakegate holds ``rate`` (the bare sender's, rounded up to 100
        msg/s): decided by the steps when one at or above it held or one at or
        below it did not, else one more step at that rate. The steps' geometric
        search leaves a bracket (e.g. 14,600 held, 16,000 not) too wide to
        compare with a reference that moves 15 % between runs."""
        target = float(math.ceil(rate / 100.0) * 100)
        steps = sustained["steps"]
        above = [st for st in steps if st["sustained"] and st["offered_rate"] >= target]
        below = [st for st in steps if not st["sustained"] and st["offered_rate"] <= target]
        if above or below:
            st = (above or below)[0]
            return {"rate": target, "holds": bool(above), "by_step": st["offered_rate"]}
        self.say(f"lakegate: at the bare sender's rate, {target:,.0f} msg/s ...")
        step = await self._step(port, label, target, probe, cpu)
        return {"rate": target, "holds": step["sustained"], "step": step}

    async def _step(self, port: int, label: str, rate: float, probe: Callable[[Phase], "Probe"],
                    cpu: Callable[[], float]) -> dict:
        """One step: publish at ``rate`` for ``--step-seconds`` (lakegate: until
        ``--min-batches`` samples after the settle time, at most three times
        as long, unless the backlog is already over half of what was sent),
        judge it, wait for the backlog to drain."""
        o = self.o
        # lakegate's step spans six triggers of the job at least: its backlog swings by a trigger's
        # traffic plus a batch, over half of a 12 s step's messages at a 5 s trigger
        step_s = max(o.step_seconds, 6 * self.trigger_s)
        ph = self.phase(label, rate, step_s * 3, consumed=False)
        await ph.connect("127.0.0.1", port)
        pr = probe(ph)
        samples: list[tuple[float, int]] = []
        all_samples: list[int] = []

        def sample() -> None:
            got = pr.backlog()
            if got is None:
                return
            new, value = got
            all_samples.append(value)
            if new:
                samples.append((time.perf_counter() - ph.t0, value))

        def enough(el: float) -> bool:
            if el < step_s:
                return False
            if all_samples and all_samples[-1] > 0.5 * ph.sent:
                return True  # overwhelmed: no need for a trend
            return sum(1 for t, _v in samples if t >= o.settle_seconds) >= pr.min_samples

        c0 = cpu()
        await ph.publish(sampler=sample, sample_every=0.05, ack_timeout=60, until=enough)
        cpu_s = cpu() - c0
        ph.close()
        sent_for = ph.t_sent - ph.t0
        window = [(t, v) for t, v in samples if o.settle_seconds <= t <= sent_for]
        slope = backlog_slope(window)
        send_rate = ph.send_rate() or 0.0
        at_end = all_samples[-1] if all_samples else None
        t_drain = time.perf_counter()
        ok_drain = await wait_until(pr.drained, 90, poll=0.1)
        drain_s = time.perf_counter() - t_drain
        held = (ph.error is None and send_rate >= 0.95 * rate and ph.acked == ph.sent and ok_drain
                and slope is not None and slope <= SLOPE_LIMIT * rate
                and at_end is not None and at_end <= 0.5 * ph.sent)
        step = {"offered_rate": rate, "seconds": round(sent_for, 1), "messages": ph.sent,
                "send_rate": send_rate, "acknowledged": ph.acked, "puback_ms": ph.puback_ms(),
                "backlog_samples": len(window),
                "backlog_slope_per_s": round(slope, 1) if slope is not None else None,
                "backlog_max": max(all_samples) if all_samples else None, "backlog_at_end": at_end,
                "drain_s": round(drain_s, 2), "drained": ok_drain, "cpu_s": round(cpu_s, 2),
                **pr.summary(), "sustained": held, **({"error": ph.error} if ph.error else {})}
        self.say(f"  {label}: {rate:,.0f} msg/s for {sent_for:.0f} s: sent at {send_rate:,.0f}/s, "
                 f"backlog slope {step['backlog_slope_per_s']}/s over {len(window)} samples, max "
                 f"{step['backlog_max']}: {'holds' if held else 'does not hold'}")
        return step

    # -- kill tests
    def _kill_result(self, kp: Phase, rx: Receiver, recovered: bool, t_from: float, **extra: Any) -> dict:
        d = delivery(kp, rx)
        return {**extra, "offered_rate": kp.rate, "sent": kp.sent, "acknowledged": kp.acked,
                "all_acknowledged_received_s": round(time.perf_counter() - t_from, 1) if recovered else None,
                "received": d["received"], "lost_acknowledged": d["lost_acknowledged"],
                "duplicates": d["duplicates"], "received_not_acknowledged": d["received_not_acknowledged"]}

    async def _lakegate_kill(self, lg: Lakegate, label: str, rate: float, restart: list[str],
                             idle: Callable[[], bool]) -> dict:
        o = self.o
        self.say(f"lakegate: kill test at {rate:,.0f} msg/s, SIGKILL after {o.kill_seconds / 2:g} s ...")
        kp = self.phase(label, rate, o.kill_seconds)
        await kp.connect("127.0.0.1", lg.port)
        killed_at: list[float] = []

        async def kill() -> None:
            killed_at.append(time.perf_counter() - kp.t0)
            lg.kill()

        await kp.publish(hooks=[(o.kill_seconds / 2, kill)], ack_timeout=5)
        kp.close()
        received_before = delivery(kp, self.rx)["received"]
        t_restart = time.perf_counter()
        restart_s = lg.start(restart, o.startup_timeout)
        recovered = await settle(kp, self.rx, idle, o.recovery_timeout - (time.perf_counter() - t_restart))
        out = self._kill_result(
            kp, self.rx, recovered, t_restart,
            signal="SIGKILL to the process group (driver, Spark JVM, Python workers); started again "
                   "on the same data_dir" + (f" with {', '.join(restart)}" if restart else ""),
            killed_at_s=round(killed_at[0], 2) if killed_at else None,
            received_before_restart=received_before, restart_s=round(restart_s, 1))
        self.say(f"lakegate: kill at {rate:,.0f} msg/s: {out['acknowledged']} acknowledged, "
                 f"{out['lost_acknowledged']} lost, {out['duplicates']} duplicates")
        return out

    async def _glue_kill(self, glue: "Glue", port: int, label: str, rate: float) -> dict:
        o = self.o
        self.say(f"glue: kill test at {rate:,.0f} msg/s, SIGKILL after {o.kill_seconds / 2:g} s ...")
        kp = self.phase(label, rate, o.kill_seconds)
        await kp.connect("127.0.0.1", port)
        timing: dict[str, Any] = {}

        async def kill_and_restart() -> None:
            timing["killed_at_s"] = round(time.perf_counter() - kp.t0, 2)
            st = glue.status()  # written every 0.25 s: about where it was
            timing["glue_received_accepted_before_kill"] = [st.get("received"), st.get("accepted")]
            glue.kill()
            t = time.perf_counter()
            glue.start()
            await wait_until(glue.ready, 60, poll=0.02)
            timing["restart_s"] = round(time.perf_counter() - t, 2)

        await kp.publish(hooks=[(o.kill_seconds / 2, kill_and_restart)], ack_timeout=30)
        kp.close()
        t_end = time.perf_counter()
        recovered = await settle(kp, self.rx, glue.idle, min(60.0, o.recovery_timeout))
        out = self._kill_result(kp, self.rx, recovered, t_end,
                                signal="SIGKILL to the glue process; started again at once (same client id)",
                                **timing)
        self.say(f"glue: kill at {rate:,.0f} msg/s: {out['acknowledged']} acknowledged, "
                 f"{out['lost_acknowledged']} lost, {out['duplicates']} duplicates")
        return out
