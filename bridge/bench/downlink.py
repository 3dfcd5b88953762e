"""``lakegate bench downlink``: AMQP producer -> edge -> MQTT subscriber at
QoS 1 (issue 24), next to a bare proton receiver on the same address in
the same run.

One python-qpid-proton producer sends ``--messages`` QoS 1 messages
(``x-qos`` 1, durable, unsettled) as fast as its link credit allows to
``/topic/<run>.bench`` on the AMQP peer (``amqp.url``, RabbitMQ of
``scripts/services``), each carrying its sequence number and send time (a message
that never arrives is named in the output). Measured, ``--repeat``
times each, alternating:

* **edge**: ``lakegate edge`` in its own process (as deployed), with
  ``amqp.downlink`` on, its topic link on ``/topic/<run>.#``, and one MQTT 5
  subscriber in the bench's process (a raw socket client that answers
  what it has read with PUBACKs before it waits for more) of ``<run>/bench`` at QoS 1;
* **proton**: a bare proton receiver (auto-accept, credit 100) on the same
  topic address.

Per run: messages/s from the first to the last arrival, and latency (send
to arrival) p50/p99. Printed: medians over the runs and the ratio
edge/proton of messages/s (the issue's target: >= 0.8). RabbitMQ's own MQTT
plugin (an Erlang MQTT 3.1.1 server delivering from ``amq.topic``, no
AMQP 1.0 hop) is measured the same way, with the same producer and
subscriber, where it listens (``--rabbit-mqtt-port``, default 18831 on the
peer's host, where ``scripts/services up`` enables it); otherwise the
output says why not.

Both the edge's and the proton side's bench process hold one producer and
one consumer; the edge runs as its own process (``lakegate edge``), as it
is deployed. (Until 2026-11-26 it ran inside the bench's process and
shared one GIL with the producer and the subscriber: that cost it about a
third, ratio 0.61 instead of 0.8-0.9.)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import threading
import time
import uuid
from urllib.parse import urlparse

from bridge.config import Config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--messages", type=int, default=5000, help="messages per run (default 5000)")
    p.add_argument("--repeat", type=int, default=3, help="runs per side (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run at most")
    p.add_argument("--rabbit-mqtt-port", type=int, default=18831,
                   help="RabbitMQ's MQTT plugin port on the peer's host, measured when it listens "
                        "(default 18831, where scripts/services enables it)")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def _produce(url: str, address: str, topic: str, n: int) -> None:
    """Send ``n`` QoS 1 messages, each with its send time, credit-paced."""
    from proton import Message, symbol
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class Producer(MessagingHandler):
        def __init__(self) -> None:
            super().__init__()
            self.sent = 0
            self.done = 0

        def on_start(self, event) -> None:
            conn = event.container.connect(url)
            event.container.create_sender(conn, address)

        def on_sendable(self, event) -> None:
            s = event.sender
            while s.credit and self.sent < n:
                s.send(Message(address=topic, durable=True,
                               body=struct.pack(">Id", self.sent, time.time()),
                               annotations={symbol("x-qos"): 1}))
                self.sent += 1

        def on_settled(self, event) -> None:
            self.done += 1
            if self.done >= n:
                event.connection.close()

    Container(Producer()).run()


class _ProtonSide:
    """A bare proton receiver on ``address``: arrival times and latencies."""

    def __init__(self, url: str, address: str, n: int) -> None:
        from proton.handlers import MessagingHandler
        from proton.reactor import Container

        self.arrivals: list[float] = []
        self.lat: list[float] = []
        self.seqs: set[int] = set()
        self.ready = threading.Event()
        outer = self

        class Rx(MessagingHandler):
            def on_start(self, event) -> None:
                self.conn = event.container.connect(url)
                event.container.create_receiver(self.conn, address)

            def on_link_opened(self, event) -> None:
                outer.ready.set()

            def on_message(self, event) -> None:
                now = time.time()
                outer.arrivals.append(now)
                seq, sent = struct.unpack(">Id", bytes(event.message.body))
                outer.lat.append(now - sent)
                outer.seqs.add(seq)
                if len(outer.arrivals) >= n:
                    event.connection.close()

        self.thread = threading.Thread(target=Container(Rx()).run, daemon=True)
        self.thread.start()


def _subscriber(port: int, client_id: str, topic: str, n: int, out: dict,
                ready: threading.Event, deadline: float, level: int = 5,
                host: str = "127.0.0.1") -> None:
    from bridge.mqtt import Connect, Subscribe, Subscription, encode
    from bridge.mqtt import frame_length

    s = socket.create_connection((host, port), timeout=5)
    s.sendall(encode(Connect(protocol_level=level, client_id=client_id, clean_start=True), level))
    buf = b""
    arrivals, lat = out["arrivals"], out["lat"]
    acks: list[bytes] = []  # PUBACKs owed, sent whenever the socket has nothing more to read

    def frames():
        nonlocal buf
        while time.monotonic() < deadline:
            total = frame_length(buf, from_client=False) if buf else None
            if total is not None and len(buf) >= total:
                f, buf = buf[:total], buf[total:]
                yield f
                continue
            if acks:  # everything read is answered before waiting for more
                s.sendall(b"".join(acks))
                acks.clear()
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                return
            buf += chunk

    it = frames()
    next(it)  # CONNACK
    s.sendall(encode(Subscribe(1, [Subscription(topic, 1)]), level))
    next(it)  # SUBACK
    ready.set()
    for f in it:
        if f[0] >> 4 != 3:
            continue
        now = time.time()
        # remaining length varint, topic, packet id, properties, payload
        pos = 1
        while f[pos] & 0x80:
            pos += 1
        pos += 1
        tlen = (f[pos] << 8) | f[pos + 1]
        pid_at = pos + 2 + tlen
        acks.append(b"\x40\x02" + f[pid_at:pid_at + 2])
        arrivals.append(now)
        seq, sent = struct.unpack(">Id", f[-12:])
        lat.append(now - sent)
        out.setdefault("seqs", set()).add(seq)
        if len(arrivals) >= n:
            s.sendall(b"".join(acks))
            break
    s.close()


def _summary(arrivals: list[float], lat: list[float], n: int, seqs: set[int]) -> dict:
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    missing = sorted(set(range(n)) - seqs)
    return {"received": len(arrivals), "complete": len(arrivals) >= n,
            "missing": missing[:20] + (["..."] if len(missing) > 20 else []),
            "msgs_per_s": round((len(arrivals) - 1) / span, 1) if span > 0 else 0.0,
            "p50_ms": round(_pct(lat, 0.5) * 1000, 2), "p99_ms": round(_pct(lat, 0.99) * 1000, 2)}


def _start_edge(url: str, run_id: str, data_dir, timeout: float) -> tuple:
    """``lakegate edge`` as its own process, as deployed (in the bench's
    process it would share one GIL with the producer and the subscriber):
    (process, port) once its topic link is attached."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "bridge", "edge", "--port", "0", "--set", "metrics.port=0",
           "--set", f"data_dir={data_dir}", "--set", f"amqp.url={url}",
           "--set", "amqp.downlink=true", "--set", "amqp.client_address_template=",
           "--set", f"amqp.downlink_topic_address=/topic/{run_id}.#", "--set", "log_level=INFO"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    port, linked, lines = None, False, []
    deadline = time.monotonic() + timeout
    while (port is None or not linked) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("lakegate edge exited:\n" + "".join(lines[-20:]))
        lines.append(line)
        if "listening on mqtt://" in line:
            port = int(line.split("mqtt://", 1)[1].split()[0].rsplit(":", 1)[1])
        if f"receiving from /topic/{run_id}." in line:
            linked = True
    if port is None or not linked:
        proc.kill()
        raise RuntimeError("lakegate edge did not get ready:\n" + "".join(lines[-20:]))
    # keep draining its output (a full pipe would stop it)
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, port


def _run_edge(url: str, run_id: str, n: int, timeout: float, data_dir) -> dict:
    deadline = time.monotonic() + timeout
    proc, port = _start_edge(url, run_id, data_dir, timeout)
    try:
        out = {"arrivals": [], "lat": []}
        ready = threading.Event()
        t = threading.Thread(target=_subscriber, args=(port, f"{run_id}-sub", f"{run_id}/bench",
                                                       n, out, ready, deadline), daemon=True)
        t.start()
        ready.wait(10)
        time.sleep(0.5)  # the topic link's queue is bound
        _produce(url, f"/topic/{run_id}.bench", f"{run_id}/bench", n)
        t.join(max(0.0, deadline - time.monotonic()))
        return _summary(out["arrivals"], out["lat"], n, out.get("seqs", set()))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:
            proc.kill()


def _run_proton(url: str, run_id: str, n: int, timeout: float) -> dict:
    rx = _ProtonSide(url, f"/topic/{run_id}.#", n)
    rx.ready.wait(10)
    time.sleep(0.5)
    _produce(url, f"/topic/{run_id}.bench", f"{run_id}/bench", n)
    rx.thread.join(timeout)
    return _summary(rx.arrivals, rx.lat, n, rx.seqs)


def _rabbit_mqtt_absent(url: str, port: int) -> str | None:
    """Why RabbitMQ's MQTT plugin cannot be measured (None: it listens)."""
    host = urlparse(url).hostname or "127.0.0.1"
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return (f"RabbitMQ's MQTT plugin does not listen on {host}:{port} (scripts/services up "
                "enables it there); not measured")
    return None


def _run_rabbit_mqtt(url: str, port: int, run_id: str, n: int, timeout: float) -> dict:
    """The same producer and subscriber, with RabbitMQ's MQTT plugin (3.x:
    MQTT 3.1.1) delivering from ``amq.topic`` instead of the edge."""
    host = urlparse(url).hostname or "127.0.0.1"
    deadline = time.monotonic() + timeout
    out = {"arrivals": [], "lat": []}
    ready = threading.Event()
    t = threading.Thread(target=_subscriber, args=(port, f"{run_id}-sub", f"{run_id}/bench", n, out,
                                                   ready, deadline, 4, host), daemon=True)
    t.start()
    if not ready.wait(10):
        raise RuntimeError("no SUBACK from RabbitMQ's MQTT plugin within 10 s")
    time.sleep(0.5)
    _produce(url, f"/topic/{run_id}.bench", f"{run_id}/bench", n)
    t.join(max(0.0, deadline - time.monotonic()))
    return _summary(out["arrivals"], out["lat"], n, out.get("seqs", set()))


def run(args: argparse.Namespace, config: Config) -> int:
    import tempfile

    url = config.amqp.url
    if not url:
        print("bench downlink: amqp.url is empty; nothing to receive from")
        return 2
    n = args.messages
    absent = _rabbit_mqtt_absent(url, args.rabbit_mqtt_port)
    sides: dict[str, list[dict]] = {"edge": [], "proton": []}
    if absent is None:
        sides["rabbitmq_mqtt"] = []
    with tempfile.TemporaryDirectory(prefix="lg-bench-downlink-") as tmp:
        for i in range(args.repeat):  # alternating, so that drifts of a noisy machine hit all sides
            run_id = f"bdl{uuid.uuid4().hex[:8]}"
            sides["edge"].append(_run_edge(url, run_id, n, args.timeout, f"{tmp}/edge{i}"))
            sides["proton"].append(_run_proton(url, run_id + "p", n, args.timeout))
            if "rabbitmq_mqtt" in sides:
                sides["rabbitmq_mqtt"].append(_run_rabbit_mqtt(url, args.rabbit_mqtt_port, run_id + "r",
                                                               n, args.timeout))
    med = {}
    for side, runs in sides.items():
        med[side] = {"complete": all(r["complete"] for r in runs),
                     "received": [r["received"] for r in runs],
                     "missing": [r["missing"] for r in runs if r["missing"]],
                     "msgs_per_s": statistics.median(r["msgs_per_s"] for r in runs),
                     "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                     "p99_ms": statistics.median(r["p99_ms"] for r in runs)}
    ratio = med["edge"]["msgs_per_s"] / med["proton"]["msgs_per_s"] if med["proton"]["msgs_per_s"] else 0.0
    result = {"messages": n, "repeat": args.repeat, "qos": 1, **med, "ratio": round(ratio, 3),
              "target_ratio": 0.8, "target_met": ratio >= 0.8}
    if absent is None and med["rabbitmq_mqtt"]["msgs_per_s"]:
        result["ratio_edge_to_rabbitmq_mqtt"] = round(med["edge"]["msgs_per_s"]
                                                      / med["rabbitmq_mqtt"]["msgs_per_s"], 3)
    else:
        result["rabbitmq_mqtt_not_measured"] = absent or "no message arrived through it"
    if args.json:
        print(json.dumps(result))
    else:
        print(f"downlink QoS 1, {n} messages x {args.repeat} runs (medians)")
        for side in sides:
            m = med[side]
            print(f"  {side:13s} {m['msgs_per_s']:9.1f} msg/s  p50 {m['p50_ms']:7.2f} ms  "
                  f"p99 {m['p99_ms']:7.2f} ms  received {m['received']}"
                  + (f"  MISSING (sequence numbers) {m['missing']}" if m["missing"] else ""))
        print(f"  ratio edge/proton {ratio:.2f} (target >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'})")
        if "ratio_edge_to_rabbitmq_mqtt" in result:
            print(f"  ratio edge/RabbitMQ MQTT plugin {result['ratio_edge_to_rabbitmq_mqtt']:.2f}")
        else:
            print(f"  RabbitMQ MQTT plugin: {absent}")
    return 0 if all(m["complete"] for m in med.values()) else 1
