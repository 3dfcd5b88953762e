"""What ``bench e2e`` observes: the AMQP consumer (every message's receipt
time), what a phase delivered (lost, duplicates, latency percentiles), and
each side's backlog during a sustained-rate step (:class:`JobProbe` for
lakegate, :class:`GlueProbe` for the glue)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from bridge.config import Config

if TYPE_CHECKING:
    from bridge.bench.e2e_load import Phase
    from bridge.bench.e2e_procs import Glue

def percentiles(values: list[float], qs=(50, 95, 99)) -> dict | None:
    if not values:
        return None
    s = sorted(values)
    out = {f"p{q}": round(s[min(len(s) - 1, int(len(s) * q / 100))] * 1000, 2) for q in qs}
    out["max"] = round(s[-1] * 1000, 2)
    return out


def backlog_slope(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) samples, value per second."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return sum((t - mt) * (v - mv) for t, v in samples) / den if den > 0 else None


# ---------------------------------------------------------------- AMQP consumer
class Receiver:
    """AMQP 1.0 receiver on ``/topic/<binding>`` in a proton thread; keeps
    (topic, sequence, receipt time) of every message."""

    def __init__(self, amqp: Any, binding: str) -> None:
        from proton.handlers import MessagingHandler
        from proton.reactor import EventInjector

        from bridge.amqp.reactor import container

        from bridge.amqp.sender import peer_url

        url, user, password = peer_url(amqp)
        creds = {k: v for k, v in (("user", user), ("password", password)) if v is not None}

        self.rx: list[tuple[str, int, float]] = []
        self.error: str | None = None
        self.ready = threading.Event()
        self.injector = EventInjector()
        self.conn: Any = None
        me = self

        class H(MessagingHandler):
            def __init__(self) -> None:
                super().__init__(prefetch=5000)

            def on_start(self, event: Any) -> None:
                event.container.selectable(me.injector)
                me.conn = event.container.connect(url, reconnect=False, allowed_mechs=amqp.sasl_mechanisms,
                                                  **creds)
                event.container.create_receiver(me.conn, f"/topic/{binding}")

            def on_link_opened(self, event: Any) -> None:
                me.ready.set()

            def on_message(self, event: Any) -> None:
                t = time.perf_counter()
                m = event.message
                body = m.body if isinstance(m.body, (bytes, bytearray, memoryview)) else b""
                me.rx.append((m.address or "", int.from_bytes(bytes(body[:8]), "big"), t))

            def on_transport_error(self, event: Any) -> None:
                me.error = str(event.transport.condition)
                me.ready.set()

            def on_lg_stop(self, event: Any) -> None:
                me.conn.close()
                me.injector.close()

        self.container = container(H())
        self.thread = threading.Thread(target=self.container.run, daemon=True, name="bench-e2e-consumer")
        self.thread.start()
        if not self.ready.wait(15) or self.error:
            raise RuntimeError(f"AMQP consumer could not attach to /topic/{binding}: {self.error or 'timeout'}")

    def received(self, phase: Phase) -> dict[tuple[int, int], list[float]]:
        """(connection, sequence) -> receipt times, for the phase's messages."""
        base = phase.topic_base
        out: dict[tuple[int, int], list[float]] = {}
        for topic, seq, t in list(self.rx):
            if topic.startswith(base):
                out.setdefault((int(topic[len(base):]), seq), []).append(t)
        return out

    def count(self, phase: Phase) -> int:
        base = phase.topic_base
        return sum(1 for topic, _s, _t in list(self.rx) if topic.startswith(base))

    def close(self) -> None:
        from proton.reactor import ApplicationEvent

        self.injector.trigger(ApplicationEvent("lg_stop"))
        self.thread.join(10)


def delivery(phase: Phase, rx: Receiver) -> dict:
    """What the consumer got of ``phase``: acknowledged, received, lost,
    duplicates, publish-to-receipt latency."""
    got = rx.received(phase)
    lat: list[float] = []
    lost = unacked_received = 0
    for i, c in enumerate(phase.conns):
        for k in range(c.acked):
            times = got.get((i, k))
            if times is None:
                lost += 1
            else:
                lat.append(times[0] - c.send_t[k])
        unacked_received += sum(1 for k in range(c.acked, c.sent) if (i, k) in got)
    return {"acknowledged": phase.acked, "received": len(got), "lost_acknowledged": lost,
            "duplicates": sum(len(v) - 1 for v in got.values()),
            "received_not_acknowledged": unacked_received, "e2e_ms": percentiles(lat)}


async def wait_until(cond: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)
    return True


async def settle(phase: Phase, rx: Receiver, idle: Callable[[], bool], timeout: float,
                  quiet: float = 3.0) -> bool:
    """Wait until every acknowledged message of ``phase`` was received (True),
    or the system is ``idle()`` and nothing more arrived for ``quiet``
    seconds, or ``timeout`` (False)."""
    done = all_received(phase, rx)
    deadline = time.monotonic() + max(timeout, 0.0)
    last, since = -1, time.monotonic()
    while True:
        if done():
            return True
        now = time.monotonic()
        n = rx.count(phase)
        if n != last:
            last, since = n, now
        elif now - since >= quiet and idle():
            return False
        if now >= deadline:
            return False
        await asyncio.sleep(0.25)


def all_received(phase: Phase, rx: Receiver) -> Callable[[], bool]:
    def cond() -> bool:
        if rx.count(phase) < phase.acked:
            return False
        got = rx.received(phase)
        return all((i, k) in got for i, c in enumerate(phase.conns) for k in range(c.acked))
    return cond


# ---------------------------------------------------------------- the two sides
class Probe:
    """Backlog of one side during a step: ``backlog()`` -> (new sample?,
    backlog) or None; ``drained()``; ``summary()`` adds to the step's JSON."""

    min_samples = 1

    def backlog(self) -> tuple[bool, int] | None:
        raise NotImplementedError

    def drained(self) -> bool:
        got = self.backlog()
        return got is not None and got[1] <= 0

    def summary(self) -> dict:
        return {}


class JobProbe(Probe):
    """lakegate: the job's lag (log end - the checkpoint's committed offsets,
    as ``lakegate status``), a sample per committed batch; and the batches'
    input rows and durations from the status file. With live forwarding
    (``bridge.amqp.live``) the backlog is the larger of the job's lag and
    the forwarder's (log end - its forwarded marks): both must keep up."""

    def __init__(self, config: Config, min_samples: int) -> None:
        from bridge.amqp.live import forwards_live
        from bridge.job.pipeline import checkpoint_path

        self.config = config
        self.live = forwards_live(config, hosts_edge=True, runs_job=True)
        self.checkpoint = checkpoint_path(config)
        self.min_samples = min_samples
        self.reader: Any = None
        self.last_batch: int | None = None
        self.batches: dict[int, tuple[int, int]] = {}

    def backlog(self) -> tuple[bool, int] | None:
        from bridge.capture import open_reader
        from bridge.job.progress import committed_offsets, lag, read_status

        batch, end = committed_offsets(self.checkpoint)
        if batch is None:
            return None
        if self.reader is None:
            # a committed batch: the capture log exists (local files or the Kafka topic)
            if self.config.capture.backend == "local" and not (self.config.capture_dir / "meta.json").exists():
                return None
            self.reader = open_reader(self.config)
        ends = {str(p): n for p, n in enumerate(self.reader.durable_offsets())}
        new = batch != self.last_batch
        self.last_batch = batch
        if new:
            try:
                st = read_status(self.config.data_path) or {}
            except (OSError, ValueError):  # being replaced right now; the next batch's will do
                st = {}
            if st.get("batch_id") is not None:
                self.batches[int(st["batch_id"])] = (int(st.get("input_rows", 0)), int(st.get("duration_ms", 0)))
        behind = lag(end, ends)
        if self.live:
            from bridge.amqp.forwarded import ForwardedOffsets

            behind = max(behind, ForwardedOffsets(self.config.data_path, self.config.capture_stream).behind(ends))
        return new, behind

    def reset(self) -> None:
        self.batches = {}

    def close(self) -> None:
        """Let go of the capture log (a Kafka reader's consumers)."""
        close = getattr(self.reader, "close", None)
        self.reader = None
        if close is not None:
            close()

    def summary(self) -> dict:
        b = [v for k, v in sorted(self.batches.items())[1:]]  # the first may have started before the step
        rows, ms = sum(r for r, _ in b), sum(d for _, d in b)
        return {"job_batches": len(b), "job_batch_s_mean": round(ms / len(b) / 1000, 2) if b else None,
                "job_rows_per_busy_s": round(rows / (ms / 1000), 1) if ms else None}


class GlueProbe(Probe):
    """glue: messages Mosquitto acknowledged to the publisher minus messages
    the AMQP peer accepted from the glue since the step began."""

    def __init__(self, phase: Phase, glue: "Glue") -> None:
        self.phase, self.glue = phase, glue
        self.base = glue.accepted()

    def backlog(self) -> tuple[bool, int]:
        return True, self.phase.acked - (self.glue.accepted() - self.base)
