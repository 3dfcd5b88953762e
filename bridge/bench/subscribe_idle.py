"""The other load of ``lakegate bench subscribe``: idle persistent sessions
(Clean Session 0), each with one SUBSCRIBE of ``subscriptions`` filters, made
and left; the server's memory with them is what the bench measures. MQTT
3.1.1 and the project's own codec, as :mod:`bridge.bench.subload`'s fan-out
runs. Every wait is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import time

from bridge.bench.subload import LEVEL
from bridge.mqtt import (
    Connack, Connect, Disconnect, IncompleteData, Suback, Subscribe, Subscription, decode_packet,
    encode,
)

__all__ = ["idle_sessions"]

_DISCONNECT = encode(Disconnect(), LEVEL)


async def idle_sessions(host: str, port: int, *, sessions: int, subscriptions: int,
                        prefix: str = "idle", concurrency: int = 50,
                        timeout: float = 60.0) -> dict:
    """Create ``sessions`` persistent sessions (MQTT 3.1.1, Clean Session 0,
    client id ``<prefix>-<k>``), each with one SUBSCRIBE of ``subscriptions``
    QoS 1 filters ``<prefix>/<k>/cmd/<j>``, then DISCONNECT. At most
    ``concurrency`` at a time; the whole call is bounded by ``timeout``.
    Returns ``sessions`` (created and acknowledged), ``refused``,
    ``errors`` (first few messages), ``seconds``."""
    done = 0
    refused = 0
    errors: list[str] = []
    next_k = 0
    t0 = time.perf_counter()

    async def one(k: int) -> None:
        nonlocal done, refused
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(encode(Connect.for_level(LEVEL, client_id=f"{prefix}-{k}", keepalive=60,
                                                  clean_start=False), LEVEL))
            ack = await _read_packet(reader)
            if not isinstance(ack, Connack) or ack.reason_code != 0:
                refused += 1
                return
            writer.write(encode(Subscribe(packet_id=1, subscriptions=[
                Subscription(f"{prefix}/{k}/cmd/{j}", qos=1) for j in range(subscriptions)]),
                LEVEL))
            ack = await _read_packet(reader)
            if not isinstance(ack, Suback) or any(c >= 0x80 for c in ack.reason_codes):
                refused += 1
                if len(errors) < 5:
                    errors.append(f"{prefix}-{k}: SUBSCRIBE answered with {ack!r}")
                return
            writer.write(_DISCONNECT)
            await writer.drain()
            await asyncio.wait_for(reader.read(), 10)  # the server closes after DISCONNECT
            done += 1
        finally:
            writer.close()

    async def worker() -> None:
        nonlocal next_k
        while next_k < sessions:
            k = next_k
            next_k += 1
            try:
                await one(k)
            except (OSError, ValueError, asyncio.TimeoutError) as exc:
                if len(errors) < 5:
                    errors.append(f"{prefix}-{k}: {type(exc).__name__}: {exc}")

    try:
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(min(concurrency,
                                                                              sessions)))),
                               timeout)
    except asyncio.TimeoutError:
        errors.append(f"timed out after {timeout:g} s")
    return {"sessions": done, "refused": refused, "errors": errors,
            "seconds": round(time.perf_counter() - t0, 3)}


async def _read_packet(reader: asyncio.StreamReader):
    """One server-to-client packet, decoded by the codec."""
    buf = b""
    while True:
        try:
            packet, used = decode_packet(buf, LEVEL, from_client=False)
            return packet
        except IncompleteData as inc:
            need = (inc.needed or len(buf) + 1) - len(buf)
            chunk = await reader.read(max(need, 1))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk

