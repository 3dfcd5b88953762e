"""``bench e2e``'s publisher: pre-encoded QoS 1 PUBLISH frames sent on a
clock (each message due at a fixed time for the offered rate) over
``bench edge``'s load connections, every message's send and PUBACK time
kept. :class:`Phase` is one paced phase over several connections."""

from __future__ import annotations

import array
import asyncio
import socket
import time
from typing import Awaitable, Callable

from bridge.bench.e2e_observe import percentiles
from bridge.bench.edge import _connect_frame, _LoadConn

def frames(topic: bytes, count: int, payload_bytes: int) -> tuple[bytes, int]:
    """``count`` QoS 1 PUBLISH frames of one size (MQTT 3.1.1) back to back:
    packet ids cycle 1..65535, the payload starts with the message's sequence
    number (8 bytes, big-endian). Returns (blob, frame size)."""
    rl = 2 + len(topic) + 2 + payload_bytes
    if rl >= 16384:
        raise ValueError("payload too large for the bench's two-byte Remaining Length")
    head = b"\x32" + (bytes((rl,)) if rl < 128 else bytes((rl & 0x7F | 0x80, rl >> 7)))
    prefix = head + len(topic).to_bytes(2, "big") + topic
    size = len(prefix) + 2 + payload_bytes
    filler = b"p" * (payload_bytes - 8)
    parts = []
    for k in range(count):
        parts += (prefix, (k % 65535 + 1).to_bytes(2, "big"), k.to_bytes(8, "big"), filler)
    return b"".join(parts), size


class PacedConn(_LoadConn):
    """One publisher connection: ``bench edge``'s connection (CONNACK check,
    PUBACKs read and counted in bulk), driven by the clock instead of by the
    window: :meth:`send_upto` writes the frames that are due. Keeps every
    message's send and PUBACK time (PUBACKs come in order)."""

    def begin(self, blob: bytes, size: int, count: int, window: int) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.mode = "qos1"
        self.blob, self.size, self.count, self.window = memoryview(blob), size, count, window
        self.sent = self.acked = 0
        self.latencies = None
        self.send_t = array.array("d", bytes(8 * count))
        self.ack_t = array.array("d", bytes(8 * count))

    def send_upto(self, due: int) -> int:
        if self.lost or self.transport is None:
            return 0
        end = min(due, self.count, self.acked + self.window)
        n = end - self.sent
        if n <= 0:
            return 0
        start = self.sent
        self.transport.write(self.blob[start * self.size:end * self.size])
        self.send_t[start:end] = array.array("d", [time.perf_counter()]) * n
        self.sent = end
        return n

    def _acked(self, n: int) -> None:
        a = self.acked
        n = min(n, self.sent - a)
        self.ack_t[a:a + n] = array.array("d", [time.perf_counter()]) * n
        self.acked = a + n
        if self.acked >= self.count and not self.done.done():
            self.done.set_result(time.perf_counter())


class Phase:
    """One paced publishing phase: ``rate`` msg/s for ``seconds`` over the
    connections, to ``<prefix>/<c|s>/<label>/<connection>``."""

    def __init__(self, prefix: str, label: str, rate: float, seconds: float, connections: int,
                 payload_bytes: int, window: int, consumed: bool) -> None:
        self.label, self.rate, self.seconds = label, rate, seconds
        self.topic_base = f"{prefix}/{'c' if consumed else 's'}/{label}/"
        total = max(connections, int(round(rate * seconds)))
        self.per = [total // connections + (1 if i < total % connections else 0) for i in range(connections)]
        self.payload_bytes, self.window = payload_bytes, window
        self.conns: list[PacedConn] = []
        self.t0 = self.t_sent = self.t_end = 0.0
        self.error: str | None = None

    def topic(self, i: int) -> str:
        return f"{self.topic_base}{i:04d}"

    async def connect(self, host: str, port: int, timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        for i, n in enumerate(self.per):
            _t, c = await loop.create_connection(PacedConn, host, port)
            sock = c.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.transport.write(_connect_frame(f"{self.topic_base.replace('/', '-')}{i}"))
            self.conns.append(c)
        await asyncio.wait_for(asyncio.gather(*(c.connack for c in self.conns)), timeout)
        for i, (c, n) in enumerate(zip(self.conns, self.per)):
            blob, size = frames(self.topic(i).encode(), n, self.payload_bytes)
            c.begin(blob, size, n, self.window)

    async def publish(self, tick: float = 0.002,
                      hooks: list[tuple[float, Callable[[], Awaitable[None]]]] | None = None,
                      sampler: Callable[[], None] | None = None, sample_every: float = 0.1,
                      ack_timeout: float = 30.0, until: Callable[[float], bool] | None = None) -> None:
        """Send on schedule (message k of connection i is due at
        t0 + (k + i / connections) / per-connection rate), run ``hooks`` (at
        seconds after t0, as tasks), call ``sampler`` every ``sample_every``
        seconds; stop early once ``until(elapsed)`` is true (the phase then
        holds what was sent); then wait at most ``ack_timeout`` for the
        outstanding PUBACKs."""
        n_conn = len(self.conns)
        rate_c = self.rate / n_conn
        pending = sorted(hooks or [], key=lambda h: h[0])
        tasks: list[asyncio.Task] = []
        next_sample = 0.0
        self.t0 = time.perf_counter()
        while True:
            el = time.perf_counter() - self.t0
            left = 0
            for i, c in enumerate(self.conns):
                due = int((el - i / self.rate) * rate_c) + 1 if el >= i / self.rate else 0
                c.send_upto(due)
                if not c.lost:
                    left += c.count - c.sent
            while pending and el >= pending[0][0]:
                tasks.append(asyncio.ensure_future(pending.pop(0)[1]()))
            if sampler is not None and el >= next_sample:
                sampler()
                next_sample = el + sample_every
            if until is not None and left and until(el):
                for c in self.conns:
                    c.count = c.sent
                    if c.acked >= c.count and c.done is not None and not c.done.done():
                        c.done.set_result(time.perf_counter())
                left = 0
            if left == 0 or el > self.seconds * 3 + 30:
                break
            await asyncio.sleep(tick)
        self.t_sent = time.perf_counter()
        deadline = self.t_sent + ack_timeout
        while time.perf_counter() < deadline and any(not c.lost and c.acked < c.sent for c in self.conns):
            if sampler is not None:
                sampler()
            await asyncio.sleep(sample_every)
        self.t_end = time.perf_counter()
        for t in tasks:
            await t
        for c in self.conns:
            if c.done is not None and c.done.done() and not c.done.cancelled():
                exc = c.done.exception()
                if exc is not None and self.error is None:
                    self.error = str(exc)

    def close(self) -> None:
        for c in self.conns:
            if c.transport is not None and not c.lost:
                c.transport.write(b"\xe0\x00")
                c.transport.close()

    # -- results
    @property
    def sent(self) -> int:
        return sum(c.sent for c in self.conns)

    @property
    def acked(self) -> int:
        return sum(c.acked for c in self.conns)

    def send_rate(self) -> float | None:
        firsts = [c.send_t[0] for c in self.conns if c.sent]
        lasts = [c.send_t[c.sent - 1] for c in self.conns if c.sent]
        if not firsts or self.sent < 2:
            return None
        span = max(lasts) - min(firsts)
        return round((self.sent - 1) / span, 1) if span > 0 else None

    def puback_ms(self) -> dict | None:
        lat = [c.ack_t[k] - c.send_t[k] for c in self.conns for k in range(c.acked)]
        return percentiles(lat, (50, 99))

    def summary(self) -> dict:
        return {"offered_rate": self.rate, "seconds": self.seconds, "messages": sum(c.count for c in self.conns),
                "sent": self.sent, "acknowledged": self.acked, "send_rate": self.send_rate(),
                "puback_ms": self.puback_ms(), **({"error": self.error} if self.error else {})}
