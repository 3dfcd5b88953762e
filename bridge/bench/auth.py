"""``lakegate bench auth``: a legitimate client's CONNACK latency with a password
file, without and then under a flood of wrong-password CONNECTs, in one run.

The bench starts the edge itself (``python -m bridge edge``, a separate
process, with this command's ``--config``/``--set``, a temporary data
directory and a temporary password file holding user ``alice`` hashed at
``--cost-ln``, 15 = the default cost of ``lakegate passwd``;
``edge.allow_anonymous = false``). Then, per phase of ``--seconds``:

* **quiet**: the legitimate client (MQTT 3.1.1, from 127.0.0.1) connects
  every ``--interval-ms`` with the right password, times CONNECT written to
  CONNACK read, disconnects;
* **flood**: the same, while a separate process (so that it does not share
  this process's interpreter lock with the measuring client) opens
  ``--flood-rate`` connections per second from ``--flood-address`` (another
  loopback address, default 127.0.0.2; ``--flood-addresses N`` spreads them
  over N consecutive addresses), each sending a CONNECT for ``alice``
  with a wrong password and closing the socket at once. The flood process
  runs at nice 19: on a network the attacker's CPU is not the edge's, and on
  one machine the generator would otherwise take the CPU the edge measures.

It prints p50/p99 of both phases and the ratio flood/quiet of the p99s, how
many legitimate CONNECTs were refused, and the flood rate reached. Every
phase is bounded in time; the whole run takes about ``2 * --seconds`` plus
the edge's start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bridge.config import Config
from bridge.mqtt import Connect, encode

__all__ = ["add_arguments", "run"]

_USER = "alice"
_GOOD = b"correct horse battery staple"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="length of each phase, quiet and flood (default 10)")
    p.add_argument("--interval-ms", type=float, default=50.0,
                   help="pause between the legitimate client's connections (default 50)")
    p.add_argument("--flood-rate", type=int, default=1000,
                   help="wrong-password CONNECTs per second during the flood (default 1000)")
    p.add_argument("--flood-address", default="127.0.0.2",
                   help="loopback address the flood connects from (default 127.0.0.2)")
    p.add_argument("--flood-addresses", type=int, default=1,
                   help="spread the flood over this many consecutive loopback addresses from "
                        "--flood-address (default 1)")
    p.add_argument("--cost-ln", type=int, default=15,
                   help="scrypt cost (log2 N) of the password file's hash (default 15)")


def _connect_frame(client_id: str, password: bytes) -> bytes:
    return encode(Connect.for_level(4, client_id=client_id, username=_USER, password=password,
                                    keepalive=0), 4)


def _read_connack(sock: socket.socket) -> bytes:
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def _legit(port: int, seconds: float, interval_s: float, tag: str) -> dict:
    """Connect with the right password every ``interval_s`` for ``seconds``;
    CONNACK latencies in ms and the refusals."""
    lat: list[float] = []
    refused = 0
    errors = 0
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        frame = _connect_frame(f"legit-{tag}-{n}", _GOOD)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                t0 = time.perf_counter()
                s.sendall(frame)
                ack = _read_connack(s)
                dt = (time.perf_counter() - t0) * 1000
                if len(ack) == 4 and ack[0] == 0x20 and ack[3] == 0:
                    lat.append(dt)
                    s.sendall(b"\xe0\x00")
                else:
                    refused += 1
        except OSError:
            errors += 1
        time.sleep(interval_s)  # pacing of the measuring client, not a wait for a condition
    return _summary(lat) | {"connects": n, "refused": refused, "errors": errors}


def _summary(lat: list[float]) -> dict:
    if not lat:
        return {"ok": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(lat)
    return {"ok": len(s), "p50_ms": round(s[len(s) // 2], 2),
            "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2), "max_ms": round(s[-1], 2)}


# ---------------------------------------------------------------- the flood (own process)
def _addresses(first: str, n: int) -> list[str]:
    import ipaddress

    base = ipaddress.IPv4Address(first)
    out = [str(base + i) for i in range(n)]
    if not all(ipaddress.IPv4Address(a).is_loopback for a in out):
        raise ValueError(f"--flood-address {first} + {n} leaves the loopback range")
    return out


async def _flood(port: int, address: str, rate: int, seconds: float, spread: int = 1) -> dict:
    frame = _connect_frame("flood", b"wrong password")
    addresses = _addresses(address, spread)
    sent = errors = 0
    turn = 0
    tick = 0.01
    per_tick = max(1, round(rate * tick))
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + seconds

    async def one() -> None:
        nonlocal sent, errors, turn
        turn += 1
        source = addresses[turn % len(addresses)]
        try:
            _r, w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), 5)
            w.write(frame)
            w.close()
            sent += 1
        except (OSError, asyncio.TimeoutError):
            errors += 1

    tasks: set[asyncio.Task] = set()
    k = 0
    while loop.time() < end:
        k += 1
        for _ in range(per_tick):
            if len(tasks) < 2000:  # bound the connections in progress
                t = loop.create_task(one())
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        await asyncio.sleep(max(0.0, start + k * tick - loop.time()))
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    elapsed = loop.time() - start
    return {"sent": sent, "errors": errors, "per_s": round(sent / elapsed, 1)}


def _flood_main(port: int, address: str, rate: int, seconds: float, spread: int = 1) -> None:
    print(json.dumps(asyncio.run(_flood(port, address, rate, seconds, spread))), flush=True)


def _start_flood(port: int, args: argparse.Namespace) -> subprocess.Popen:
    code = (f"from bridge.bench.auth import _flood_main; "
            f"_flood_main({port}, {args.flood_address!r}, {args.flood_rate}, {args.seconds}, "
            f"{args.flood_addresses})")
    root = Path(__file__).resolve().parents[2]
    # Niced: on a real network the flood's own CPU is the attacker's, not the edge's.
    return subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(19))


# ---------------------------------------------------------------- run
def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.bench.edge import _stop, start_edge
    from bridge.edge.auth import hash_password, write_password_file

    from bridge.cli import UsageError

    if args.seconds <= 0 or args.flood_rate < 1 or args.interval_ms < 0 or args.flood_addresses < 1:
        raise UsageError("--seconds, --flood-rate and --flood-addresses must be positive, "
                         "--interval-ms not negative")
    try:
        _addresses(args.flood_address, args.flood_addresses)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    tmp = Path(tempfile.mkdtemp(prefix="lakegate-bench-auth-"))
    passwd = tmp / "passwd"
    write_password_file(passwd, {_USER: hash_password(_GOOD, ln=args.cost_ln)})
    args.overrides = list(getattr(args, "overrides", None) or []) + [
        f"edge.password_file={passwd}", "edge.allow_anonymous=false"]
    result: dict = {"protocol": "3.1.1", "seconds": args.seconds, "interval_ms": args.interval_ms,
                    "flood_rate": args.flood_rate, "flood_address": args.flood_address,
                    "flood_addresses": args.flood_addresses,
                    "cost_ln": args.cost_ln, "cpus": os.cpu_count(),
                    "edge_settings": {k: getattr(config.edge, k) for k in (
                        "auth_workers", "auth_max_pending", "auth_max_pending_per_address",
                        "auth_failure_backoff_s")}}
    edge = flood = None
    try:
        edge, port = start_edge(args, tmp / "data")
        _legit(port, min(1.0, args.seconds), 0.0, "warm")  # first scrypt, imports, caches
        result["quiet"] = _legit(port, args.seconds, args.interval_ms / 1000, "quiet")
        flood = _start_flood(port, args)
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(
            _legit(port, args.seconds, args.interval_ms / 1000, "flood")))
        t.start()
        t.join(args.seconds + 60)
        result["flood"] = box
        out, err = flood.communicate(timeout=args.seconds + 60)
        try:
            result["flood"]["flood"] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            result["flood"]["flood"] = {"error": (err or "no output").strip()[-300:]}
        flood = None
        q, f = result["quiet"].get("p99_ms"), result["flood"].get("p99_ms")
        result["p99_ratio_flood_to_quiet"] = round(f / q, 2) if q and f else None
    finally:
        if flood is not None:
            flood.kill()
            flood.wait(10)
        _stop(edge)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    ok = result["quiet"]["ok"] > 0 and result["flood"].get("ok", 0) > 0
    return 0 if ok else 1


def _print(r: dict) -> None:
    print(f"legitimate CONNACK latency, password file (scrypt ln={r['cost_ln']}), MQTT "
          f"{r['protocol']}, {r['cpus']} CPUs, {r['seconds']:g} s per phase")
    for phase in ("quiet", "flood"):
        x = r[phase]
        line = (f"{phase:6} p50 {x.get('p50_ms')} ms  p99 {x.get('p99_ms')} ms  max "
                f"{x.get('max_ms')} ms  ({x.get('ok', 0)} ok, {x.get('refused', 0)} refused, "
                f"{x.get('errors', 0)} errors)")
        print(line)
    fl = r["flood"].get("flood", {})
    print(f"flood: {fl.get('sent')} wrong-password CONNECTs from {r['flood_addresses']} "
          f"address(es) from {r['flood_address']} "
          f"({fl.get('per_s')}/s, target {r['flood_rate']}/s)")
    print(f"p99 flood/quiet: {r['p99_ratio_flood_to_quiet']}")
