"""The well-behaved client of ``lakegate bench hostile`` and ``tests/hostile``.

Run as its own process (``python -m bridge.bench.hostile_good``) so that
the load generators of a scenario, in the harness's process, never hold
the interpreter lock it needs to read a PUBACK on time: what it measures is
the server, not the harness. Two MQTT 3.1.1 connections, raw sockets and
the project's codec for the handshakes:

* the **publisher** (persistent session) sends one QoS 1 PUBLISH of
  ``--payload-bytes`` (64) to ``good/<tag>/p`` every 1/``--rate`` s (50/s),
  on a fixed schedule, and times each PUBLISH -> PUBACK (``perf_counter``).
  When the server closes the connection (a SIGKILL) it reconnects and
  re-sends what was not acknowledged, DUP 1 [MQTT-4.4.0-1]; a re-sent
  message's latency counts from its re-sending; ticks while disconnected
  are counted, not sent;
* the **witness** (a persistent session, its own thread) subscribes to that
  topic at QoS 1 and acknowledges every PUBLISH: at the end, every message
  the publisher got a PUBACK for must have reached it, the "zero
  unexplained loss" check of each scenario.

Control, one line on stdin: ``stop DRAIN_S``: stop sending, wait at most
DRAIN_S for the outstanding PUBACKs and for the witness to hold every
acknowledged message, print one JSON object (below) and exit. It prints
``ready`` once both connections are up (the witness subscribed). It also
stops by itself after ``--max-seconds`` (a bound, not a plan). Payloads
are an 8-byte sequence number and filler; nothing logs them.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import subprocess
import sys
import threading
import time

from bridge.mqtt import Connect, Properties, Subscribe, Subscription, encode, frame_length

__all__ = ["GoodClient", "GoodClientProcess", "RawMqtt", "ack_codes", "percentile", "publish_frame",
           "read_publish", "skip_properties", "varint"]

_SEQ = struct.Struct(">Q")


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of already sorted values."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def publish_frame(topic: bytes, payload: bytes, qos: int, packet_id: int = 0, *,
                  retain: bool = False, dup: bool = False) -> bytes:
    """One PUBLISH (any level without properties: 3.1/3.1.1)."""
    body = len(topic).to_bytes(2, "big") + topic
    if qos:
        body += packet_id.to_bytes(2, "big")
    body += payload
    return (bytes((0x30 | dup << 3 | qos << 1 | retain,)) + varint(len(body)) + body)


def varint(n: int) -> bytes:
    """MQTT's Variable Byte Integer."""
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_publish(pkt: bytes, level: int = 4) -> tuple[int, int, bool, bytes, bytes]:
    """(qos, packet id, dup, topic, payload) of a PUBLISH frame from a
    server (3.x, or 5 with its properties skipped)."""
    flags = pkt[0] & 0x0F
    qos, dup = (flags >> 1) & 3, bool(flags & 8)
    at = 1
    while pkt[at] & 0x80:
        at += 1
    at += 1
    tlen = int.from_bytes(pkt[at:at + 2], "big")
    topic = pkt[at + 2:at + 2 + tlen]
    at += 2 + tlen
    pid = 0
    if qos:
        pid = int.from_bytes(pkt[at:at + 2], "big")
        at += 2
    if level == 5:
        at = skip_properties(pkt, at)
    return qos, pid, dup, topic, pkt[at:]


def skip_properties(pkt: bytes, at: int) -> int:
    """The position after the MQTT 5 properties that start at ``at``."""
    plen, shift = 0, 0
    while True:
        b = pkt[at]
        at += 1
        plen |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return at + plen


def ack_codes(pkt: bytes, level: int = 4) -> bytes:
    """The return/reason codes of a SUBACK or UNSUBACK (none: a 3.x UNSUBACK)."""
    at = 1
    while pkt[at] & 0x80:
        at += 1
    at += 1 + 2
    if level == 5:
        at = skip_properties(pkt, at)
    return pkt[at:]


class RawMqtt:
    """A blocking MQTT client over one loopback socket: whole packets in,
    bytes out. ``packet()`` returns b"" when the server closed the
    connection and None on a timeout."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect(): the window the server sees
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    @staticmethod
    def connect_frame(client_id: str, level: int = 4, clean: bool = True, keepalive: int = 60,
                      expiry_s: int = 0) -> bytes:
        props = Properties(session_expiry_interval=expiry_s) if level == 5 and expiry_s else Properties()
        return encode(Connect.for_level(level, client_id=client_id, clean_start=clean,
                                        keepalive=keepalive, properties=props), level)

    def connect(self, client_id: str, level: int = 4, clean: bool = True, keepalive: int = 60,
                expiry_s: int = 0) -> bytes | None:
        """Send a CONNECT; return the CONNACK (b"" closed, None timeout)."""
        self.send(self.connect_frame(client_id, level, clean, keepalive, expiry_s))
        return self.packet()

    def subscribe(self, packet_id: int, filters: list[tuple[str, int]], level: int = 4) -> bytes:
        self.send(encode(Subscribe(packet_id, [Subscription(f, q) for f, q in filters]), level))
        return self.packet()

    def packet(self, timeout: float | None = None) -> bytes | None:
        if timeout is not None:
            self.sock.settimeout(timeout)
        while True:
            if self.buf:
                total = frame_length(self.buf, from_client=False)
                if total is not None and len(self.buf) >= total:
                    pkt, self.buf = self.buf[:total], self.buf[total:]
                    return pkt
            if self.closed:
                return b""
            try:
                chunk = self.sock.recv(262144)
            except (TimeoutError, socket.timeout):
                return None
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return b""
            self.buf += chunk

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------- the good client
class GoodClient:
    """The publisher (this thread) and the witness (a thread of its own)."""

    def __init__(self, host: str, port: int, tag: str, rate: float, payload_bytes: int) -> None:
        self.host, self.port, self.tag = host, port, tag
        self.interval = 1.0 / rate
        self.filler = b"g" * max(payload_bytes - 8, 0)
        self.topic = f"good/{tag}/p".encode()
        self.latencies: list[float] = []
        self.outstanding: dict[int, tuple[int, float]] = {}  # packet id -> (seq, sent at)
        self.acked: set[int] = set()
        self.seq = 0
        self.resent = self.reconnects = self.paused_ticks = self.connect_failures = 0
        self.witnessed: set[int] = set()
        self.witness_dups = self.witness_dups_without_flag = 0
        self.witness_reconnects = self.witness_sessions_lost = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        #: the publisher is done: every PUBLISH acknowledged, or the drain over
        self.published = threading.Event()
        self.ready = threading.Event()
        self.pub: RawMqtt | None = None

    # -- connections
    def _open(self, client_id: str, subscribe: bool) -> tuple[RawMqtt, bool] | None:
        try:
            c = RawMqtt(self.port, self.host, timeout=2.0)
            ack = c.connect(client_id, clean=False, keepalive=0)
            if not ack or ack[0] != 0x20 or ack[3] != 0:
                c.close()
                return None
            present = bool(ack[2] & 1)
            if subscribe and not present:
                sub = c.subscribe(1, [(self.topic.decode(), 1)])
                if not sub or sub[0] != 0x90 or sub[-1] >= 0x80:
                    c.close()
                    return None
            c.sock.settimeout(None)
            return c, present
        except OSError:
            return None

    def _witness(self) -> None:
        first = True
        w = None
        # until the publisher is done (no PUBLISH left without its PUBACK, or
        # the drain is over) and then holds every acknowledged message: a
        # check at the stop alone missed the PUBACKs still on their way
        # (the last few messages reported "missing", 1 run in 15 under load)
        while not (self.published.is_set() and (self._drain_over() or not self._witness_owes())):
            if w is None or w.closed:
                if w is not None:
                    w.close()
                opened = self._open(f"good-{self.tag}-w", subscribe=True)
                if opened is None:
                    time.sleep(0.05)  # the server is restarting; bounded by --max-seconds
                    continue
                w, present = opened
                if not first:
                    with self.lock:
                        self.witness_reconnects += 1
                        self.witness_sessions_lost += not present
                first = False
                self.ready_w = True
            pkt = w.packet(timeout=0.2)
            if not pkt:
                continue
            if pkt[0] >> 4 == 3:
                qos, pid, dup, _topic, payload = read_publish(pkt)
                seq = _SEQ.unpack_from(payload)[0]
                with self.lock:
                    if seq in self.witnessed:
                        self.witness_dups += 1
                        self.witness_dups_without_flag += not dup
                    self.witnessed.add(seq)
                if qos == 1:
                    w.send(b"\x40\x02" + pid.to_bytes(2, "big"))
        if w is not None:
            w.send(b"\xe0\x00")
            w.close()

    def _witness_owes(self) -> bool:
        with self.lock:
            return not self.acked <= self.witnessed

    def _drain_over(self) -> bool:
        return time.perf_counter() > self.drain_deadline

    # -- the publisher
    def run(self, max_seconds: float, control) -> None:
        self.ready_w = False
        self.drain_deadline = float("inf")
        opened = self._open(f"good-{self.tag}-pub", subscribe=False)
        witness = threading.Thread(target=self._witness, daemon=True)
        witness.start()
        if opened is None:
            raise SystemExit("good client: the server refused or did not answer the CONNECT")
        self.pub = opened[0]
        give_up = time.perf_counter() + 10.0
        while not self.ready_w and time.perf_counter() < give_up:
            time.sleep(0.01)  # the witness's CONNECT and SUBSCRIBE
        if not self.ready_w:
            raise SystemExit("good client: the witness could not subscribe within 10 s")
        print("ready", flush=True)
        end = time.perf_counter() + max_seconds
        next_at = time.perf_counter()
        drain_s = None
        pid = 0
        while True:
            now = time.perf_counter()
            if drain_s is None and now >= end:
                drain_s = 5.0
            if drain_s is not None and not self.stopping.is_set():
                self.stopping.set()
                self.drain_deadline = now + drain_s
            if self.stopping.is_set() and (not self.outstanding or now > self.drain_deadline):
                break
            if self.pub is None or self.pub.closed:
                self._reconnect()
            if not self.stopping.is_set() and now >= next_at:
                if self.pub is not None and not self.pub.closed:
                    pid = pid % 65535 + 1
                    while pid in self.outstanding:
                        pid = pid % 65535 + 1
                    self.seq += 1
                    self.outstanding[pid] = (self.seq, time.perf_counter())
                    self.pub.send(publish_frame(self.topic, _SEQ.pack(self.seq) + self.filler, 1, pid))
                else:
                    self.paused_ticks += 1
                next_at += self.interval
                if next_at < now - self.interval:  # starved: no burst to catch up
                    next_at = now
            wait = max(0.0, min(next_at - time.perf_counter(), 0.05))
            socks = [self.pub.sock] if self.pub is not None and not self.pub.closed else []
            r, _, _ = select.select(socks + [control], [], [], wait)
            if control in r:
                line = control.readline()
                if not line or line.startswith("stop"):
                    parts = line.split()
                    drain_s = float(parts[1]) if len(parts) > 1 else 5.0
            if socks and socks[0] in r:
                self._read_acks()
        self.stopping.set()
        self.published.set()
        witness.join(max(0.0, self.drain_deadline - time.perf_counter()) + 1.0)
        if self.pub is not None and not self.pub.closed:
            self.pub.send(b"\xe0\x00")
            self.pub.close()

    def _read_acks(self) -> None:
        pub = self.pub
        try:
            chunk = pub.sock.recv(65536)
        except OSError:
            chunk = b""
        now = time.perf_counter()
        if not chunk:
            pub.closed = True
            return
        pub.buf += chunk
        while True:
            total = frame_length(pub.buf, from_client=False) if pub.buf else None
            if total is None or len(pub.buf) < total:
                return
            pkt, pub.buf = pub.buf[:total], pub.buf[total:]
            if pkt[0] >> 4 == 4 and len(pkt) >= 4:
                pid = int.from_bytes(pkt[2:4], "big")
                item = self.outstanding.pop(pid, None)
                if item is not None:
                    self.latencies.append(now - item[1])
                    with self.lock:
                        self.acked.add(item[0])

    def _reconnect(self) -> None:
        if self.pub is not None:
            self.pub.close()
            self.pub = None
        opened = self._open(f"good-{self.tag}-pub", subscribe=False)
        if opened is None:
            self.connect_failures += 1
            time.sleep(0.02)  # the server is restarting; the main loop's clock bounds the waiting
            return
        self.pub = opened[0]
        self.reconnects += 1
        for pid, (seq, _t) in sorted(self.outstanding.items(), key=lambda kv: kv[1][0]):
            self.outstanding[pid] = (seq, time.perf_counter())
            self.pub.send(publish_frame(self.topic, _SEQ.pack(seq) + self.filler, 1, pid, dup=True))
            self.resent += 1

    def result(self) -> dict:
        lat = sorted(self.latencies)
        with self.lock:
            lost = sorted(self.acked - self.witnessed)
            witnessed = len(self.witnessed)
        missing = len(lost)
        ms = (lambda v: None if v is None else round(v * 1000, 3))
        return {"sent": self.seq, "acked": len(self.acked), "unacked": len(self.outstanding),
                "p50_ms": ms(percentile(lat, 0.50)), "p99_ms": ms(percentile(lat, 0.99)),
                "max_ms": ms(lat[-1] if lat else None), "samples": len(lat),
                "resent": self.resent, "reconnects": self.reconnects,
                "connect_failures": self.connect_failures, "paused_ticks": self.paused_ticks,
                "witness": {"received": witnessed, "missing": missing, "missing_first": lost[:5],
                            "duplicates": self.witness_dups,
                            "duplicates_without_dup_flag": self.witness_dups_without_flag,
                            "reconnects": self.witness_reconnects,
                            "sessions_lost": self.witness_sessions_lost}}


class GoodClientProcess:
    """The good client as a child process of the harness."""

    def __init__(self, port: int, tag: str, rate: float = 50.0, payload_bytes: int = 64,
                 max_seconds: float = 600.0, host: str = "127.0.0.1") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.bench.hostile_good", "--host", host, "--port", str(port),
             "--tag", tag, "--rate", str(rate), "--payload-bytes", str(payload_bytes),
             "--max-seconds", str(max_seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._line(15.0)
        if line.strip() != "ready":
            self.proc.kill()
            self.proc.wait(10)
            raise RuntimeError(f"the good client did not start: {line.strip() or 'no output'}")

    def _line(self, timeout: float) -> str:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if r else ""

    def stop(self, drain_s: float = 5.0) -> dict:
        try:
            self.proc.stdin.write(f"stop {drain_s}\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        line = self._line(drain_s + 10.0)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if not line:
            return {"error": "the good client gave no result"}
        return json.loads(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bridge.bench.hostile_good")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tag", default="0")
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--payload-bytes", type=int, default=64)
    p.add_argument("--max-seconds", type=float, default=600.0)
    a = p.parse_args(argv)
    client = GoodClient(a.host, a.port, a.tag, a.rate, max(a.payload_bytes, 8))
    client.run(a.max_seconds, sys.stdin)
    print(json.dumps(client.result()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
