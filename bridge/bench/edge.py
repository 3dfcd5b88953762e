"""``lakegate bench edge``: messages/s the edge accepts and acknowledges, next to
a Mosquitto on the same machine, with the same load generator, in one run.

The bench starts both servers itself, on free loopback ports:

* the edge as ``python -m bridge edge`` (a separate process, with this
  command's ``--config``/``--set`` and a fresh ``data_dir`` in a temporary
  directory unless ``--dir``), acknowledging QoS 1/2 once durable (fsync);
* Mosquitto (``mosquitto`` on the PATH or in /usr/sbin) with a temporary
  configuration: ``allow_anonymous true``, ``persistence false``, no inflight
  or queue limits.

The load generator (this process, asyncio, MQTT 3.1.1 over ``--connections``
TCP connections) writes **pre-encoded** PUBLISH frames and reads the
acknowledgements in bulk, counting every one (they are fixed 4-byte frames,
checked by type). Per QoS and server:

* QoS 0 "accepted": all frames are written, then a PINGREQ; the clock stops
  at the last PINGRESP, so nothing counts before the server processed it;
* QoS 1: at most ``--window`` unacknowledged PUBLISH per connection; the
  clock stops at the last PUBACK. Latency = PUBLISH written to its PUBACK
  read (p50/p99 over all messages; acknowledgements arrive in order);
* QoS 2: the same window over the whole exchange: PUBREL goes out for each
  PUBREC, the clock stops at the last PUBCOMP.

Then a latency run: QoS 1 at a fixed ``--latency-rate`` msg/s (default
1,000) for ``--latency-seconds`` (default 5 when ``--capture`` names a Kafka
log, else none), each message written on its schedule (``bench e2e``'s
paced publisher), PUBACK latency p50/p99/max.

Each phase runs ``--repeat`` (``--runs``) times (new connections each time)
and the median run is reported, with every run's rate beside it: a shared
2-core machine is noisy. Every phase is bounded by ``--timeout`` seconds; a
phase that runs out reports what was acknowledged by then and ``"complete":
false``.

``--capture local,kafka,kafka3`` runs the edge once per capture log, in the
same run, next to the same Mosquitto (:mod:`bridge.bench.edge_capture`): the
local files, the one-node Kafka at ``--kafka-servers`` (a fresh topic,
deleted after), a three-node cluster the bench starts on free ports and
stops. Each capture's msg/s is given as a ratio to the local log's and to
Mosquitto's, with issue 42's targets on the one-node Kafka (reported, never
an error). The JSON (``--json``) holds under ``captures`` each capture log's
rates, latencies, ratios, the CPU seconds the edge used per phase and
whether its log holds every frame it acknowledged; ``mosquitto`` the same
for Mosquitto; ``targets``; and, as before, ``edge``, ``edge_capture`` and
``ratio_edge_to_mosquitto`` for the first capture log of ``--capture``.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bridge.config import Config
from bridge.mqtt import Connect, encode
from bridge.ports import free_loopback_port

__all__ = ["LoadGenerator", "add_arguments", "run", "start_mosquitto"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--connections", type=int, default=8, help="concurrent connections (default 8)")
    p.add_argument("--messages", type=int, default=200_000,
                   help="QoS 0 messages per server, spread over the connections (default 200000)")
    p.add_argument("--acked-messages", type=int, default=100_000,
                   help="QoS 1 and QoS 2 messages per server (default 100000)")
    p.add_argument("--payload-bytes", type=int, default=64, help="payload size (default 64)")
    p.add_argument("--window", type=int, default=250,
                   help="unacknowledged QoS 1/2 messages per connection (default 250)")
    p.add_argument("--repeat", "--runs", dest="repeat", type=int, default=3,
                   help="runs per QoS and server; the median run is reported (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per phase (default 60)")
    p.add_argument("--dir", metavar="DIR", help="the edge's data_dir (default: a temporary one)")
    p.add_argument("--no-mosquitto", action="store_true", help="measure the edge only")
    p.add_argument("--capture", default="local", metavar="LOGS",
                   help="the capture logs to run the edge on, comma-separated: local (files), kafka (the "
                        "one-node Kafka at --kafka-servers), kafka3 (a three-node cluster the bench starts) "
                        "(default local)")
    p.add_argument("--kafka-servers", default="127.0.0.1:9092",
                   help="the one-node Kafka of --capture kafka (default 127.0.0.1:9092)")
    p.add_argument("--latency-rate", type=float, default=1000.0,
                   help="msg/s of the fixed-rate QoS 1 latency run (default 1000)")
    p.add_argument("--latency-seconds", type=float, default=None,
                   help="seconds of the fixed-rate latency run; 0: none (default 5 when --capture names a "
                        "Kafka log, else none: a local-only run stays as it was)")


# ---------------------------------------------------------------- frames
def _connect_frame(client_id: str) -> bytes:
    return encode(Connect.for_level(4, client_id=client_id, keepalive=60), 4)


def _publish_blob(conn: int, count: int, qos: int, payload_bytes: int) -> tuple[bytes, int]:
    """``count`` PUBLISH frames of one size back to back; packet ids cycle
    1..65535 (safe: a window is far smaller). Returns (blob, frame size)."""
    topic = b"bench/%04d" % conn
    pid_len = 2 if qos else 0
    rl = 2 + len(topic) + pid_len + payload_bytes
    if rl >= 16384:
        raise ValueError("payload too large for the bench's two-byte Remaining Length")
    head = bytes((0x30 | (qos << 1),)) + (bytes((rl,)) if rl < 128 else
                                          bytes((rl & 0x7F | 0x80, rl >> 7)))
    prefix = head + len(topic).to_bytes(2, "big") + topic
    size = len(prefix) + pid_len + payload_bytes
    blob = bytearray(size * count)
    filler = b"p" * max(payload_bytes - 8, 0)
    pack_pid = struct.Struct(">H").pack_into
    pack_seq = struct.Struct(">Q").pack_into
    for k in range(count):
        at = k * size
        blob[at:at + len(prefix)] = prefix
        at += len(prefix)
        if qos:
            pack_pid(blob, at, k % 65535 + 1)
            at += 2
        if payload_bytes >= 8:
            pack_seq(blob, at, k)
            blob[at + 8:at + payload_bytes] = filler
        else:
            blob[at:at + payload_bytes] = b"p" * payload_bytes
    return bytes(blob), size


def _pubrel_blob(count: int) -> bytes:
    out = bytearray(4 * count)
    out[0::4] = b"\x62" * count
    out[1::4] = b"\x02" * count
    ids = b"".join((k % 65535 + 1).to_bytes(2, "big") for k in range(count))
    out[2::4] = ids[0::2]
    out[3::4] = ids[1::2]
    return bytes(out)


# ---------------------------------------------------------------- load generator
class _LoadConn(asyncio.Protocol):
    """One generator connection: writes pre-encoded frames, counts acks."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.connack: asyncio.Future | None = None
        self.done: asyncio.Future | None = None
        self.mode = "connect"
        self.error: str | None = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.connack = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc) -> None:
        self.lost = True
        for fut in (self.connack, self.done):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"server closed the connection ({exc})"))

    # -- phases
    def start(self, mode: str, blob: bytes, size: int, count: int, window: int,
              latencies: array.array | None = None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        self.mode = mode
        self.blob, self.size, self.count, self.window = blob, size, count, window
        self.sent = self.acked = self.recs = self.comps = 0
        self.latencies = latencies
        self.batches: collections.deque = collections.deque()
        if mode == "qos0":
            self.transport.write(blob)
            self.transport.write(b"\xc0\x00")
        else:
            if mode == "qos2":
                self.pubrels = _pubrel_blob(count)
            self._send(min(window, count))
        return self.done

    def _send(self, n: int) -> None:
        if n <= 0:
            return
        start = self.sent
        self.transport.write(self.blob[start * self.size:(start + n) * self.size])
        self.sent = start + n
        if self.latencies is not None:
            self.batches.append([n, time.perf_counter()])

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        mode = self.mode
        if mode == "connect":
            if len(buf) >= 4:
                if buf[:4] != b"\x20\x02\x00\x00":
                    self.connack.set_exception(ConnectionError(f"CONNACK {buf[:4].hex()}"))
                else:
                    self.connack.set_result(None)
                buf = buf[4:]
            self.buf = buf
            return
        if mode == "qos0":  # the only reply is the PINGRESP that ends the phase
            if len(buf) >= 2:
                if buf[:2] != b"\xd0\x00":
                    return self._bad(buf)
                self.done.set_result(time.perf_counter())
            self.buf = buf
            return
        n = len(buf) // 4
        frames, self.buf = buf[:4 * n], buf[4 * n:]
        if not n:
            return
        firsts = frames[0::4]
        if frames[1::4] != b"\x02" * n:
            return self._bad(frames)
        if mode == "qos1":
            if firsts.count(0x40) != n:
                return self._bad(frames)
            self._acked(n)
            return
        recs = firsts.count(0x50)
        comps = firsts.count(0x70)
        if recs + comps != n:
            return self._bad(frames)
        if recs:
            r = self.recs
            self.transport.write(self.pubrels[4 * r:4 * (r + recs)])
            self.recs = r + recs
        if comps:
            self._acked(comps)

    def _acked(self, n: int) -> None:
        self.acked += n
        if self.latencies is not None:
            now = time.perf_counter()
            left = n
            batches = self.batches
            while left:
                head = batches[0]
                take = min(left, head[0])
                self.latencies.extend([now - head[1]] * take)
                head[0] -= take
                left -= take
                if not head[0]:
                    batches.popleft()
        if self.acked >= self.count:
            self.done.set_result(time.perf_counter())
        else:
            self._send(min(n, self.count - self.sent))

    def _bad(self, frames: bytes) -> None:
        if not self.done.done():
            self.done.set_exception(ValueError(f"unexpected acknowledgement bytes "
                                               f"{frames[:16].hex()}..."))


class LoadGenerator:
    """Drives ``connections`` MQTT 3.1.1 connections at one server."""

    def __init__(self, host: str, port: int, connections: int, payload_bytes: int, window: int,
                 timeout: float) -> None:
        self.host, self.port = host, port
        self.connections = connections
        self.payload_bytes = payload_bytes
        self.window = window
        self.timeout = timeout

    async def phase(self, qos: int, messages: int, label: str) -> dict:
        loop = asyncio.get_running_loop()
        per = [messages // self.connections + (1 if i < messages % self.connections else 0)
               for i in range(self.connections)]
        blobs = [_publish_blob(i, n, qos, self.payload_bytes) for i, n in enumerate(per)]
        conns: list[_LoadConn] = []
        for i in range(self.connections):
            _t, proto = await loop.create_connection(_LoadConn, self.host, self.port)
            sock = proto.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            proto.transport.write(_connect_frame(f"bench-{label}-q{qos}-{i}"))
            conns.append(proto)
        await asyncio.wait_for(asyncio.gather(*(c.connack for c in conns)), self.timeout)
        latencies = array.array("d") if qos == 1 else None
        t0 = time.perf_counter()
        futs = [c.start(f"qos{qos}", blob, size, n, self.window, latencies)
                for c, (blob, size), n in zip(conns, blobs, per)]
        complete = True
        error = None
        try:
            ends = await asyncio.wait_for(asyncio.gather(*futs), self.timeout)
            t1 = max(ends)
        except asyncio.TimeoutError:
            complete, t1 = False, time.perf_counter()
        except (ConnectionError, ValueError) as exc:
            complete, t1, error = False, time.perf_counter(), str(exc)
        if qos == 0:
            done = sum(n for c, n in zip(conns, per)
                       if c.done.done() and not c.done.cancelled() and c.done.exception() is None)
        else:
            done = sum(c.acked for c in conns)
        for c in conns:
            if c.transport is not None and not c.lost:
                c.transport.write(b"\xe0\x00")
                c.transport.close()
        seconds = t1 - t0
        out = {"messages": done, "offered": messages, "seconds": round(seconds, 4),
               "msgs_per_s": round(done / seconds, 1) if seconds > 0 else None,
               "complete": complete}
        if error:
            out["error"] = error
        if latencies is not None and len(latencies):
            lat = sorted(latencies)
            out["puback_latency_ms"] = {"p50": round(lat[len(lat) // 2] * 1000, 3),
                                        "p99": round(lat[min(len(lat) - 1,
                                                             int(len(lat) * 0.99))] * 1000, 3)}
        return out


# ---------------------------------------------------------------- servers
def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)  # startup poll, bounded by the deadline
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g} s")


def start_mosquitto(workdir: Path, settings: str = "max_inflight_messages 0\nmax_queued_messages 0\n",
                    name: str = "mosquitto.conf", port: int = 0) -> tuple[subprocess.Popen, int]:
    """A Mosquitto on a free loopback port (or ``port``: a restart on the
    same one) with a temporary configuration (``workdir/name``): no
    persistence, plus ``settings`` (configuration lines, which win over
    those before them; by default no in-flight and queue limits, as ``bench
    edge`` wants)."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                           if os.path.exists("/usr/sbin/mosquitto") else None)
    if binary is None:
        raise RuntimeError("mosquitto is not installed (scripts/services up installs it)")
    port = port or free_loopback_port()
    conf = workdir / name
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    f"{settings}log_dest stderr\nlog_type error\nlog_type warning\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_port(port, proc, "mosquitto")
    return proc, port


def start_edge(args: argparse.Namespace, data_dir: Path, profile: str | None = None, *,
               port: int = 0, stderr=subprocess.DEVNULL,
               extra_sets: list[str] | tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """``python -m bridge edge`` with this command's configuration; with
    ``profile``, under ``python -m cProfile -o PROFILE`` (written when the
    edge stops). ``port`` 0 picks a free one (a restart passes the old one);
    ``stderr`` is where its log goes (a file, to read it afterwards);
    ``extra_sets``: ``--set`` lines after the command's own (they win)."""
    cmd = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []),
           "-m", "bridge", "edge", "--port", str(port),
           "--set", "metrics.port=0"]  # no clash with a run of yours
    if getattr(args, "config", None):
        cmd += ["--config", args.config]
    for item in [*(getattr(args, "overrides", None) or []), *extra_sets]:
        cmd += ["--set", item]
    cmd += ["--set", f"data_dir={data_dir}", "--set", "log_level=WARNING",
            "--set", "edge.host=127.0.0.1"]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = proc.stdout.readline()
    m = re.search(r"mqtt://[^ ]*:(\d+)", line)
    if m is None:
        proc.kill()
        raise RuntimeError(f"the edge did not start: {line.strip() or 'no output'}")
    return proc, int(m.group(1))


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


async def _measure(args: argparse.Namespace, port: int, pid: int, label: str) -> dict:
    from bridge.bench.edge_capture import latency_phase, median_latency

    gen = LoadGenerator("127.0.0.1", port, args.connections, args.payload_bytes, args.window,
                        args.timeout)
    out = {}
    for qos, n in ((0, args.messages), (1, args.acked_messages), (2, args.acked_messages)):
        runs = []
        for i in range(args.repeat):
            c0 = _cpu_seconds(pid)
            r = await gen.phase(qos, n, f"{label}{i}")
            c1 = _cpu_seconds(pid)
            if c0 is not None and c1 is not None:
                r["server_cpu_s"] = round(c1 - c0, 2)
            runs.append(r)
        ranked = sorted(runs, key=lambda r: (r["complete"], r["msgs_per_s"] or 0))
        median = dict(ranked[len(ranked) // 2])
        median["runs_msgs_per_s"] = [r["msgs_per_s"] for r in runs]
        median["acknowledged_all_runs"] = sum(r["messages"] for r in runs)
        median["complete"] = all(r["complete"] for r in runs)
        out[f"qos{qos}"] = median
    if args.latency_seconds > 0:
        runs = []
        for i in range(args.repeat):
            c0 = _cpu_seconds(pid)
            r = await latency_phase(port, args, f"{label}{i}")
            c1 = _cpu_seconds(pid)
            if c0 is not None and c1 is not None:
                r["server_cpu_s"] = round(c1 - c0, 2)
            runs.append(r)
        out["latency"] = median_latency(runs)
        out["latency"]["acknowledged_all_runs"] = sum(r["acknowledged"] for r in runs)
    return out


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.bench.edge_capture import Backend, data_dir_for, measure_capture, parse_captures, summarize
    from bridge.bench.edge_report import print_result
    from bridge.cli import UsageError

    if min(args.connections, args.window, args.messages, args.acked_messages, args.repeat) < 1:
        raise UsageError("--connections, --window, --repeat and the message counts must be "
                         "positive")
    try:
        names = parse_captures(args.capture)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.latency_seconds is None:
        args.latency_seconds = 5.0 if any(n != "local" for n in names) else 0.0
    if args.latency_seconds < 0 or args.latency_rate <= 0:
        raise UsageError("--latency-rate must be positive and --latency-seconds not negative")
    tmp = Path(tempfile.mkdtemp(prefix="lakegate-bench-edge-"))
    base = Path(args.dir).resolve() if args.dir else tmp / "data"
    result: dict = {
        "protocol": "3.1.1", "connections": args.connections, "payload_bytes": args.payload_bytes,
        "window": args.window, "repeat": args.repeat, "messages": {"qos0": args.messages, "qos1": args.acked_messages,
                                            "qos2": args.acked_messages},
        "latency_run": ({"rate": args.latency_rate, "seconds": args.latency_seconds, "qos": 1}
                        if args.latency_seconds > 0 else None),
        "edge_settings": {"fsync_interval_ms": config.capture.fsync_interval_ms,
                          "fsync_records": config.capture.fsync_records,
                          "partitions": config.capture.partitions,
                          "ack_after": config.edge.ack_after,
                          "kafka_linger_ms": config.kafka.linger_ms,
                          "kafka_compression": config.kafka.compression},
        "cpus": os.cpu_count(),
        "captures": {},
    }
    mosq = None
    try:
        for name in names:
            backend = Backend(name, config, data_dir_for(name, base, tmp), tmp, args.kafka_servers)
            result["captures"][name] = measure_capture(args, backend, tmp)
        if not args.no_mosquitto:
            mosq, mosq_port = start_mosquitto(tmp)
            result["mosquitto"] = asyncio.run(_measure(args, mosq_port, mosq.pid, "mosquitto"))
    finally:
        _stop(mosq)
        shutil.rmtree(tmp, ignore_errors=True)
    summarize(result, names)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
    ok = all("error" not in c and c["capture"]["all_acknowledged_captured"]
             and all(c[q]["complete"] for q in ("qos0", "qos1", "qos2"))
             and c.get("latency", {}).get("complete", True) for c in result["captures"].values())
    return 0 if ok else 1
