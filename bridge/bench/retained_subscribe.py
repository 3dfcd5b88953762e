"""``lakegate bench retained-subscribe``: retained messages on SUBSCRIBE,
the edge (from the lakehouse) next to a Mosquitto holding the same set, in
one run.

* **Replay time.** A ``retained`` table of ``--topics`` (100,000) topics
  ``rt/{a}/{b}/{c}`` (``a`` = i // 10,000, ``b`` = i // 100 % 100, ``c`` =
  i % 100; ``--payload-bytes`` each, the number i padded, QoS 1) is written straight to Delta
  (one commit, as the job's MERGE leaves it) in a temporary ``data_dir``;
  the edge (``python -m bridge edge``) is started on it. A Mosquitto
  (``persistence false``, no queue or in-flight limit, so it does not cut
  a large replay short) gets the same set published to it first, at QoS 0
  with RETAIN 1, confirmed by a PINGREQ round trip. Then, for each filter
  (``rt/3/42/+``: 100 topics, ``rt/3/#``: 10,000, ``#``: all), a fresh MQTT
  3.1.1 client connects, subscribes at QoS 0 and counts PUBLISH frames:
  the time from writing the SUBSCRIBE to reading the last expected
  retained message. ``--repeat`` runs per filter, the servers taking
  turns; the median is reported with every run. Target: the edge within
  2x Mosquitto's time.
* **Start-up and memory.** The edge started on a table of
  ``--big-topics`` (1,000,000): seconds from process start to listening
  (the table loaded and indexed, the payload cache filled), and its RSS
  then; the same on an empty table, so the difference per topic is the
  store's memory per retained topic. Targets: start-up <= 10 s, RSS <=
  300 MB.

The receiving client is the same code for both servers (asyncio, raw
frames, a fixed-header walk per frame). Exit code 1 when a run was
incomplete (a server sent fewer messages than the topics the filter
matches) or failed; missed targets are reported, not an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bridge.bench.edge import _stop, start_edge, start_mosquitto
from bridge.bench.subload import frame_header
from bridge.bench.subscribe import rss_bytes
from bridge.config import Config

__all__ = ["FILTERS", "TARGETS", "add_arguments", "run", "write_table"]

TARGETS = {"replay_ratio_max": 2.0, "rss_mb_max": 300.0, "startup_s_max": 10.0}
#: filter -> the number of topics it matches, as a function of the topic count
FILTERS = {"rt/3/42/+": lambda n: min(100, max(0, n - 34_200)),
           "rt/3/#": lambda n: min(10_000, max(0, n - 30_000)),
           "#": lambda n: n}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--topics", type=int, default=100_000, help="retained topics for the replay runs")
    p.add_argument("--big-topics", type=int, default=1_000_000,
                   help="retained topics for the start-up and memory run")
    p.add_argument("--payload-bytes", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="runs per filter and server")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    p.add_argument("--phases", default="replay,startup", help="replay, startup, or both")


def topic(i: int) -> str:
    return f"rt/{i // 10000}/{i // 100 % 100}/{i % 100}"


def write_table(tables_dir: Path, n: int, payload_bytes: int) -> float:
    """A retained table of ``n`` topics in one commit; returns seconds taken."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    from bridge.tables.deltars import DeltaRsEngine
    from bridge.tables.schemas import SCHEMAS

    t0 = time.monotonic()
    engine = DeltaRsEngine(tables_dir)
    engine.ensure()
    schema = SCHEMAS["retained"]
    now = dt.datetime.now(dt.timezone.utc)
    cols = {}
    for f in schema:
        if f.name == "topic":
            cols[f.name] = pa.array([topic(i) for i in range(n)], f.type)
        elif f.name == "deleted":
            cols[f.name] = pa.array([False] * n, f.type)
        elif f.name == "payload":
            cols[f.name] = pa.array([str(i).rjust(payload_bytes, "p").encode() for i in range(n)],
                                    f.type)
        elif f.name in ("payload_size",):
            cols[f.name] = pa.array([payload_bytes] * n, f.type)
        elif f.name == "qos":
            cols[f.name] = pa.array([1] * n, f.type)
        elif f.name in ("offset", "seq"):
            cols[f.name] = pa.array(range(n), f.type)
        elif f.name == "partition":
            cols[f.name] = pa.array([0] * n, f.type)
        elif f.name == "stream":
            cols[f.name] = pa.array(["bench"] * n, f.type)
        elif f.name == "set_at":
            cols[f.name] = pa.array([now] * n, f.type)
        elif f.name in ("client_id", "origin"):
            cols[f.name] = pa.array(["bench" if f.name == "client_id" else "client"] * n, f.type)
        else:
            cols[f.name] = pa.nulls(n, f.type)
    write_deltalake(str(engine.path("retained")), pa.Table.from_pydict(cols, schema=schema),
                    mode="append")
    return time.monotonic() - t0


# ---------------------------------------------------------------- MQTT, raw
def _connect_frame(client_id: str) -> bytes:
    from bridge.mqtt import Connect, encode

    return encode(Connect.for_level(4, client_id=client_id, keepalive=60), 4)


async def _open(port: int, client_id: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(_connect_frame(client_id))
    await writer.drain()
    connack = await reader.readexactly(4)
    if connack[0] != 0x20 or connack[3] != 0:
        raise RuntimeError(f"CONNACK {connack.hex()}")
    return reader, writer


async def load_mosquitto(port: int, n: int, payload_bytes: int) -> float:
    """Publish the retained set to Mosquitto (QoS 0, RETAIN 1), then a
    PINGREQ whose PINGRESP says every PUBLISH before it was handled."""
    from bridge.mqtt import Publish, encode

    t0 = time.monotonic()
    reader, writer = await _open(port, "bench-loader")
    batch = []
    for i in range(n):
        batch.append(encode(Publish(topic=topic(i), payload=str(i).rjust(payload_bytes, "p").encode(),
                                    retain=True), 4))
        if len(batch) >= 2000:
            writer.write(b"".join(batch))
            batch.clear()
            await writer.drain()
    writer.write(b"".join(batch) + b"\xc0\x00")  # PINGREQ
    await writer.drain()
    while True:
        first = await reader.readexactly(2)
        if first == b"\xd0\x00":
            break
    writer.close()
    return time.monotonic() - t0


async def replay_time(port: int, topic_filter: str, expected: int, timeout: float, label: str) -> dict:
    """SUBSCRIBE at QoS 0; seconds until the ``expected``-th PUBLISH."""
    from bridge.mqtt import Subscribe, Subscription, encode

    reader, writer = await _open(port, f"bench-rs-{label}")
    sub = encode(Subscribe(1, [Subscription(topic_filter, 0)]), 4)
    got = 0
    buf = b""
    t0 = time.monotonic()
    writer.write(sub)
    deadline = t0 + timeout
    t_last = None
    while got < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            chunk = await asyncio.wait_for(reader.read(1 << 20), left)
        except asyncio.TimeoutError:
            break
        if not chunk:
            break
        buf += chunk
        pos = 0
        end = len(buf)
        while pos < end:
            h = frame_header(buf, pos, end)
            if h is None or pos + h[1] > end:
                break
            if buf[pos] >> 4 == 3:
                got += 1
            pos += h[1]
        buf = buf[pos:]
        if got >= expected:
            t_last = time.monotonic()
    writer.close()
    return {"filter": topic_filter, "expected": expected, "received": got,
            "complete": got >= expected,
            "seconds": round((t_last or time.monotonic()) - t0, 4)}


# ---------------------------------------------------------------- phases
async def _replays(args, edge_port: int, mosq_port: int) -> dict:
    out: dict = {}
    for f, count in FILTERS.items():
        expected = count(args.topics)
        runs: dict[str, list] = {"edge": [], "mosquitto": []}
        for i in range(args.repeat):
            for name, port in (("edge", edge_port), ("mosquitto", mosq_port)):
                runs[name].append(await replay_time(port, f, expected, args.timeout, f"{name}{i}"))
        point = {"expected": expected}
        for name, rs in runs.items():
            secs = [r["seconds"] for r in rs]
            point[name] = {"median_s": statistics.median(secs), "runs_s": secs,
                           "complete": all(r["complete"] for r in rs),
                           "received": [r["received"] for r in rs]}
        m = point["mosquitto"]["median_s"]
        point["ratio"] = round(point["edge"]["median_s"] / m, 2) if m > 0 else None
        out[f] = point
    return out


def _startup(args, base: Path, n: int) -> dict:
    data = base / f"startup-{n}"
    write_s = write_table(data / "tables", n, args.payload_bytes) if n else 0.0
    if not n:
        from bridge.tables.deltars import DeltaRsEngine

        DeltaRsEngine(data / "tables").ensure()
    t0 = time.monotonic()
    proc, _port = start_edge(args, data)
    try:
        secs = time.monotonic() - t0
        rss = rss_bytes(proc.pid)
    finally:
        _stop(proc)
    return {"topics": n, "write_s": round(write_s, 2), "startup_s": round(secs, 2),
            "rss_mb": round(rss / 1e6, 1) if rss else None}


def run(args: argparse.Namespace, config: Config) -> int:
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    base = Path(tempfile.mkdtemp(prefix="lakegate-bench-retained-"))
    result: dict = {"topics": args.topics, "big_topics": args.big_topics,
                    "payload_bytes": args.payload_bytes, "repeat": args.repeat,
                    "targets": TARGETS}
    failed = False
    t_start = time.monotonic()
    try:
        if "replay" in phases:
            data = base / "replay"
            result["table_write_s"] = round(write_table(data / "tables", args.topics,
                                                        args.payload_bytes), 2)
            t0 = time.monotonic()
            edge, edge_port = start_edge(args, data)
            result["edge_startup_s"] = round(time.monotonic() - t0, 2)
            mosq = None
            try:
                mosq, mosq_port = start_mosquitto(base, "max_inflight_messages 0\n"
                                                        "max_queued_messages 0\n")
                result["mosquitto_load_s"] = round(asyncio.run(
                    load_mosquitto(mosq_port, args.topics, args.payload_bytes)), 2)
                result["replay"] = asyncio.run(_replays(args, edge_port, mosq_port))
            finally:
                _stop(edge)
                _stop(mosq)
            failed |= not all(p["edge"]["complete"] for p in result["replay"].values())
        if "startup" in phases:
            empty = _startup(args, base, 0)
            big = _startup(args, base, args.big_topics)
            result["startup"] = {"empty": empty, "big": big}
            if empty["rss_mb"] and big["rss_mb"] and args.big_topics:
                result["startup"]["bytes_per_topic"] = round(
                    (big["rss_mb"] - empty["rss_mb"]) * 1e6 / args.big_topics)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    met = {}
    if "replay" in result:
        met["replay_ratio"] = all(p["ratio"] is not None and p["ratio"] <= TARGETS["replay_ratio_max"]
                                  for p in result["replay"].values())
    if "startup" in result:
        big = result["startup"]["big"]
        met["rss"] = big["rss_mb"] is not None and big["rss_mb"] <= TARGETS["rss_mb_max"]
        met["startup"] = big["startup_s"] <= TARGETS["startup_s_max"]
    result["targets_met"] = met
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 1 if failed else 0


def _print(r: dict) -> None:
    print(f"bench retained-subscribe: {r['topics']:,} retained topics of {r['payload_bytes']} bytes, "
          f"median of {r['repeat']} runs, {r['seconds']} s")
    if "replay" in r:
        print(f"  table written in {r['table_write_s']} s; edge listening {r['edge_startup_s']} s "
              f"after start; Mosquitto loaded in {r['mosquitto_load_s']} s")
        print(f"  {'filter':<12} {'topics':>8} {'edge (s)':>10} {'mosquitto (s)':>14} {'edge/mosq':>10}")
        for f, p in r["replay"].items():
            flag = "" if p["edge"]["complete"] and p["mosquitto"]["complete"] else \
                f"  INCOMPLETE edge {p['edge']['received']} mosquitto {p['mosquitto']['received']}"
            print(f"  {f:<12} {p['expected']:>8,} {p['edge']['median_s']:>10.4f} "
                  f"{p['mosquitto']['median_s']:>14.4f} {p['ratio'] if p['ratio'] is not None else '-':>10}"
                  f"   runs edge {p['edge']['runs_s']} mosquitto {p['mosquitto']['runs_s']}{flag}")
    if "startup" in r:
        s = r["startup"]
        print(f"  start-up: empty table {s['empty']['startup_s']} s, RSS {s['empty']['rss_mb']} MB; "
              f"{s['big']['topics']:,} topics (table written in {s['big']['write_s']} s) "
              f"{s['big']['startup_s']} s, RSS {s['big']['rss_mb']} MB"
              + (f"; {s['bytes_per_topic']} bytes per topic" if "bytes_per_topic" in s else ""))
    met = r["targets_met"]
    print("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in met.items())
          + f" (replay <= {TARGETS['replay_ratio_max']}x Mosquitto, RSS <= {TARGETS['rss_mb_max']:.0f} MB, "
          f"start-up <= {TARGETS['startup_s_max']:.0f} s)")

