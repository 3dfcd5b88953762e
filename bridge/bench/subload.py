"""Load generator of ``lakegate bench subscribe``: one publisher and N
subscribers over raw asyncio sockets, MQTT 3.1.1, frames built and checked
with the project's own codec (:mod:`bridge.mqtt`).

Why not paho or ``mosquitto_pub``: paho stalls past 65,535 queued QoS 1
messages and ``mosquitto_pub -l -q 1`` loses messages, so neither can drive
a server at its limit. This generator runs in the bench's process, never in
the server's.

Contract
--------
* :class:`FanOut` is one measurement (one "run"): it connects ``subscribers``
  clients (clean session, one SUBSCRIBE to ``bench/<label>/+`` at ``qos``),
  then one publisher, publishes to ``bench/<label>/data`` at ``qos`` for
  ``seconds`` (or ``messages``), then waits until every subscriber has every
  message (or nothing moved for ``stall_s``, or ``timeout`` ran out) and
  disconnects everyone. :meth:`FanOut.run` returns a dict (see there); a
  refused SUBSCRIBE or CONNECT raises :class:`Refused`.
* Flow control is closed-loop, so a run measures what the server delivers,
  not how much it can buffer or drop: at most ``publish_window``
  unacknowledged PUBLISH (QoS 1), and at most ``window`` messages published
  and not yet received by the slowest subscriber (both QoS). With ``rate``
  the publisher is also paced (message k due at ``k / rate`` s).
* Every PUBLISH payload is ``seq`` (u64) + ``time.monotonic_ns()`` when the
  frame was written (u64) + filler up to ``payload_bytes`` (>= 16).
  Subscribers take ``time.monotonic_ns()`` once per chunk read; with
  ``record_latency`` each message sent after the warm-up adds one
  publish-to-subscriber latency. CLOCK_MONOTONIC is one clock for every
  process on the machine.
* Subscribers count unique messages per subscriber (a ``seq`` below the
  next expected one is a duplicate, a jump is counted as a gap), acknowledge
  QoS 1 with one write per chunk read, and decode the first PUBLISH of each
  connection, and every frame that is not a PUBLISH, with
  :func:`bridge.mqtt.decode_packet`; the hot path reads the fixed header,
  topic length, packet id and the two payload fields by hand
  (:func:`parse_publish` is checked against the codec in the tests).

Every wait is bounded by a timeout; nothing here loops without a bound.
The bench's other load, idle persistent sessions, is
:mod:`bridge.bench.subscribe_idle`.

One piece: the clients and :class:`FanOut` are one measurement's two
halves: subscribers and the publisher call back into their run on every
chunk (``delivered``, ``acked``, ``fail``) and read the template's layout
there (``fixed``, ``size``, ``pid_at``, ``payload_at``, ``warm_seq``);
:func:`publish_template` and :meth:`FanOut.pump` write that layout
(``_STAMP``: sequence and send time) and :func:`parse_publish` and the
subscribers' bulk path read it. Split, the layout would be in one module
and its only readers in another.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import time
from array import array

import numpy as np

from bridge.mqtt import (
    Connack, Connect, Disconnect, IncompleteData, Publish, Suback, Subscribe,
    Subscription, decode_packet, encode,
)

__all__ = ["FanOut", "LEVEL", "Refused", "frame_header", "parse_publish", "publish_template"]

LEVEL = 4  # MQTT 3.1.1 everywhere: the level both servers have served longest
_STAMP = struct.Struct(">QQ")
_U16 = struct.Struct(">H")
_DISCONNECT = encode(Disconnect(), LEVEL)


class Refused(Exception):
    """The server refused a CONNECT or a SUBSCRIBE (the message says which code)."""


# ---------------------------------------------------------------- frames
def publish_template(topic: str, qos: int, payload_bytes: int) -> tuple[bytes, int, int]:
    """A PUBLISH frame encoded by the codec, with the offsets to patch:
    (frame, packet id offset or -1, payload offset)."""
    if payload_bytes < _STAMP.size:
        raise ValueError(f"payload_bytes must be at least {_STAMP.size} (sequence and timestamp)")
    frame = encode(Publish(qos=qos, topic=topic, packet_id=1 if qos else None,
                           payload=b"p" * payload_bytes), LEVEL)
    payload_at = len(frame) - payload_bytes
    return frame, (payload_at - 2 if qos else -1), payload_at


def parse_publish(buf, pos: int, end: int, header_len: int) -> tuple[int, bytes | None, int, int]:
    """The hot-path reading of one server-to-client PUBLISH ``buf[pos:end]``
    whose fixed header is ``header_len`` bytes: (qos, packet id bytes or None,
    seq, send timestamp ns). The payload must hold the bench's stamp."""
    b0 = buf[pos]
    at = pos + header_len
    at += 2 + ((buf[at] << 8) | buf[at + 1])
    qos = (b0 >> 1) & 3
    pid = None
    if qos:
        pid = bytes(buf[at:at + 2])
        at += 2
    seq, ts = _STAMP.unpack_from(buf, at)
    return qos, pid, seq, ts


def frame_header(buf, pos: int, n: int) -> tuple[int, int] | None:
    """(fixed header length, total frame length) of the frame at ``pos``,
    or None when the fixed header is not complete yet."""
    rl = 0
    shift = 0
    at = pos + 1
    while True:
        if at >= n:
            return None
        b = buf[at]
        rl |= (b & 0x7F) << shift
        at += 1
        if not b & 0x80:
            break
        shift += 7
        if shift > 21:
            raise ValueError("Remaining Length longer than four bytes")
    return at - pos, at - pos + rl


def _nodelay(transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# ---------------------------------------------------------------- clients
class _Client(asyncio.Protocol):
    """Handshake part shared by subscribers and the publisher: every frame
    before streaming starts is decoded by the codec."""

    def __init__(self, run: FanOut) -> None:
        self.run = run
        run.clients.append(self)  # closed by the run, whatever happens
        self.transport = None
        self.buf = b""
        self.streaming = False
        self.reply: asyncio.Future | None = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        _nodelay(transport)

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(ConnectionError(f"server closed the connection ({exc})"))
        self.run.lost(self, exc)

    async def request(self, frame: bytes, timeout: float):
        self.reply = asyncio.get_running_loop().create_future()
        self.transport.write(frame)
        return await asyncio.wait_for(self.reply, timeout)

    def handshake_data(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        try:
            packet, used = decode_packet(buf, LEVEL, from_client=False)
        except IncompleteData:
            self.buf = buf
            return
        self.buf = buf[used:]
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(packet)


class _Subscriber(_Client):
    def __init__(self, run: FanOut, index: int) -> None:
        super().__init__(run)
        self.index = index
        self.next_seq = 0
        self.duplicates = 0
        self.gaps = 0
        self.checked = False

    def data_received(self, data: bytes) -> None:
        if not self.streaming:
            return self.handshake_data(data)
        now = time.monotonic_ns()
        buf = self.buf + data if self.buf else data
        if self.checked and len(buf) >= 8 * self.run.size and self._bulk(buf, now):
            return
        n = len(buf)
        pos = 0
        got = 0
        acks = []
        run = self.run
        lat = run.latencies
        warm = run.warm_seq
        while pos < n:
            hdr = frame_header(buf, pos, n)
            if hdr is None or pos + hdr[1] > n:
                break
            hl, size = hdr
            end = pos + size
            if buf[pos] & 0xF7 != run.fixed0:  # a PUBLISH, QoS as granted, RETAIN 0; DUP may be set
                run.fail(f"subscriber {self.index}: unexpected {_describe(buf[pos:end])}")
                pos = end
                continue
            if not self.checked:
                self.checked = True
                if not self._check(buf[pos:end]):
                    pos = end
                    continue
            qos, pid, seq, ts = parse_publish(buf, pos, end, hl)
            if pid is not None:
                acks.append(b"\x40\x02" + pid)
            if seq < self.next_seq:
                self.duplicates += 1
            else:
                if seq > self.next_seq:
                    self.gaps += seq - self.next_seq
                self.next_seq = seq + 1
                got += 1
                if lat is not None and seq >= warm:
                    lat.append(now - ts)
            pos = end
        self.buf = buf[pos:] if pos < n else b""
        if acks:
            self.transport.write(b"".join(acks))
        if got:
            run.delivered(self.index, got)

    def _bulk(self, buf: bytes, now: int) -> bool:
        """The fast path for a chunk of k whole frames identical to the
        template but for packet id and payload stamp (every header and topic
        byte compared at its stride), whose sequence numbers follow on. False
        (nothing consumed) otherwise: the frame-by-frame path takes over."""
        run = self.run
        size = run.size
        k = len(buf) // size
        head = buf[:k * size]
        for j, byte in enumerate(run.fixed):
            if head[j::size] != byte * k:
                return False
        rows = np.frombuffer(head, dtype=np.uint8).reshape(k, size)
        at = run.payload_at
        seqs = rows[:, at:at + 8].copy().view(">u8").ravel()
        if int(seqs[0]) != self.next_seq or int(seqs[-1]) != self.next_seq + k - 1 or (
                k > 1 and not (np.diff(seqs) == 1).all()):
            return False
        if run.latencies is not None:
            ts = rows[:, at + 8:at + 16].copy().view(">u8").ravel().astype(np.int64)
            run.latencies.extend((now - ts[seqs >= run.warm_seq]).tolist())
        if run.pid_at >= 0:
            acks = bytearray(4 * k)
            acks[0::4] = b"\x40" * k
            acks[1::4] = b"\x02" * k
            acks[2::4] = head[run.pid_at::size]
            acks[3::4] = head[run.pid_at + 1::size]
            self.transport.write(acks)
        self.next_seq += k
        self.buf = buf[k * size:]
        run.delivered(self.index, k)
        return True

    def _check(self, frame: bytes) -> bool:
        """Decode one PUBLISH with the codec: topic and QoS as subscribed."""
        run = self.run
        try:
            p, _ = decode_packet(frame, LEVEL, from_client=False)
        except Exception as exc:  # noqa: BLE001 -- reported as the run's error, the bench goes on
            run.fail(f"subscriber {self.index}: bad PUBLISH: {exc}")
            return False
        if p.topic != run.topic or p.qos != run.qos or len(p.payload) != run.payload_bytes:
            run.fail(f"subscriber {self.index}: PUBLISH topic {p.topic!r} QoS {p.qos} "
                     f"{len(p.payload)} bytes, expected {run.topic!r} QoS {run.qos} "
                     f"{run.payload_bytes} bytes")
            return False
        return True


class _Publisher(_Client):
    def __init__(self, run: FanOut) -> None:
        super().__init__(run)
        self.acked = 0

    def data_received(self, data: bytes) -> None:
        if not self.streaming:
            return self.handshake_data(data)
        buf = self.buf + data if self.buf else data
        k = len(buf) // 4
        frames, self.buf = buf[:4 * k], buf[4 * k:]
        if not k:
            return
        if frames[0::4] != b"\x40" * k or frames[1::4] != b"\x02" * k:
            return self.run.fail(f"publisher: unexpected {_describe(frames)}")
        self.acked += k
        run = self.run
        if run.puback_latencies is not None:  # PUBACKs come in order [MQTT-4.6.0-2]
            now = time.monotonic_ns()
            batches, left = run.batches, k
            while left and batches:
                head = batches[0]  # [messages left, stamp, seq of the next one]
                take = min(left, head[0])
                counted = min(take, max(0, head[2] + take - run.warm_seq))  # after the warm-up
                if counted:
                    run.puback_latencies.extend([now - head[1]] * counted)
                head[0] -= take
                head[2] += take
                left -= take
                if not head[0]:
                    batches.popleft()
        run.acked(k)


def _describe(frame: bytes) -> str:
    try:
        p, _ = decode_packet(frame, LEVEL, from_client=False)
        return repr(p)
    except Exception as exc:  # noqa: BLE001 -- a description for an error message
        return f"bytes {frame[:8].hex()}... ({exc})"


# ---------------------------------------------------------------- one run
class FanOut:
    """One publisher, ``subscribers`` subscribers, one measurement; see the
    module docstring for the flow control and the payload."""

    def __init__(self, host: str, port: int, *, label: str, subscribers: int, qos: int,
                 payload_bytes: int = 64, publish_window: int = 100, window: int = 500,
                 seconds: float | None = None, messages: int | None = None,
                 rate: float | None = None, record_latency: bool = False,
                 warmup_s: float = 0.0, timeout: float = 30.0, stall_s: float = 2.0,
                 sub_ports: list[int] | None = None) -> None:
        if qos not in (0, 1):
            raise ValueError("the bench publishes at QoS 0 or 1")
        if seconds is None and messages is None:
            raise ValueError("a run needs seconds or messages")
        self.host, self.port, self.label = host, port, label
        #: subscriber i connects to sub_ports[i % len] (a cluster's edges); the publisher to ``port``
        self.sub_ports = sub_ports
        self.n_subs, self.qos, self.payload_bytes = subscribers, qos, payload_bytes
        self.publish_window, self.window = publish_window, window
        self.seconds, self.messages, self.rate = seconds, messages, rate
        self.timeout, self.stall_s = timeout, stall_s
        # unpaced, write at least an eighth of the tighter window at a time
        # (no trickle of one-message writes); paced, every message when due
        self.min_batch = 1 if rate else max(1, min(window, publish_window if qos else window) // 8)
        self.topic = f"bench/{label}/data"
        self.filter = f"bench/{label}/+"
        self.latencies = array("q") if record_latency else None
        self.puback_latencies = array("q") if (record_latency and qos) else None
        self.batches: collections.deque = collections.deque()
        self.warm_seq = int(rate * warmup_s) if (rate and record_latency) else 0
        self.counts = [0] * subscribers
        self.total = 0
        self.sent = 0
        self.n_acked = 0
        self.min_delivered = 0
        self.stopped = False
        self.error: str | None = None
        self.closing = False
        self.t0 = self.t_last = 0.0
        self.done: asyncio.Future | None = None
        self.clients: list[_Client] = []
        self.subs: list[_Subscriber] = []
        self.pub: _Publisher | None = None
        frame, self.pid_at, self.payload_at = publish_template(self.topic, qos, payload_bytes)
        self.template = frame
        self.size = len(frame)
        # the bytes every delivered frame shares with the template: fixed
        # header, topic (a server sends the topic as published, QoS = min)
        self.fixed = [frame[j:j + 1] for j in range(self.pid_at if qos else self.payload_at)]
        self.fixed0 = frame[0]

    # -- callbacks from the clients
    def delivered(self, index: int, n: int) -> None:
        self.counts[index] += n
        self.total += n
        self.t_last = time.perf_counter()
        self.pump()
        self._check_done()

    def acked(self, n: int) -> None:
        self.n_acked += n
        self.t_last = time.perf_counter()
        self.pump()
        self._check_done()

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def lost(self, client: _Client, exc) -> None:
        if not self.closing:
            who = "publisher" if client is self.pub else f"subscriber {getattr(client, 'index', '?')}"
            self.fail(f"{who}: server closed the connection ({exc or 'EOF'})")

    # -- publishing
    def pump(self) -> None:
        if self.stopped or self.pub is None:
            return
        limit = self.messages if self.messages is not None else 1 << 62
        if self.qos:
            limit = min(limit, self.n_acked + self.publish_window)
        if self.sent + self.min_batch > self.min_delivered + self.window:
            self.min_delivered = min(self.counts)
        limit = min(limit, self.min_delivered + self.window)
        if self.rate:
            limit = min(limit, int((time.perf_counter() - self.t0) * self.rate) + 1)
        n = limit - self.sent
        if n <= 0 or (n < self.min_batch and (self.messages is None
                                              or self.sent + n < self.messages)):
            return
        size = self.size
        blob = bytearray(self.template * n)
        stamp = time.monotonic_ns()
        seq = self.sent
        pack = _STAMP.pack_into
        pid_at, payload_at = self.pid_at, self.payload_at
        for k in range(n):
            at = k * size
            if pid_at >= 0:
                _U16.pack_into(blob, at + pid_at, (seq + k) % 65535 + 1)
            pack(blob, at + payload_at, seq + k, stamp)
        self.pub.transport.write(blob)
        if self.puback_latencies is not None:
            self.batches.append([n, stamp, seq])
        self.sent = seq + n
        if self.messages is not None and self.sent >= self.messages:
            self.stop()

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self._check_done()

    def _check_done(self) -> None:
        if (self.stopped and self.total >= self.sent * self.n_subs
                and (not self.qos or self.n_acked >= self.sent)
                and self.done is not None and not self.done.done()):
            self.done.set_result(None)

    # -- the run
    async def _connect(self, factory, client_id: str, clean: bool = True, port: int | None = None) -> _Client:
        loop = asyncio.get_running_loop()
        _t, client = await asyncio.wait_for(
            loop.create_connection(factory, self.host, port or self.port), self.timeout)
        reply = await client.request(
            encode(Connect.for_level(LEVEL, client_id=client_id, keepalive=60,
                                     clean_start=clean), LEVEL), self.timeout)
        if not isinstance(reply, Connack) or reply.reason_code != 0:
            raise Refused(f"{client_id}: CONNECT answered with {reply!r}")
        return client

    async def _subscriber(self, i: int) -> _Subscriber:
        ports = self.sub_ports
        sub = await self._connect(lambda: _Subscriber(self, i), f"bsub-{self.label}-{i}",
                                  port=ports[i % len(ports)] if ports else None)
        reply = await sub.request(encode(Subscribe(packet_id=1, subscriptions=[
            Subscription(self.filter, qos=self.qos)]), LEVEL), self.timeout)
        if not isinstance(reply, Suback) or len(reply.reason_codes) != 1:
            raise Refused(f"subscriber {i}: SUBSCRIBE answered with {reply!r}")
        code = reply.reason_codes[0]
        if code >= 0x80:
            raise Refused(f"subscriber {i}: SUBACK 0x{code:02x} for {self.filter!r} "
                          f"(subscription refused)")
        if code != self.qos:
            raise Refused(f"subscriber {i}: granted QoS {code}, asked for {self.qos}")
        sub.streaming = True
        if sub.buf:  # a PUBLISH that came in with the SUBACK
            rest, sub.buf = sub.buf, b""
            sub.data_received(rest)
        return sub

    async def run(self) -> dict:
        """Measure once. Returns ``subscribers``, ``qos``, ``published``,
        ``expected`` (published x subscribers), ``delivered`` (unique),
        ``duplicates``, ``gaps``, ``seconds`` (first PUBLISH written to the
        last delivery or acknowledgement), ``delivered_per_s``,
        ``published_per_s``, ``complete``, ``error`` when one happened, and
        ``latencies_ns`` (an array) with ``record_latency``."""
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        ticker = None
        try:
            subs = await asyncio.gather(*(self._subscriber(i) for i in range(self.n_subs)),
                                        return_exceptions=True)
            for x in subs:
                if isinstance(x, BaseException):
                    raise x
            self.subs = subs
            self.pub = await self._connect(lambda: _Publisher(self), f"bpub-{self.label}")
            self.pub.streaming = True
            self.t0 = self.t_last = time.perf_counter()
            if self.seconds is not None:
                loop.call_later(self.seconds, self.stop)
            if self.rate:
                ticker = loop.create_task(self._tick())
            self.pump()
            await self._wait()
        finally:
            if ticker is not None:
                ticker.cancel()
            self.closing = True
            for c in self.clients:
                if c.transport is not None and not c.lost:
                    c.transport.write(_DISCONNECT)
                    c.transport.close()
        seconds = max(self.t_last - self.t0, 1e-9)
        expected = self.sent * self.n_subs
        out = {
            "subscribers": self.n_subs, "qos": self.qos, "published": self.sent,
            "expected": expected, "delivered": self.total,
            "duplicates": sum(s.duplicates for s in self.subs),
            "gaps": sum(s.gaps for s in self.subs),
            "seconds": round(seconds, 4),
            "delivered_per_s": round(self.total / seconds, 1),
            "published_per_s": round(self.sent / seconds, 1),
            "complete": self.error is None and self.total >= expected,
        }
        if self.qos:
            out["acknowledged"] = self.n_acked
        if self.error:
            out["error"] = self.error
        if self.latencies is not None:
            out["latencies_ns"] = self.latencies
        if self.puback_latencies is not None:
            out["puback_latencies_ns"] = self.puback_latencies
        return out

    async def _tick(self) -> None:
        while not self.stopped:
            self.pump()
            await asyncio.sleep(0.0005)  # pacing; the run's own deadline ends the loop

    async def _wait(self) -> None:
        deadline = time.perf_counter() + self.timeout
        while not self.done.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.done), 0.25)
            except asyncio.TimeoutError:
                pass
            now = time.perf_counter()
            if now > deadline:
                self.fail(f"timed out after {self.timeout:g} s")
            elif self.stopped and now - self.t_last > self.stall_s:
                self.fail(f"stalled: nothing delivered or acknowledged for {self.stall_s:g} s "
                          f"({self.total} of {self.sent * self.n_subs} delivered)")
