"""The subscription and connection floods of ``lakegate bench hostile``
(see :mod:`bridge.bench.hostile_scenarios` for the contract)."""

from __future__ import annotations

import resource
import socket
import time

from bridge.bench.hostile_good import RawMqtt, ack_codes, varint
from bridge.bench.hostile_scenarios import Sizes, socket_states

__all__ = ["connection_flood", "subscription_flood"]

_DISCONNECT = b"\xe0\x00"


# ---------------------------------------------------------------- subscription flood
def _subscribe_packet(packet_id: int, filters: list[bytes], qos: int = 0) -> bytes:
    body = bytearray(packet_id.to_bytes(2, "big"))
    for f in filters:
        body += len(f).to_bytes(2, "big") + f + bytes((qos,))
    return b"\x82" + varint(len(body)) + bytes(body)


def subscription_flood(server, sz: Sizes) -> dict:
    """``sub_clients`` clients each subscribe ``sub_per_client`` distinct
    filters of ``sub_depth`` levels (8 characters a level, 50 filters a
    SUBSCRIBE); then the first, at its quota, sends one SUBSCRIBE of
    ``big_subscribe_filters`` short filters (~1 MB). The time to each
    client's last SUBACK and to the big one's are measured; what was
    refused is counted."""
    failures: list[str] = []
    clients = []
    granted = refused = 0
    t0 = time.perf_counter()
    for c_i in range(sz.sub_clients):
        c = RawMqtt(server.port, timeout=sz.timeout_s)
        ack = c.connect(f"subflood-{c_i}", keepalive=0)
        if not ack or ack[0] != 0x20:
            failures.append(f"subscription client {c_i}: CONNECT answered {ack!r:.40}")
            c.close()
            continue
        packets = []
        for start in range(0, sz.sub_per_client, 50):
            filters = [("/".join([f"d{c_i:03d}{j:04d}"] + [f"{j:04d}.{k:03d}"
                                                            for k in range(1, sz.sub_depth)])).encode()
                       for j in range(start, min(start + 50, sz.sub_per_client))]
            packets.append(_subscribe_packet(start // 50 % 65535 + 1, filters))
        c.send(b"".join(packets))
        for _ in packets:
            pkt = c.packet()
            if not pkt or pkt[0] != 0x90:
                failures.append(f"subscription client {c_i}: no SUBACK ({'closed' if pkt == b'' else 'timeout'})")
                break
            codes = ack_codes(pkt)
            refused += sum(1 for x in codes if x >= 0x80)
            granted += sum(1 for x in codes if x < 0x80)
        clients.append(c)
    quota_s = time.perf_counter() - t0
    big = {}
    if clients:
        n = sz.big_subscribe_filters
        frame = _subscribe_packet(60000, [b"b/%06d" % i for i in range(n)])
        c = clients[0]
        t1 = time.perf_counter()
        c.send(frame)
        pkt = c.packet(timeout=sz.timeout_s)
        big = {"filters": n, "bytes": len(frame), "suback_s": round(time.perf_counter() - t1, 3)}
        if pkt and pkt[0] == 0x90:
            codes = ack_codes(pkt)
            big.update(granted=sum(1 for x in codes if x < 0x80), refused=sum(1 for x in codes if x >= 0x80))
            if len(codes) != n:
                failures.append(f"the big SUBACK has {len(codes)} return codes for {n} filters")
        else:
            big["answer"] = "closed" if pkt == b"" else "none"
            failures.append(f"the {len(frame):,}-byte SUBSCRIBE was not answered ({big['answer']})")
    for c in clients:
        c.send(_DISCONNECT)
        c.close()
    return {"clients": len(clients), "granted": granted, "refused": refused,
            "subscribe_s": round(quota_s, 3), "big_subscribe": big, "failures": failures}


# ---------------------------------------------------------------- connection flood
def _raise_nofile(want: int) -> int:
    """Raise the soft open-files limit towards ``want`` (never past the hard
    one); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want and (hard == resource.RLIM_INFINITY or soft < hard):
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft


def connection_flood(server, sz: Sizes) -> dict:
    """``flood_connections`` TCP connections (bounded by ``ulimit -n``, 512
    descriptors kept free): half send nothing, half half a CONNECT; held
    ``flood_hold_s``; then a new client's CONNACK time, and how many the
    server closed."""
    failures: list[str] = []
    soft = _raise_nofile(sz.flood_connections + 1024)
    n = max(0, min(sz.flood_connections, soft - 512))
    half_connect = RawMqtt.connect_frame("flood-half", keepalive=60)
    half_connect = half_connect[:len(half_connect) // 2]
    socks = []
    failed = 0
    deadline = time.monotonic() + sz.timeout_s
    for i in range(n):
        if time.monotonic() > deadline:
            break
        try:
            s = socket.create_connection(("127.0.0.1", server.port), timeout=3.0)
        except OSError:
            failed += 1
            continue
        if i % 2:
            try:
                s.sendall(half_connect)
            except OSError:
                pass
        socks.append(s)
    opened_at = time.monotonic()
    connack_ms = _connack_ms(server.port, "flood-probe")
    time.sleep(max(0.0, sz.flood_hold_s - (time.monotonic() - opened_at)))
    states = socket_states(socks)
    for s in socks:
        s.close()
    closed = states.count("closed")
    connack_after_ms = _connack_ms(server.port, "flood-after")
    if connack_ms is None:
        failures.append("a new client got no CONNACK within 10 s during the flood")
    if connack_after_ms is None:
        failures.append("a new client got no CONNACK within 10 s after the flood")
    return {"asked": sz.flood_connections, "nofile_soft_limit": soft, "opened": len(socks),
            "connect_failed": failed, "closed_by_server": closed,
            "connack_ms_during": connack_ms, "connack_ms_after": connack_after_ms,
            "failures": failures}


def _connack_ms(port: int, client_id: str) -> float | None:
    t0 = time.perf_counter()
    try:
        c = RawMqtt(port, timeout=10.0)
        ack = c.connect(client_id, keepalive=0)
    except OSError:
        return None
    ms = round((time.perf_counter() - t0) * 1000, 2)
    c.send(_DISCONNECT)
    c.close()
    return ms if ack and ack[0] == 0x20 and ack[3] == 0 else None
