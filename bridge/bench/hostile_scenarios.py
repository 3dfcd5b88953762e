"""The hostile scenarios of issue 38, as load generators: each function takes
a running server (:class:`bridge.bench.hostile.Server`: ``port``,
``kill()``, ``restart()``, ``alive()``, ``log_text()``) and the
:class:`Sizes`, runs its load while the good client
(:mod:`bridge.bench.hostile_good`, another process) publishes, and returns
a dict of what it saw, with ``failures``: a list of one-line findings (a
SUBACK that never came, a session that lost messages without a logged
cause, ...). The same code runs at full size in ``lakegate bench hostile``
(edge and Mosquitto) and at small size in ``tests/hostile`` (edge only).

This module: the sizes, a pipelined publisher, slow readers, the retained
flood with replays. :mod:`bridge.bench.hostile_floods`: the subscription
and connection floods. :mod:`bridge.bench.hostile_sessions`: session
churn, SIGKILL with in-flight QoS 1/2, the SUBSCRIBE/UNSUBSCRIBE fuzz. Everything is MQTT 3.1.1 over raw loopback sockets unless said; every
loop is bounded by a count and by a clock. No payload is ever printed.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import time
from pathlib import Path

from bridge.bench.hostile_good import RawMqtt, publish_frame, read_publish
from bridge.mqtt import frame_length

__all__ = ["FULL", "QUICK", "Publisher", "Sizes", "retained_flood", "slow_readers", "socket_states"]

_SEQ = struct.Struct(">Q")
_DISCONNECT = b"\xe0\x00"
_TCP_ESTABLISHED = 1  # Linux: tcpi_state (struct tcp_info), the state column of /proc/net/tcp


@dataclasses.dataclass
class Sizes:
    """Every size of every scenario (the defaults: full size)."""

    # slow readers: subscribers to "#" that never read, while a publisher sends
    slow_subscribers: int = 200
    slow_seconds: float = 12.0
    slow_keepalive_s: int = 5            # half of them; the other half: Keep Alive 0
    flood_rate: int = 2000               # QoS 1 msg/s of the flooding publisher
    flood_payload_bytes: int = 1024
    # retained flood with replays
    retained_topics: int = 200_000
    retained_readers: int = 20
    retained_read_seconds: float = 10.0
    retained_read_bytes_per_s: int = 65536  # per slow reader
    # subscription flood
    sub_clients: int = 20
    sub_per_client: int = 1000           # the edge's default quota
    sub_depth: int = 100
    big_subscribe_filters: int = 95_000  # 11 bytes each: one SUBSCRIBE of ~1 MB
    # connection flood
    flood_connections: int = 2000
    flood_hold_s: float = 12.0           # past the edge's connect_timeout_s (10)
    # session churn
    churn_sessions: int = 1000
    churn_seconds: float = 15.0
    churn_concurrency: int = 50
    churn_messages: int = 20             # QoS 1 messages to each session
    # SIGKILL with in-flight QoS 1/2
    kill_queued: int = 1200              # published past the in-flight window
    kill_inflight: int = 20              # the servers' in-flight window (both default to 20)
    # SUBSCRIBE/UNSUBSCRIBE fuzz
    fuzz_packets: int = 20_000
    fuzz_seed: int = 38
    #: any one wait of a scenario (a SUBACK, a replay, a drain), at most
    timeout_s: float = 120.0

    def replace(self, items: list[str]) -> Sizes:
        """A copy with ``name=value`` items applied (``--size``)."""
        out = dataclasses.replace(self)
        fields = {f.name: f for f in dataclasses.fields(self)}
        for item in items:
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in fields:
                raise ValueError(f"--size {item!r}: expected NAME=VALUE with NAME one of "
                                 f"{', '.join(fields)}")
            kind = type(getattr(self, name))
            setattr(out, name, kind(value))
        return out


FULL = Sizes()
QUICK = Sizes(slow_subscribers=20, slow_seconds=4.0, slow_keepalive_s=1, flood_rate=500,
              retained_topics=5000, retained_readers=5, retained_read_seconds=2.0,
              sub_clients=3, sub_per_client=100, sub_depth=20, big_subscribe_filters=10_000,
              flood_connections=200, flood_hold_s=2.0,
              churn_sessions=50, churn_seconds=3.0, churn_concurrency=10, churn_messages=5,
              kill_queued=100, fuzz_packets=600, timeout_s=30.0)


# ---------------------------------------------------------------- a publisher
class Publisher:
    """One MQTT 3.1.1 publisher connection: pipelined QoS 1/2 PUBLISHes (at
    most ``window`` unacknowledged), optionally paced, counting what the
    server acknowledged by key. A raw socket: paho stalls past 65,535
    queued QoS 1 messages and ``mosquitto_pub -l -q 1`` loses messages."""

    def __init__(self, port: int, client_id: str, window: int = 1000, clean: bool = True) -> None:
        self.client = RawMqtt(port, timeout=10.0)
        ack = self.client.connect(client_id, clean=clean, keepalive=0)
        if not ack or ack[0] != 0x20 or ack[3] != 0:
            raise ConnectionError(f"publisher {client_id}: CONNACK {ack!r}")
        self.window = min(window, 65000)
        self.acked: list = []          # keys, in acknowledgement order
        self.refused = 0               # (3.1.1 has no negative acknowledgement: stays 0)
        self.sent = 0
        self.closed = False

    def run(self, messages, rate: float | None = None, seconds: float | None = None,
            drain_s: float = 10.0) -> dict:
        """Publish ``messages`` (an iterable of (key, topic, payload, qos,
        retain)); stop early after ``seconds``; wait ``drain_s`` at most for
        the last acknowledgements. Returns counts."""
        sock = self.client.sock
        sock.setblocking(False)
        outstanding: dict[int, tuple[object, int]] = {}
        pid = 0
        it = iter(messages)
        pending = None
        exhausted = False
        t0 = time.perf_counter()
        stop_at = t0 + seconds if seconds is not None else float("inf")
        drain_until = None
        buf = b""
        out = bytearray()
        while True:
            now = time.perf_counter()
            if drain_until is None and (exhausted or now >= stop_at):
                drain_until = now + drain_s
            if drain_until is not None and (not outstanding or now >= drain_until):
                break
            if drain_until is None:
                due = float("inf") if rate is None else int((now - t0) * rate) + 1
                while self.sent < due and len(outstanding) < self.window:
                    if pending is None:
                        pending = next(it, None)
                        if pending is None:
                            exhausted = True
                            break
                    key, topic, payload, qos, retain = pending
                    pending = None
                    pid = pid % 65535 + 1
                    while pid in outstanding:
                        pid = pid % 65535 + 1
                    outstanding[pid] = (key, qos)
                    out += publish_frame(topic, payload, qos, pid, retain=retain)
                    self.sent += 1
                    if len(out) > 262144:
                        break
            if out:
                try:
                    n = sock.send(out)
                    del out[:n]
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed = True
                    break
            wait = 0.005 if (rate is not None or out) else 0.05
            r, _, _ = select.select([sock], [sock] if out else [], [], wait)
            if not r:
                continue
            try:
                chunk = sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            buf += chunk
            rels = bytearray()
            at = 0
            while len(buf) - at >= 4:
                total = frame_length(buf[at:at + 5], from_client=False)
                if total is None or len(buf) - at < total:
                    break
                kind, p = buf[at] >> 4, int.from_bytes(buf[at + 2:at + 4], "big")
                at += total
                if kind == 4 or kind == 7:  # PUBACK, PUBCOMP
                    item = outstanding.pop(p, None)
                    if item is not None:
                        self.acked.append(item[0])
                elif kind == 5:  # PUBREC: release it
                    rels += b"\x62\x02" + p.to_bytes(2, "big")
            buf = buf[at:]
            if rels:
                out += rels
        return {"sent": self.sent, "acked": len(self.acked), "unacked": len(outstanding),
                "closed_by_server": self.closed,
                "seconds": round(time.perf_counter() - t0, 3)}

    def close(self) -> None:
        if not self.closed:
            self.client.sock.setblocking(True)
            self.client.send(_DISCONNECT)
        self.client.close()


def socket_states(socks: list[socket.socket]) -> list[str]:
    """Whether the server closed each connection, read from the kernel's
    table of the server's own sockets, never from the connection: "open"
    while the server's end is ESTABLISHED, "closed" once the server let
    go of it (FIN-WAIT with undeliverable bytes behind it is closed: the
    process released it; the client never reading keeps it from seeing the
    FIN). Reading would drain the server's write buffer and let a close
    that waits for the drain complete, hiding exactly the defect of a
    server that does not disconnect a client that stopped reading
    [MQTT-3.1.2-22]. Without ``/proc/net/tcp``: the client's own TCP state
    (open until a FIN or RST reaches it)."""
    server_side = _server_states()
    out = []
    for s in socks:
        try:
            mine = s.getsockname()[1]
            server = s.getpeername()[1]
        except OSError:
            out.append("closed")
            continue
        if server_side is not None:
            out.append("open" if server_side.get((server, mine)) == _TCP_ESTABLISHED else "closed")
            continue
        try:
            state = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except OSError:
            state = 0
        out.append("open" if state == _TCP_ESTABLISHED else "closed")
    return out


def _server_states() -> dict[tuple[int, int], int] | None:
    """(local port, remote port) -> TCP state of every IPv4 loopback socket."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    out = {}
    for line in lines:
        f = line.split()
        local, remote, state = f[1], f[2], int(f[3], 16)
        if local.startswith("0100007F:"):  # 127.0.0.1, little-endian hex
            out[(int(local[9:], 16), int(remote.split(":")[1], 16))] = state
    return out


def _subscribe_ok(ack: bytes | None, n: int = 1) -> bool:
    return bool(ack) and ack[0] == 0x90 and len(ack) >= 4 + n and all(c < 0x80 for c in ack[-n:])


# ---------------------------------------------------------------- slow readers
def slow_readers(server, sz: Sizes) -> dict:
    """``slow_subscribers`` clients subscribe to ``#`` (half at QoS 0: the
    server writes to them until its write buffer is full; half at QoS 1:
    their in-flight window fills) with a 4 KiB receive buffer and never
    read a byte, half of each with Keep Alive
    ``slow_keepalive_s`` (never a PINGREQ: the server must disconnect them
    after 1.5 times that [MQTT-3.1.2-22], also with its writes to them
    stuck), half with Keep Alive 0 (kept: their queues must stay bounded).
    A publisher sends QoS 1 messages of ``flood_payload_bytes`` at
    ``flood_rate`` for ``slow_seconds``."""
    failures: list[str] = []
    subs = []
    refused = 0
    for i in range(sz.slow_subscribers):
        c = RawMqtt(server.port, timeout=10.0, rcvbuf=4096)
        keepalive = sz.slow_keepalive_s if i % 2 else 0
        ack = c.connect(f"slow-{i}", keepalive=keepalive)
        if not ack or ack[0] != 0x20 or not _subscribe_ok(c.subscribe(1, [("#", i // 2 % 2)])):
            refused += 1
            c.close()
            continue
        subs.append((c, keepalive))
    t0 = time.monotonic()
    pub = Publisher(server.port, "flood-pub", window=1000)
    filler = b"f" * max(sz.flood_payload_bytes - 8, 0)
    count = int(sz.flood_rate * sz.slow_seconds)
    msgs = ((k, b"flood/%d" % (k % 64), _SEQ.pack(k) + filler, 1, False) for k in range(count))
    stats = pub.run(msgs, rate=sz.flood_rate, seconds=sz.slow_seconds)
    pub.close()
    # the Keep Alive of the slow ones has run out when they are checked, with
    # 2.5 s for the server's check to come round (Mosquitto's runs every second)
    left = sz.slow_keepalive_s * 1.5 + 2.5 - (time.monotonic() - t0)
    if left > 0:
        time.sleep(min(left, 60.0))
    states = list(zip(socket_states([c.sock for c, _ka in subs]), [ka for _c, ka in subs]))
    for c, _ka in subs:
        c.close()
    expiring = [s for s, ka in states if ka]
    closed = sum(1 for s in expiring if s == "closed")
    if closed < len(expiring):
        failures.append(f"{len(expiring) - closed} of {len(expiring)} slow readers still connected "
                        f"{time.monotonic() - t0:.1f} s after their last packet, with a Keep Alive "
                        f"of {sz.slow_keepalive_s} s [MQTT-3.1.2-22]")
    if refused:
        failures.append(f"{refused} slow readers refused (CONNECT or SUBSCRIBE)")
    if stats["unacked"] or stats["closed_by_server"]:
        failures.append(f"the flooding publisher: {stats['unacked']} unacknowledged, "
                        f"closed={stats['closed_by_server']}")
    return {"subscribers": len(subs), "publisher": stats,
            "keepalive_expired": len(expiring), "keepalive_expired_closed": closed,
            "keepalive_0_still_open": sum(1 for s, ka in states if not ka and s == "open"),
            "failures": failures}


# ---------------------------------------------------------------- retained flood
def _retained_topic(i: int) -> bytes:
    return b"ret/%04d/%03d" % (i // 1000, i % 1000)


class _SlowReader:
    """A subscriber to ``#`` at QoS 1 that reads at most ``rate`` bytes/s
    and acknowledges what it read."""

    def __init__(self, port: int, client_id: str, clean: bool) -> None:
        self.client_id, self.clean = client_id, clean
        self.c = RawMqtt(port, timeout=10.0, rcvbuf=8192)
        ack = self.c.connect(client_id, clean=clean, keepalive=0)
        self.ok = bool(ack) and ack[0] == 0x20 and ack[3] == 0
        self.received = 0

    def subscribe(self) -> None:
        if self.ok:
            self.c.send(b"\x82\x06\x00\x01\x00\x01#\x01")  # SUBSCRIBE 1 "#" QoS 1
        self.c.sock.setblocking(False)

    def read(self, budget: int) -> None:
        c = self.c
        try:
            chunk = c.sock.recv(max(1, budget))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            c.closed = True
            return
        c.buf += chunk
        acks = bytearray()
        while c.buf:
            total = frame_length(c.buf, from_client=False)
            if total is None or len(c.buf) < total:
                break
            pkt, c.buf = c.buf[:total], c.buf[total:]
            if pkt[0] >> 4 == 3:
                self.received += 1
                if pkt[0] & 0x06:
                    acks += b"\x40\x02" + read_publish(pkt)[1].to_bytes(2, "big")
        if acks:
            try:
                c.sock.send(acks)
            except OSError:
                c.closed = True


def retained_flood(server, sz: Sizes) -> dict:
    """``retained_topics`` retained QoS 1 messages, pipelined; then
    ``retained_readers`` clients (half clean, half persistent) subscribe to
    ``#``, all at once, and read slowly for ``retained_read_seconds`` and disconnect with
    their replays queued; the persistent ones come back with Clean Start
    and must get a CONNACK; last, a fresh subscriber to ``#`` at QoS 0 must
    get every retained message the server acknowledged."""
    failures: list[str] = []
    payload = b"r" * 56
    pub = Publisher(server.port, "retained-pub", window=1000)
    msgs = ((i, _retained_topic(i), _SEQ.pack(i) + payload, 1, True)
            for i in range(sz.retained_topics))
    t0 = time.perf_counter()
    stats = pub.run(msgs, drain_s=sz.timeout_s)
    publish_s = time.perf_counter() - t0
    pub.close()
    if stats["unacked"] or stats["closed_by_server"]:
        failures.append(f"retained publisher: {stats['unacked']} of {stats['sent']} unacknowledged, "
                        f"closed={stats['closed_by_server']}")
    readers = [_SlowReader(server.port, f"replay-{i}", clean=bool(i % 2))
               for i in range(sz.retained_readers)]
    for r in readers:  # all connected first: the SUBSCRIBEs arrive together
        r.subscribe()
    step = 0.05
    budget = max(1, int(sz.retained_read_bytes_per_s * step))
    end = time.monotonic() + sz.retained_read_seconds
    while time.monotonic() < end:
        for r in readers:
            if r.ok and not r.c.closed:
                r.read(budget)
        time.sleep(step)
    read_during = [r.received for r in readers]
    for r in readers:
        r.c.sock.setblocking(True)
        r.c.send(_DISCONNECT)
        r.c.close()
    # the persistent ones again, Clean Start 1: a CONNACK each, in time
    back = failed = 0
    for r in readers:
        if r.clean:
            continue
        c = RawMqtt(server.port, timeout=10.0)
        ack = c.connect(r.client_id, clean=True, keepalive=0)
        if ack and ack[0] == 0x20 and ack[3] == 0:
            back += 1
        else:
            failed += 1
        c.send(_DISCONNECT)
        c.close()
    if failed:
        failures.append(f"{failed} persistent sessions that came back with Clean Start got no CONNACK "
                        f"within 10 s")
    # every acknowledged retained message is there
    got, replay_s = _replay_count(server.port, "replay-check", stats["acked"], sz.timeout_s)
    if got < stats["acked"]:
        failures.append(f"a fresh subscriber to # got {got} of {stats['acked']} acknowledged "
                        f"retained messages")
    return {"published": stats["sent"], "acked": stats["acked"], "publish_s": round(publish_s, 2),
            "publish_msgs_per_s": round(stats["acked"] / publish_s, 1) if publish_s else None,
            "readers": len(readers), "read_by_slow_readers": sum(read_during),
            "clean_start_connack": back, "replayed": got, "replay_s": replay_s,
            "failures": failures}


def _replay_count(port: int, client_id: str, expected: int, timeout: float) -> tuple[int, float]:
    """Retained messages a fresh QoS 0 subscriber to ``#`` receives (distinct
    ``ret/`` topics), until ``expected`` or ``timeout`` or 5 s of silence."""
    c = RawMqtt(port, timeout=10.0)
    c.connect(client_id, keepalive=0)
    t0 = time.perf_counter()
    c.send(b"\x82\x06\x00\x01\x00\x01#\x00")
    seen = set()
    deadline = time.monotonic() + timeout
    while len(seen) < expected and time.monotonic() < deadline:
        pkt = c.packet(timeout=5.0)
        if not pkt:
            break
        if pkt[0] >> 4 == 3 and pkt[0] & 1:
            topic = read_publish(pkt)[3]
            if topic.startswith(b"ret/"):
                seen.add(topic)
    took = round(time.perf_counter() - t0, 3)
    c.send(_DISCONNECT)
    c.close()
    return len(seen), took
