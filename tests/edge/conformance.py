"""Replay driver for the Mosquitto conformance vectors against a running edge.

Each vector gets its own TCP connection (``../shared/conformance/
mosquitto-vectors/README.md`` explains the format):

1. unless ``connect`` is false, a default CONNECT at the vector's ``ver``
   (client id = the vector's name, keep alive 60, clean session) and a
   success CONNACK;
2. the steps: ``send`` writes the bytes; ``recv`` reads the next MQTT packet
   and compares it with the expected bytes exactly -- except a CONNACK whose
   MQTT 5 properties come in another order: properties are unordered
   (MQTT 5.0 section 2.2.2), so a CONNACK with the same flags, reason code
   and property values matches;
3. ``expect_disconnect`` true: the edge must close the connection. A vector
   that names no reply for its last step still passes when the edge sends
   one DISCONNECT (or, for a CONNECT, one refusing CONNACK) before closing:
   MQTT 5.0 section 4.13.1 says a server SHOULD send the reason code, and
   Mosquitto does for most such vectors but not all. False: the edge must
   still answer a PINGREQ with PINGRESP.

A ``publish`` step (FLOW.json) is a second client: it connects with its own
CONNECT (the vector's level, client id = the vector's name + " helper"),
publishes ``topic``/``qos``/``payload`` and completes the QoS 1 or 2 flow
(PUBACK, or PUBREC/PUBREL/PUBCOMP, each with a success reason) before the
vector's next step; then it disconnects.

Vectors run in four batches, so that no subscriber gets a message another
vector published (vectors publish to ``p`` and ``topic`` all the time):

1. vectors that send no SUBSCRIBE, concurrently;
2. vectors that subscribe but publish nothing (no PUBLISH sent, no
   ``publish`` step), concurrently;
3. vectors that subscribe and publish (FLOW.json, PUBLISH.json ``maximum
   packet size``), and those that publish a retained message (PUBLISH.json
   ``retain 1``, then ``retain 1 zero length``, which clears it: run
   concurrently, which one wins is a race, and on a cluster the two are on
   different edges), one at a time;
4. REGRESSION.json and ZZ-broker-check.json, one at a time in file order:
   their tests build on the state the previous ones left, and the last one
   checks that the server is still up after everything else.

Between batches a barrier client publishes one QoS 1 message to a topic no
vector uses and waits for its PUBACK: the edge acknowledges a message once it
is durable, in order, so every message of the earlier batch has then been
matched against the subscriptions of its time, and a later subscriber cannot
get it.

Within a concurrent batch at most one vector runs at a time per client id
(the edge would take a session over). ``run_vectors`` returns one
:class:`Outcome` per vector, in the order given.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from bridge.mqtt import Connack, Connect, Disconnect, PubRel, Publish, encode
from bridge.mqtt.codec import decode_packet

__all__ = ["FILES", "SEQUENTIAL_FILES", "VECTORS", "HelperPublish", "Outcome", "Vector",
           "listed_differences", "load_vectors", "run_vectors"]

VECTORS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "mosquitto-vectors"
#: Every vector file of the directory (test_conformance checks none is missing).
FILES = ["CONNECT", "CONNACK", "DISCONNECT", "PINGREQ", "PINGRESP", "PUBLISH", "PUBACK", "PUBREC",
         "PUBREL", "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "AUTH", "FORBIDDEN",
         "FLOW", "REGRESSION", "ZZ-broker-check"]
#: Files whose tests run one at a time, in file order, after all others.
SEQUENTIAL_FILES = ("REGRESSION.json", "ZZ-broker-check.json")
STEP_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class HelperPublish:
    """A ``publish`` step: a second client publishes this message."""

    topic: str
    qos: int
    payload: bytes


@dataclass(frozen=True)
class Vector:
    file: str
    group: str
    name: str
    ver: int
    connect: bool
    expect_disconnect: bool
    msgs: tuple

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.group, self.name)


@dataclass
class Outcome:
    """``got``: when a ``recv`` step failed, the packet the edge sent instead
    (b"" when it closed)."""

    vector: Vector
    passed: bool
    detail: str = ""
    got: bytes | None = None


def _group_level(group: str) -> int:
    for prefix, level in (("v3.1.1", 4), ("v3.1", 3), ("v5.0", 5)):
        if group.startswith(prefix):
            return level
    return 4


def _step(m: dict) -> tuple[str, bytes | HelperPublish]:
    if m["type"] == "publish":
        return ("publish", HelperPublish(m["topic"], int(m["qos"]), m["payload"].encode()))
    return (m["type"], bytes.fromhex("".join(m.get("payload", "").split())))


def load_vectors(files=FILES) -> list[Vector]:
    out = []
    for stem in files:
        for group in json.loads((VECTORS / f"{stem}.json").read_text()):
            gname = " ".join(group["group"].split())
            for t in group["tests"]:
                msgs = tuple(_step(m) for m in t["msgs"])
                out.append(Vector(f"{stem}.json", gname, t["name"],
                                  t.get("ver", _group_level(gname)), t.get("connect", True),
                                  t.get("expect_disconnect", True), msgs))
    return out


def listed_differences(doc: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(file, group, vector) -> (what the edge sends, hex; reason), from the
    table rows of ``docs/conformance.md``:
    ``| FILE.json | group | `vector name` | `hex` | reason |``."""
    rows: dict[tuple[str, str, str], tuple[str, str]] = {}
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].endswith(".json"):
            continue
        file, group, name, sends, reason = cells
        rows[(file, group, name.strip("`"))] = (sends.strip("`"), reason)
    return rows



async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a replay connection; a peer that is already gone is fine."""
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass

async def _read_packet(reader: asyncio.StreamReader) -> bytes:
    """One MQTT packet (fixed header + body); b"" at EOF."""
    first = await reader.read(1)
    if not first:
        return b""
    head = bytearray(first)
    length = shift = 0
    for _ in range(4):
        b = await reader.readexactly(1)
        head += b
        length |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            break
    return bytes(head) + await reader.readexactly(length)


def _same(expected: bytes, got: bytes, level: int) -> bool:
    if expected == got:
        return True
    if expected[:1] != b"\x20" or got[:1] != b"\x20" or level != 5:
        return False
    try:
        a, _ = decode_packet(expected, 5, from_client=False)
        b, _ = decode_packet(got, 5, from_client=False)
    except Exception:  # MqttError, IncompleteData: not a matching CONNACK
        return False
    return isinstance(a, Connack) and a == b


async def _expect_close(reader: asyncio.StreamReader, v: Vector, level: int) -> str:
    """'' when the edge closes (after at most one DISCONNECT or refusing
    CONNACK); otherwise what it did instead."""
    extra = []
    while True:
        try:
            pkt = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            return f"still open after {STEP_TIMEOUT_S:g} s" + (
                f" (sent {b''.join(extra).hex()})" if extra else "")
        except (ConnectionError, asyncio.IncompleteReadError):
            pkt = b""
        if not pkt:
            break
        extra.append(pkt)
    if not extra:
        return ""
    if len(extra) == 1:
        pkt = extra[0]
        if pkt[0] == 0xE0 and level == 5:
            return ""
        if pkt[0] == 0x20 and not v.connect and len(pkt) >= 4 and pkt[3] != 0:
            return ""
    return "sent " + " ".join(p.hex() for p in extra) + " before closing"


async def _run_one(host: str, port: int, v: Vector, helper_port: int | None = None) -> Outcome:
    level = v.ver
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return Outcome(v, False, f"cannot connect: {exc}")
    try:
        if v.connect:
            writer.write(encode(Connect.for_level(level, client_id=v.name, keepalive=60), level))
            connack = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
            if connack[:1] != b"\x20" or len(connack) < 4 or connack[3] != 0:
                return Outcome(v, False, f"default CONNECT refused: {connack.hex()}")
        for i, (kind, payload) in enumerate(v.msgs):
            if kind == "publish":
                problem = await _helper_publish(host, helper_port or port, v, payload)
                if problem:
                    return Outcome(v, False, f"step {i}: helper publish: {problem}")
                continue
            if kind == "send":
                writer.write(payload)
                await writer.drain()
                if payload[:1] == b"\x10" and not v.connect:
                    level = _connect_level(payload, level)
                continue
            try:
                got = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
            except asyncio.TimeoutError:
                return Outcome(v, False, f"step {i}: expected {payload.hex()}, got nothing "
                                         f"in {STEP_TIMEOUT_S:g} s")
            except (ConnectionError, asyncio.IncompleteReadError):
                got = b""
            if not _same(payload, got, level):
                shown = got.hex() if got else "connection closed"
                return Outcome(v, False, f"step {i}: expected {payload.hex()}, got {shown}", got)
        if v.expect_disconnect:
            problem = await _expect_close(reader, v, level)
            return Outcome(v, not problem, problem)
        writer.write(b"\xc0\x00")
        await writer.drain()
        try:
            got = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            return Outcome(v, False, "no PINGRESP (still open but silent)")
        except (ConnectionError, asyncio.IncompleteReadError):
            got = b""
        if got != b"\xd0\x00":
            return Outcome(v, False, "expected to stay connected; "
                                     + (f"got {got.hex()} for PINGREQ" if got else "closed"))
        return Outcome(v, True)
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        return Outcome(v, False, f"connection error: {type(exc).__name__}")
    finally:
        await _close(writer)


async def _helper_publish(host: str, port: int, v: Vector, msg: HelperPublish) -> str:
    """Publish ``msg`` from a second client and complete its flow; '' when
    done, otherwise what went wrong."""
    level = v.ver
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return f"cannot connect: {exc}"

    async def expect(kind: int, what: str) -> str:
        try:
            pkt = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            return f"no {what} in {STEP_TIMEOUT_S:g} s"
        except (ConnectionError, asyncio.IncompleteReadError):
            pkt = b""
        if pkt[:1] != bytes((kind,)) or pkt[2:4] != b"\x00\x01" or (
                len(pkt) > 4 and pkt[4] >= 0x80):
            return f"expected a successful {what} for packet id 1, got {pkt.hex() or 'a close'}"
        return ""

    try:
        writer.write(encode(Connect.for_level(level, client_id=f"{v.name} helper",
                                              keepalive=60), level))
        connack = await asyncio.wait_for(_read_packet(reader), STEP_TIMEOUT_S)
        if connack[:1] != b"\x20" or len(connack) < 4 or connack[3] != 0:
            return f"CONNECT refused: {connack.hex()}"
        writer.write(encode(Publish(qos=msg.qos, topic=msg.topic,
                                    packet_id=1 if msg.qos else None, payload=msg.payload),
                            level))
        await writer.drain()
        if msg.qos == 1:
            problem = await expect(0x40, "PUBACK")
        elif msg.qos == 2:
            problem = await expect(0x50, "PUBREC")
            if not problem:
                writer.write(encode(PubRel(packet_id=1), level))
                problem = await expect(0x70, "PUBCOMP")
        else:
            problem = ""
        writer.write(encode(Disconnect(), level))
        await writer.drain()
        return problem
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
        return f"connection error: {type(exc).__name__}"
    finally:
        await _close(writer)


def _client_id(v: Vector) -> str:
    """The client id the vector connects with (its own CONNECT's, when it
    sends one; "" when that does not decode: those run one at a time)."""
    if v.connect:
        return v.name
    for kind, payload in v.msgs:
        if kind == "send":
            try:
                p, _ = decode_packet(payload, None)
            except Exception:
                return ""
            return p.client_id if isinstance(p, Connect) else ""
    return ""


def _connect_level(frame: bytes, default: int) -> int:
    try:
        p, _ = decode_packet(frame, None)
    except Exception:
        return default
    return p.protocol_level if isinstance(p, Connect) else default


BARRIER = Vector("", "", "conformance barrier", 4, True, False, ())
BARRIER_MESSAGE = HelperPublish("conformance/barrier", 1, b"")


def _batch(v: Vector) -> int:
    """The batch (1-4, see the module docstring) ``v`` runs in."""
    if v.file in SEQUENTIAL_FILES:
        return 4
    sends = [p for kind, p in v.msgs if kind == "send"]
    if any(p[:1] and p[0] >> 4 == 3 and p[0] & 1 for p in sends):
        return 3  # a retained publish: in file order, so the one that clears the topic comes last
    if not any(p[:1] == b"\x82" for p in sends):
        return 1
    publishes = any(kind == "publish" for kind, _ in v.msgs) or any(
        p[:1] and p[0] >> 4 == 3 for p in sends)
    return 3 if publishes else 2


async def run_vectors(host: str, port: int, vectors: list[Vector], concurrency: int = 64,
                      ports: list[int] | None = None) -> list[Outcome]:
    """Replay ``vectors`` against the server at host:port; ``ports``: two
    edges of a cluster, the connections alternating between them (vector i
    on ``ports[i % 2]``, its helper publisher on the other)."""
    gate = asyncio.Semaphore(concurrency)
    ids: dict[str, asyncio.Lock] = {}
    where = {id(v): (ports[i % 2], ports[(i + 1) % 2]) if ports else (port, None)
             for i, v in enumerate(vectors)}

    async def one(v: Vector) -> Outcome:
        lock = ids.setdefault(_client_id(v), asyncio.Lock())
        async with lock, gate:
            return await _run_one(host, where[id(v)][0], v, where[id(v)][1])

    done: dict[int, Outcome] = {}
    for batch in (1, 2, 3, 4):
        if batch > 1:
            problem = await _helper_publish(host, port, BARRIER, BARRIER_MESSAGE)
            if problem:
                raise RuntimeError(f"barrier before batch {batch}: {problem}")
        todo = [(i, v) for i, v in enumerate(vectors) if _batch(v) == batch]
        if batch in (1, 2):
            results = await asyncio.gather(*(one(v) for _, v in todo))
        else:
            results = [await _run_one(host, where[id(v)][0], v, where[id(v)][1]) for _, v in todo]
        done.update((i, o) for (i, _), o in zip(todo, results))
    return [done[i] for i in range(len(vectors))]
