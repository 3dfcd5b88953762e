"""``lakegate bench downlink``: AMQP producer -> edge -> MQTT subscriber at
QoS 1 (issue 24), next to a bare proton receiver on the same address in
the same run.

One python-qpid-proton producer sends ``--messages`` QoS 1 messages
(``x-qos`` 1, durable, unsettled) as fast as its link credit allows to
``/topic/<run>.bench`` on the AMQP peer (``amqp.url``, RabbitMQ of
``scripts/services``), each carrying its send time. Measured, ``--repeat``
times each, alternating:

* **edge**: an in-process edge with ``amqp.downlink`` on, its topic link on
  ``/topic/<run>.#``, and one MQTT 5 subscriber (a raw socket client that
  answers every PUBLISH with PUBACK at once) of ``<run>/bench`` at QoS 1;
* **proton**: a bare proton receiver (auto-accept, credit 100) on the same
  topic address.

Per run: messages/s from the first to the last arrival, and latency (send
to arrival) p50/p99. Printed: medians over the runs and the ratio
edge/proton of messages/s (the issue's target: >= 0.8). RabbitMQ's own MQTT
plugin is measured only where it listens (``--rabbit-mqtt-port``, default
1883 on the peer's host): otherwise the line says why not.
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
    p.add_argument("--rabbit-mqtt-port", type=int, default=1883,
                   help="RabbitMQ's MQTT plugin port, measured when it listens (default 1883)")


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
                s.send(Message(address=topic, durable=True, body=struct.pack(">d", time.time()),
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
                outer.lat.append(now - struct.unpack(">d", bytes(event.message.body))[0])
                if len(outer.arrivals) >= n:
                    event.connection.close()

        self.thread = threading.Thread(target=Container(Rx()).run, daemon=True)
        self.thread.start()


def _subscriber(port: int, client_id: str, topic: str, n: int, out: dict,
                ready: threading.Event, deadline: float) -> None:
    from bridge.mqtt import Connect, Subscribe, Subscription, encode
    from bridge.mqtt import frame_length

    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(encode(Connect(protocol_level=5, client_id=client_id, clean_start=True), 5))
    buf = b""
    arrivals, lat = out["arrivals"], out["lat"]

    def frames():
        nonlocal buf
        while time.monotonic() < deadline:
            total = frame_length(buf, from_client=False) if buf else None
            if total is not None and len(buf) >= total:
                f, buf = buf[:total], buf[total:]
                yield f
                continue
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                return
            buf += chunk

    it = frames()
    next(it)  # CONNACK
    s.sendall(encode(Subscribe(1, [Subscription(topic, 1)]), 5))
    next(it)  # SUBACK
    ready.set()
    acks = []
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
        lat.append(now - struct.unpack(">d", f[-8:])[0])
        if len(acks) >= 16 or len(arrivals) >= n:
            s.sendall(b"".join(acks))
            acks = []
        if len(arrivals) >= n:
            break
    s.close()


def _summary(arrivals: list[float], lat: list[float], n: int) -> dict:
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return {"received": len(arrivals), "complete": len(arrivals) >= n,
            "msgs_per_s": round((len(arrivals) - 1) / span, 1) if span > 0 else 0.0,
            "p50_ms": round(_pct(lat, 0.5) * 1000, 2), "p99_ms": round(_pct(lat, 0.99) * 1000, 2)}


def _run_edge(config: Config, url: str, run_id: str, n: int, timeout: float, data_dir) -> dict:
    from bridge.config import load_config
    from bridge.edge.thread import EdgeThread

    cfg = load_config(None, [f"data_dir={data_dir}", "edge.port=0", f"amqp.url={url}",
                             "amqp.downlink=true", "amqp.client_address_template=",
                             f"amqp.downlink_topic_address=/topic/{run_id}.#",
                             "log_level=WARNING"], env={})
    edge = EdgeThread(cfg).start()
    try:
        deadline = time.monotonic() + timeout
        while not edge.server.downlink.rx.links and time.monotonic() < deadline:
            time.sleep(0.05)
        out = {"arrivals": [], "lat": []}
        ready = threading.Event()
        t = threading.Thread(target=_subscriber, args=(edge.port, f"{run_id}-sub", f"{run_id}/bench",
                                                       n, out, ready, deadline), daemon=True)
        t.start()
        ready.wait(10)
        time.sleep(0.5)  # the topic link's queue is bound
        _produce(url, f"/topic/{run_id}.bench", f"{run_id}/bench", n)
        t.join(max(0.0, deadline - time.monotonic()))
        return _summary(out["arrivals"], out["lat"], n)
    finally:
        edge.stop()


def _run_proton(url: str, run_id: str, n: int, timeout: float) -> dict:
    rx = _ProtonSide(url, f"/topic/{run_id}.#", n)
    rx.ready.wait(10)
    time.sleep(0.5)
    _produce(url, f"/topic/{run_id}.bench", f"{run_id}/bench", n)
    rx.thread.join(timeout)
    return _summary(rx.arrivals, rx.lat, n)


def _rabbit_mqtt(url: str, port: int) -> str | None:
    """Why RabbitMQ's MQTT plugin cannot be measured (None: it listens)."""
    host = urlparse(url).hostname or "127.0.0.1"
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return (f"RabbitMQ's MQTT plugin does not listen on {host}:{port} (scripts/services does "
                "not enable rabbitmq_mqtt); not measured")
    return None


def run(args: argparse.Namespace, config: Config) -> int:
    import tempfile

    url = config.amqp.url
    if not url:
        print("bench downlink: amqp.url is empty; nothing to receive from")
        return 2
    n = args.messages
    sides: dict[str, list[dict]] = {"edge": [], "proton": []}
    with tempfile.TemporaryDirectory(prefix="lg-bench-downlink-") as tmp:
        for i in range(args.repeat):
            run_id = f"bdl{uuid.uuid4().hex[:8]}"
            sides["edge"].append(_run_edge(config, url, run_id, n, args.timeout, f"{tmp}/edge{i}"))
            sides["proton"].append(_run_proton(url, run_id + "p", n, args.timeout))
    med = {}
    for side, runs in sides.items():
        med[side] = {"complete": all(r["complete"] for r in runs),
                     "received": [r["received"] for r in runs],
                     "msgs_per_s": statistics.median(r["msgs_per_s"] for r in runs),
                     "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                     "p99_ms": statistics.median(r["p99_ms"] for r in runs)}
    ratio = med["edge"]["msgs_per_s"] / med["proton"]["msgs_per_s"] if med["proton"]["msgs_per_s"] else 0.0
    why = _rabbit_mqtt(url, args.rabbit_mqtt_port)
    result = {"messages": n, "repeat": args.repeat, "qos": 1, **med, "ratio": round(ratio, 3),
              "target_ratio": 0.8, "target_met": ratio >= 0.8,
              "rabbitmq_mqtt": why or "listening; measuring it is not implemented yet"}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"downlink QoS 1, {n} messages x {args.repeat} runs (medians)")
        for side in ("edge", "proton"):
            m = med[side]
            print(f"  {side:7s} {m['msgs_per_s']:9.1f} msg/s  p50 {m['p50_ms']:7.2f} ms  "
                  f"p99 {m['p99_ms']:7.2f} ms  received {m['received']}")
        print(f"  ratio edge/proton {ratio:.2f} (target >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'})")
        print(f"  RabbitMQ MQTT plugin: {result['rabbitmq_mqtt']}")
    return 0 if med["edge"]["complete"] and med["proton"]["complete"] else 1
