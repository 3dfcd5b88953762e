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
``--repeat`` (``--runs``) times, alternating; the report gives the median
rates and their ratio (sink / bare).

``--topics N`` with N > 1 compares forwarding to **N distinct topics** with
forwarding to **one topic** instead (issue 39: links bounded), the same
number of messages each (at least N: every topic gets one), each side on a
Forwarder of its own, alternating: the two rates, their ratio (N topics /
one), and for the N-topic runs the peak of open sender links, the attaches,
detaches and evictions per run (median) and whether the anonymous relay
carried them (``amqp.max_links``, ``amqp.anonymous_relay``). No bare sender
there: one with a link per topic is the failure measured.
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
    p.add_argument("--messages", type=int, default=None,
                   help="messages per run (default 20000; with --topics N > 1 at least N)")
    p.add_argument("--payload-bytes", type=int, default=200, help="payload size (default 200)")
    p.add_argument("--qos", type=int, choices=(1, 2), default=1, help="QoS of the messages (default 1)")
    p.add_argument("--topics", type=int, default=1,
                   help="distinct topics, i.e. addresses (default 1: the sink vs a bare proton sender; more: "
                        "the sink to that many topics vs to one topic, with the links' counts)")
    p.add_argument("--repeat", "--runs", dest="repeat", type=int, default=3,
                   help="runs of each side, alternating (default 3); the medians are reported")


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


def _many_topics(args: argparse.Namespace, config: Config) -> int:
    """``--topics N`` (N > 1): N distinct topics vs one topic (module doc)."""
    from bridge.amqp.sender import Forwarder

    amqp = config.amqp
    run_id = uuid.uuid4().hex[:8]
    n_topics = args.topics
    n = max(args.messages or 20000, n_topics)
    payload = bytes(args.payload_bytes)
    many_rows = _rows(n, payload, args.qos, [f"lakegate-bench/{run_id}/{i}" for i in range(n_topics)])
    one_rows = _rows(n, payload, args.qos, [f"lakegate-bench/{run_id}/one"])
    many_s: list[float] = []
    one_s: list[float] = []
    per_run: list[dict[str, Any]] = []
    with Forwarder(amqp) as many, Forwarder(amqp) as one:
        for fwd in (many, one):
            fwd.forward(one_rows[:100])  # connection up
        peer = many.describe().get("peer", "")
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            res = one.forward(one_rows)
            one_s.append(time.perf_counter() - t0)
            if res.accepted != n:
                print(f"lakegate: bench amqp: one topic: only {res.accepted} of {n} accepted")
                return 1
            before = many.link_stats()
            many.reset_peak()
            t0 = time.perf_counter()
            res = many.forward(many_rows)
            many_s.append(time.perf_counter() - t0)
            after = many.link_stats()
            if res.accepted != n:
                print(f"lakegate: bench amqp: {n_topics} topics: only {res.accepted} of {n} accepted")
                return 1
            per_run.append({"peak_links": after["peak"], "relay": after["relay"],
                            **{k: after[k] - before[k] for k in ("attaches", "detaches", "evictions")}})
        one_links = one.link_stats()
    many_rate = n / statistics.median(many_s)
    one_rate = n / statistics.median(one_s)
    med = {k: int(statistics.median(r[k] for r in per_run)) for k in ("attaches", "detaches", "evictions")}
    result = {
        **_setting(peer, amqp, args, n, n_topics, len(many_s)),
        "max_links": amqp.max_links,
        "anonymous_relay": amqp.anonymous_relay,
        "relay": any(r["relay"] for r in per_run),
        "topics_msgs_per_s": round(many_rate, 1),
        "one_topic_msgs_per_s": round(one_rate, 1),
        "ratio": round(many_rate / one_rate, 3),
        "peak_links": max(r["peak_links"] for r in per_run),
        "one_topic_peak_links": one_links["peak"],
        **med,
        "runs": per_run,
        "topics_runs_s": [round(x, 4) for x in many_s],
        "one_topic_runs_s": [round(x, 4) for x in one_s],
    }
    if args.json:
        print(json.dumps(result))
    else:
        how = "the anonymous relay" if result["relay"] else f"links, at most {amqp.max_links} open"
        print(f"AMQP forwarding to {result['url']} ({peer or 'peer'}), profile {amqp.profile}: "
              f"{n} messages x {args.payload_bytes} B, QoS {args.qos}, median of {len(many_s)} runs, "
              f"dispositions awaited; {n_topics} topics over {how}")
        many_label, ratio_label = f"{n_topics:,} topics", f"ratio {n_topics:,} topics / 1 topic"
        w = len(ratio_label) + 2
        print(f"  {many_label:<{w}}{many_rate:10,.0f} msg/s   peak links {result['peak_links']:,}, attaches "
              f"{med['attaches']:,}, detaches {med['detaches']:,} (evictions {med['evictions']:,}) per run")
        print(f"  {'1 topic':<{w}}{one_rate:10,.0f} msg/s   peak links {one_links['peak']:,}")
        print(f"  {ratio_label:<{w}}{many_rate / one_rate:10.3f}")
    return 0


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.amqp.mapping import PROFILES, map_row
    from bridge.amqp.sender import Forwarder

    amqp = config.amqp
    if not amqp.url:
        print("lakegate: bench amqp: amqp.url is empty (forwarding off); set it with --set amqp.url=...")
        return 2
    if args.topics > 1:
        return _many_topics(args, config)
    run_id = uuid.uuid4().hex[:8]
    topics = [f"lakegate-bench/{run_id}/{i}" for i in range(max(1, args.topics))]
    payload = bytes(args.payload_bytes)
    rows = _rows(args.messages or 20000, payload, args.qos, topics)
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
        **_setting(peer, amqp, args, n, len(topics), len(sink_s)),
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


def _setting(peer: str, amqp, args, messages: int, topics: int, repeat: int) -> dict:
    """What both modes of the bench report of the run's setting."""
    return {"peer": peer, "url": mask_secret("amqp.url", amqp.url), "profile": amqp.profile,
            "messages": messages, "payload_bytes": args.payload_bytes, "qos": args.qos,
            "topics": topics, "repeat": repeat}
