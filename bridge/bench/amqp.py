"""``lakegate bench amqp``: the forwarding sink's rate next to a bare proton sender.

In one run, against the configured AMQP peer (``amqp.url``), with the same
messages to the same addresses:

* **sink**: :meth:`bridge.amqp.sender.Forwarder.forward` -- what each
  executor task of the sink does: map FORWARD_DDL rows to the profile's
  messages, pipeline them over the cached links, await every disposition;
* **bare**: a minimal python-qpid-proton sender (``MessagingHandler``) that
  sends the already mapped messages as fast as link credit allows and
  awaits every disposition, nothing else.

Both run on an open connection (set-up is outside the timing). Messages go
to ``/topic/lakegate-bench.<run>.<n>`` by default, which nothing is bound
to on RabbitMQ, so the broker accepts and drops them. Each side runs
``--repeat`` times, alternating; the report gives the median rates and
their ratio (sink / bare).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

from bridge.config import Config, mask_secret

__all__ = ["add_arguments", "run", "bare_send"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--messages", type=int, default=20000, help="messages per run (default 20000)")
    p.add_argument("--payload-bytes", type=int, default=200, help="payload size (default 200)")
    p.add_argument("--qos", type=int, choices=(1, 2), default=1, help="QoS of the messages (default 1)")
    p.add_argument("--topics", type=int, default=1, help="distinct topics, i.e. addresses (default 1)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, alternating (default 3)")


def _rows(n: int, payload: bytes, qos: int, topics: list[str]) -> list[dict[str, Any]]:
    return [dict(kind="publish", topic=topics[i % len(topics)], packet_id=i % 65535 + 1, qos=qos, retain=False,
                 dup=False, payload=payload, stream="bench", partition=0, offset=i, seq=i) for i in range(n)]


def bare_send(config: Any, outgoing: list[Any], timeout: float = 300.0) -> float:
    """Seconds a plain proton sender takes to send ``outgoing`` and get every
    disposition (accepted), timed from its first send."""
    from proton import Link
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, LinkOption

    from bridge.amqp.mapping import LINK_QOS2
    from bridge.amqp.sender import peer_url, qos2_rcv_second

    url, user, password = peer_url(config)
    per_link: dict[tuple[str, str], list[Any]] = {}
    for out in outgoing:
        per_link.setdefault((out.address, out.link), []).append(out.message)
    n = len(outgoing)

    class Modes(LinkOption):
        def __init__(self, cls: str) -> None:
            self.cls = cls

        def apply(self, link: Any) -> None:
            link.snd_settle_mode = Link.SND_UNSETTLED
            second = self.cls == LINK_QOS2 and qos2_rcv_second(config)  # as the Forwarder attaches it
            link.rcv_settle_mode = Link.RCV_SECOND if second else Link.RCV_FIRST

    class Bare(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=0)
            self.t0 = 0.0
            self.t1 = 0.0
            self.accepted = 0
            self.failed = ""
            self.next: dict[str, int] = {}
            self.msgs: dict[str, list[Any]] = {}

        def on_start(self, event: Any) -> None:
            kw: dict[str, Any] = {"reconnect": False, "allowed_mechs": config.sasl_mechanisms}
            if user is not None:
                kw["user"] = user
                if password is not None:
                    kw["password"] = password
            self.conn = event.container.connect(url, **kw)
            for (address, cls), msgs in per_link.items():
                s = event.container.create_sender(self.conn, address, options=Modes(cls))
                self.msgs[s.name] = msgs
                self.next[s.name] = 0
            self.timer = event.container.schedule(timeout, self)

        def on_sendable(self, event: Any) -> None:
            s = event.sender
            msgs, i = self.msgs[s.name], self.next[s.name]
            if not self.t0:
                self.t0 = time.perf_counter()
            while s.credit and i < len(msgs):
                s.send(msgs[i])
                i += 1
            self.next[s.name] = i

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            if self.accepted == n:
                self.t1 = time.perf_counter()
                self.timer.cancel()
                self.conn.close()

        def on_rejected(self, event: Any) -> None:
            self._fail("rejected")

        def on_released(self, event: Any) -> None:
            self._fail("released or modified")

        def _fail(self, what: str) -> None:
            self.failed = what
            self.timer.cancel()
            self.conn.close()

        def on_timer_task(self, event: Any) -> None:
            self._fail(f"timed out after {timeout}s")

    h = Bare()
    Container(h).run()
    if h.failed or not h.t1:
        raise RuntimeError(f"bare sender: {h.failed or 'did not finish'} ({h.accepted} of {n} accepted)")
    return h.t1 - h.t0


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.amqp.mapping import PROFILES, map_row
    from bridge.amqp.sender import Forwarder

    amqp = config.amqp
    if not amqp.url:
        print("lakegate: bench amqp: amqp.url is empty (forwarding off); set it with --set amqp.url=...")
        return 2
    run_id = uuid.uuid4().hex[:8]
    topics = [f"lakegate-bench/{run_id}/{i}" for i in range(max(1, args.topics))]
    payload = bytes(args.payload_bytes)
    rows = _rows(args.messages, payload, args.qos, topics)
    profile = PROFILES[amqp.profile]
    sink_s: list[float] = []
    bare_s: list[float] = []
    peer = ""
    with Forwarder(amqp) as fwd:
        fwd.forward(_rows(100, payload, args.qos, topics))  # connection and links up
        peer = fwd.describe().get("peer", "")
        for _ in range(max(1, args.repeat)):
            outgoing = [map_row(r, profile, amqp.address_template, time.time()) for r in rows]
            bare_s.append(bare_send(amqp, outgoing))
            t0 = time.perf_counter()
            res = fwd.forward(rows)
            sink_s.append(time.perf_counter() - t0)
            if res.accepted != len(rows):
                print(f"lakegate: bench amqp: only {res.accepted} of {len(rows)} accepted")
                return 1
    n = len(rows)
    sink_rate = n / statistics.median(sink_s)
    bare_rate = n / statistics.median(bare_s)
    result = {
        "peer": peer,
        "url": mask_secret("amqp.url", amqp.url),
        "profile": amqp.profile,
        "messages": n,
        "payload_bytes": args.payload_bytes,
        "qos": args.qos,
        "topics": len(topics),
        "repeat": len(sink_s),
        "sink_msgs_per_s": round(sink_rate, 1),
        "bare_msgs_per_s": round(bare_rate, 1),
        "ratio": round(sink_rate / bare_rate, 3),
        "sink_runs_s": [round(s, 4) for s in sink_s],
        "bare_runs_s": [round(s, 4) for s in bare_s],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"AMQP forwarding to {result['url']} ({peer or 'peer'}), profile {amqp.profile}: "
              f"{n} messages x {args.payload_bytes} B, QoS {args.qos}, {len(topics)} topic(s), "
              f"median of {len(sink_s)} runs, dispositions awaited")
        print(f"  sink (Forwarder, mapping included) {sink_rate:10,.0f} msg/s")
        print(f"  bare proton sender                 {bare_rate:10,.0f} msg/s")
        print(f"  ratio sink / bare                  {sink_rate / bare_rate:10.2f}")
    return 0
