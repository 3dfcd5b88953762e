"""The session scenarios of ``lakegate bench hostile`` (see
:mod:`bridge.bench.hostile_scenarios` for the contract): session churn,
SIGKILL with in-flight QoS 1/2, the SUBSCRIBE/UNSUBSCRIBE fuzz."""

from __future__ import annotations

import random
import re
import struct
import threading
import time

from bridge.bench.hostile_good import RawMqtt, ack_codes, read_publish, varint
from bridge.bench.hostile_scenarios import Publisher, Sizes

__all__ = ["fuzz", "session_churn", "sigkill"]

_SEQ = struct.Struct(">QQ")   # (session or 0, seq)
_DISCONNECT = b"\xe0\x00"


def _ack_for(pkt: bytes) -> bytes | None:
    """What a well-behaved receiver answers to ``pkt`` (PUBACK, PUBREC,
    PUBCOMP), or None."""
    kind = pkt[0] >> 4
    if kind == 3 and pkt[0] & 0x06:
        qos, pid = read_publish(pkt)[:2]
        return (b"\x40\x02" if qos == 1 else b"\x50\x02") + pid.to_bytes(2, "big")
    if kind == 6:  # PUBREL
        return b"\x70\x02" + pkt[2:4]
    return None


class _Inbox:
    """What one persistent subscriber received: distinct (session, seq),
    duplicates with and without DUP 1."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.per: dict[int, int] = {}  # session -> distinct messages
        self.dups = self.dups_without_flag = 0
        self.lock = threading.Lock()

    def add(self, pkt: bytes) -> tuple[int, int]:
        _qos, _pid, dup, _topic, payload = read_publish(pkt)
        key = _SEQ.unpack_from(payload)
        with self.lock:
            if key in self.seen:
                self.dups += 1
                self.dups_without_flag += not dup
            else:
                self.seen.add(key)
                self.per[key[0]] = self.per.get(key[0], 0) + 1
        return key

    def count(self, session: int) -> int:
        with self.lock:
            return self.per.get(session, 0)


# ---------------------------------------------------------------- session churn
def session_churn(server, sz: Sizes) -> dict:
    """``churn_sessions`` persistent sessions (Clean Session 0), each
    subscribed to ``churn/<i>`` at QoS 1, connect and disconnect in a loop
    from ``churn_concurrency`` threads for ``churn_seconds`` (each connection
    reads and acknowledges for 0-20 ms), while a publisher sends
    ``churn_messages`` QoS 1 messages to each session's topic. Then each
    session connects once more and drains: every message the publisher got
    a PUBACK for must arrive (a repeat only with DUP 1)."""
    failures: list[str] = []
    n = sz.churn_sessions
    inbox = _Inbox()
    errors = {"connack": 0, "subscribe": 0}
    for i in range(n):  # the sessions and their subscriptions
        c = RawMqtt(server.port, timeout=10.0)
        ack = c.connect(f"churn-{i}", clean=False, keepalive=0)
        if not ack or ack[0] != 0x20 or ack[3] != 0:
            errors["connack"] += 1
        elif not (lambda a: a and a[0] == 0x90 and a[-1] < 0x80)(c.subscribe(1, [(f"churn/{i}", 1)])):
            errors["subscribe"] += 1
        c.send(_DISCONNECT)
        c.close()
    cycles = [0] * sz.churn_concurrency
    stop = threading.Event()

    def churn(t: int) -> None:
        rng = random.Random(t)
        mine = list(range(t, n, sz.churn_concurrency))
        k = 0
        while not stop.is_set() and mine and cycles[t] < 100_000:
            i = mine[k % len(mine)]
            k += 1
            _visit(server.port, i, inbox, errors, dwell=rng.random() * 0.02)
            cycles[t] += 1

    threads = [threading.Thread(target=churn, args=(t,), daemon=True)
               for t in range(sz.churn_concurrency)]
    for th in threads:
        th.start()
    pub = Publisher(server.port, "churn-pub", window=200)
    total = n * sz.churn_messages
    msgs = (((k % n, k), f"churn/{k % n}".encode(), _SEQ.pack(k % n, k), 1, False)
            for k in range(total))
    stats = pub.run(msgs, rate=total / max(sz.churn_seconds * 0.8, 0.1), seconds=sz.churn_seconds)
    pub.close()
    time.sleep(max(0.0, sz.churn_seconds - stats["seconds"]))
    stop.set()
    for th in threads:
        th.join(30.0)
    acked = set(pub.acked)
    expected: dict[int, int] = {}
    for i, _k in acked:
        expected[i] = expected.get(i, 0) + 1
    # the last visit of each session, until it holds all its messages
    deadline = time.monotonic() + sz.timeout_s
    for i in range(n):
        if time.monotonic() > deadline:
            break
        if inbox.count(i) < expected.get(i, 0):
            _visit(server.port, i, inbox, errors, dwell=0.5, until=expected.get(i, 0))
    missing = len(acked - inbox.seen)
    if missing:
        failures.append(f"{missing} of {len(acked)} acknowledged QoS 1 messages never "
                        f"reached their persistent session")
    if inbox.dups_without_flag:
        failures.append(f"{inbox.dups_without_flag} repeated deliveries without DUP 1 [MQTT-3.3.1-1]")
    if errors["connack"] or errors["subscribe"]:
        failures.append(f"churn: {errors['connack']} CONNECTs and {errors['subscribe']} SUBSCRIBEs "
                        f"not accepted")
    return {"sessions": n, "cycles": sum(cycles), "published": stats["sent"],
            "acked": stats["acked"], "delivered": len(inbox.seen), "missing": missing,
            "duplicates": inbox.dups, "duplicates_without_dup": inbox.dups_without_flag,
            "errors": errors, "failures": failures}


def _visit(port: int, i: int, inbox: _Inbox, errors: dict, dwell: float, until: int = 0) -> None:
    """One connection of session ``i``: read and acknowledge for ``dwell``
    s (or, with ``until``, until the session holds that many, with
    ``dwell`` s of silence ending it), then DISCONNECT."""
    try:
        c = RawMqtt(port, timeout=10.0)
    except OSError:
        errors["connack"] += 1
        return
    ack = c.connect(f"churn-{i}", clean=False, keepalive=0)
    if not ack or ack[0] != 0x20 or ack[3] != 0:
        errors["connack"] += 1
        c.close()
        return
    end = time.monotonic() + (dwell if not until else 60.0)
    while time.monotonic() < end:
        if until and inbox.count(i) >= until:
            break
        pkt = c.packet(timeout=max(0.001, min(dwell, end - time.monotonic())))
        if not pkt:
            if until and pkt is None:
                break  # silence: nothing more is coming
            if pkt == b"":
                break
            continue
        if pkt[0] >> 4 == 3:
            inbox.add(pkt)
        reply = _ack_for(pkt)
        if reply:
            c.send(reply)
    c.send(_DISCONNECT)
    c.close()


# ---------------------------------------------------------------- SIGKILL
_DROP_LINE = re.compile(r"client=(\S+): (\d+) queued messages dropped")


def logged_drops(text: str, client_id: str) -> int:
    """Queued messages the server's log says it dropped for ``client_id``
    (the edge's warning lines): the recovery's count when there is one
    (recovery drops again what the dead process had dropped), plus what
    was dropped after it."""
    total = 0
    for line in text.splitlines():
        m = _DROP_LINE.search(line)
        if m is None or m.group(1) != client_id:
            continue
        if "edge session recovery" in line:
            total = 0  # what was logged before the kill is counted again by the recovery
        total += int(m.group(2))
    return total


def sigkill(server, sz: Sizes) -> dict:
    """A persistent subscriber (Clean Session 0) to ``kill/#`` at QoS 2
    reads ``kill_inflight`` PUBLISHes and acknowledges none; a publisher
    sends ``kill_inflight + kill_queued`` messages, QoS 1 and 2 in turn,
    each acknowledged (PUBACK / PUBCOMP); ``kill -9`` of the server; a
    restart on the same port and data; the subscriber comes back and
    acknowledges everything. Counted: the in-flight ones that came back
    with DUP 1, what is missing, what the server's log accounts for
    (queue-bound drops). Mosquitto (persistence on, autosave every second)
    gets 2.5 s before the kill to save."""
    failures: list[str] = []
    level = 4
    sub = RawMqtt(server.port, timeout=10.0)
    ack = sub.connect("kill-sub", level=level, clean=False, keepalive=0)
    if not ack or ack[0] != 0x20 or not sub.subscribe(1, [("kill/#", 2)]):
        raise ConnectionError(f"the SIGKILL subscriber was refused: {ack!r:.40}")
    pub = Publisher(server.port, "kill-pub", window=100)
    total = sz.kill_inflight + sz.kill_queued
    msgs = ((k, b"kill/%d" % (k % 10), _SEQ.pack(0, k), 1 + k % 2, False) for k in range(total))
    stats = pub.run(msgs, drain_s=sz.timeout_s)
    pub.close()
    acked = set(pub.acked)
    first: dict[int, int] = {}  # seq -> packet id of the deliveries left in flight
    deadline = time.monotonic() + 5.0
    while len(first) < sz.kill_inflight and time.monotonic() < deadline:
        pkt = sub.packet(timeout=max(0.01, deadline - time.monotonic()))
        if not pkt:
            break
        if pkt[0] >> 4 == 3:
            _q, pid, _d, _t, payload = read_publish(pkt)
            first[_SEQ.unpack_from(payload)[1]] = pid
    if server.name == "mosquitto":
        time.sleep(2.5)  # its autosave_interval is 1 s: what it acknowledged is on disk now
    t0 = time.monotonic()
    server.kill()
    sub.close()
    server.restart()
    restart_s = round(time.monotonic() - t0, 3)
    inbox = _Inbox()
    again_dup = again_no_dup = 0
    back: set[int] = set()
    sub = RawMqtt(server.port, timeout=10.0)
    ack = sub.connect("kill-sub", level=level, clean=False, keepalive=0)
    present = bool(ack) and ack[0] == 0x20 and bool(ack[2] & 1)
    deadline = time.monotonic() + sz.timeout_s
    while len(inbox.seen) < len(acked) and time.monotonic() < deadline:
        pkt = sub.packet(timeout=3.0)
        if not pkt:
            break
        if pkt[0] >> 4 == 3:
            key = inbox.add(pkt)
            if key[1] in first and key[1] not in back:
                back.add(key[1])
                if pkt[0] & 0x08:
                    again_dup += 1
                else:
                    again_no_dup += 1
        reply = _ack_for(pkt)
        if reply:
            sub.send(reply)
    sub.send(_DISCONNECT)
    sub.close()
    time.sleep(1.0)  # the good client, back too, measured after the restart
    got = {k for _, k in inbox.seen}
    missing = len(acked - got)
    inflight_missing = len(set(first) - got)
    drops = logged_drops(server.log_text(), "kill-sub") if server.name in ("edge", "run") else None
    unexplained = max(0, missing - (drops or 0))
    if not present:
        failures.append("the subscriber's session was not present after the restart")
    if inflight_missing:
        failures.append(f"{inflight_missing} of {len(first)} deliveries in flight at the SIGKILL "
                        f"never came back [MQTT-4.4.0-1]")
    if again_no_dup:
        failures.append(f"{again_no_dup} in-flight deliveries came back without DUP 1 [MQTT-3.3.1-1]")
    if unexplained:
        failures.append(f"{unexplained} of {len(acked)} acknowledged messages lost with no logged "
                        f"cause ({missing} missing, {drops or 0} logged as dropped)")
    if stats["unacked"]:
        failures.append(f"{stats['unacked']} PUBLISHes unacknowledged before the kill")
    return {"published": stats["sent"], "acked": len(acked), "in_flight_at_kill": len(first),
            "in_flight_back_dup": again_dup, "in_flight_back_without_dup": again_no_dup,
            "in_flight_missing": inflight_missing, "session_present": present,
            "received": len(got), "missing": missing, "logged_drops": drops,
            "unexplained": unexplained, "restart_s": restart_s,
            "duplicates_without_dup": inbox.dups_without_flag, "failures": failures}


# ---------------------------------------------------------------- fuzz
#: levels of well-formed filters (a "#" only last, "+" alone in its level)
_LEVELS = ["a", "b", "c", "+", "", "é", "日本", "x" * 40, "$SYS", "g", " "]
#: what a hostile filter may hold, anywhere
_PIECES = ["a", "+", "#", "", "$share", "$", "\u0000", "\ufeff", "a+", "+a", "a#", "#a", "//", "\t"]
_SPECIAL = ["$share/g", "$share/", "$share//a", "$share/g/", "$share/g/#", "$share/+/a", "$share/g+/a",
            "$share/#/a", "$share", "#/a", "a/#/b", "", "/", "//", "+", "#", "+/+/#", "$SYS/#",
            "\uffff", "\ud7ff", "a\u0000b", "$share/g/$share/h/a"]


def _fuzz_filter(rng: random.Random, hostile: bool, level: int) -> bytes:
    if not hostile:
        if level < 5 and rng.random() < 0.05:  # no Shared Subscriptions before 5: plain filters
            return rng.choice(("$share/g", "$share/", "$share//", "$share")).encode()
        levels = [rng.choice(_LEVELS) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.2:
            levels.append("#")
        text = "/".join(levels) or "a"  # never empty [MQTT-4.7.3-1]
        return (f"$share/g{rng.randrange(3)}/{text}" if rng.random() < 0.1 else text).encode()
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(_SPECIAL).encode("utf-8", "surrogatepass")
    if kind < 0.75:
        return "/".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 6))).encode()
    if kind < 0.9:
        return "/".join(["d"] * rng.randint(50, 400)).encode()  # deep: near and past level bounds
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))  # perhaps not UTF-8


def _fuzz_packet(rng: random.Random, level: int) -> tuple[bytes, int, int, bool, bool]:
    """(frame, packet id, filters, subscribe?, well formed?) -- 70 % well
    formed (filters, options, properties: a server must answer them), 30 %
    with one thing anywhere between dubious and invalid (a filter, an
    option byte, a property, the packet id, the fixed header's flags, no
    filter at all: answered or closed)."""
    subscribe = rng.random() < 0.6
    hostile = rng.random() < 0.3
    what = rng.randrange(6) if hostile else -1
    pid = 0 if what == 0 else rng.randrange(1, 65536)
    n = 0 if what == 1 else rng.choice((1, 1, 1, 2, 3, 5))
    bad = rng.randrange(n) if what == 2 and n else -1
    filters = [_fuzz_filter(rng, i == bad, level) for i in range(n)]
    body = bytearray(pid.to_bytes(2, "big"))
    if level == 5:
        props = b""
        if what == 3:
            props = rng.choice((b"\x0b\x00", b"\x0b\x4d\x0b\x01", b"\x26\x00\x01k\x00\x01v",
                                bytes((rng.randrange(256),)), b"\x0b\xff\xff\xff\x7f"))
        elif rng.random() < 0.3 and subscribe:
            props = b"\x0b" + varint(rng.choice((1, 77, 268_435_455)))
        body += varint(len(props)) + props
    for i, f in enumerate(filters):
        body += len(f).to_bytes(2, "big") + f
        if subscribe:
            opts = rng.randrange(3)
            if level == 5:  # No Local only off a shared subscription [MQTT-3.8.3-4]
                opts |= (0 if f.startswith(b"$share/") else rng.randrange(2)) << 2
                opts |= rng.randrange(2) << 3 | rng.randrange(3) << 4
            if what == 4 and i == 0:
                opts = rng.randrange(256)
            body.append(opts)
    flags = rng.randrange(16) if what == 5 else 0x02
    head = (0x80 if subscribe else 0xA0) | flags
    return bytes((head,)) + varint(len(body)) + bytes(body), pid, len(filters), subscribe, not hostile


def fuzz(server, sz: Sizes) -> dict:
    """``fuzz_packets`` SUBSCRIBE/UNSUBSCRIBE packets (seeded, ``fuzz_seed``)
    on MQTT 3.1, 3.1.1 and 5 in turn, one at a time: each must be answered
    by a SUBACK/UNSUBACK with its Packet Identifier (and, for SUBACK, one
    return code a filter) or the connection closed -- a well-formed one
    answered; a packet with neither within 5 s, or the server's death, is
    a failure."""
    rng = random.Random(sz.fuzz_seed)
    conns: dict[int, RawMqtt | None] = {3: None, 4: None, 5: None}
    counts = {"answered": 0, "closed": 0, "closed_on_well_formed": 0, "unanswered": 0,
              "bad_answers": 0, "reconnects": 0}
    failures: list[str] = []
    died = False
    deadline = time.monotonic() + sz.timeout_s * 4
    for k in range(sz.fuzz_packets):
        if time.monotonic() > deadline:
            failures.append(f"the fuzz ran out of time after {k} packets")
            break
        level = (3, 4, 5)[k % 3]
        c = conns[level]
        if c is None or c.closed:
            if c is not None:
                c.close()
            c = _fuzz_connect(server.port, level, counts)
            if c is None:
                died = not server.alive()
                failures.append("the server " + ("died" if died else "refused a fuzz connection"))
                break
            conns[level] = c
        frame, pid, n, subscribe, well_formed = _fuzz_packet(rng, level)
        c.send(frame)
        want = 0x90 if subscribe else 0xB0
        while True:
            pkt = c.packet(timeout=5.0)
            if pkt is None:
                counts["unanswered"] += 1
                c.close()
                c.closed = True
                break
            if pkt == b"" or pkt[0] == 0xE0:  # closed (or DISCONNECT, then closed)
                counts["closed"] += 1
                counts["closed_on_well_formed"] += well_formed
                c.close()
                c.closed = True
                break
            if pkt[0] == want and int.from_bytes(pkt[2:4], "big") == pid:
                codes = ack_codes(pkt, level)
                if subscribe and len(codes) != n or (not subscribe and level == 5 and len(codes) != n):
                    counts["bad_answers"] += 1
                counts["answered"] += 1
                break
            # anything else (a retained PUBLISH for a granted filter): acknowledge, read on
            reply = _ack_for(pkt)
            if reply:
                c.send(reply)
    for c in conns.values():
        if c is not None:
            c.close()
    died = died or not server.alive()
    if died:
        failures.append("the server process died during the fuzz")
    if counts["unanswered"]:
        failures.append(f"{counts['unanswered']} fuzzed packets neither answered nor closed in 5 s")
    if counts["closed_on_well_formed"]:
        failures.append(f"{counts['closed_on_well_formed']} well-formed packets closed the connection "
                        f"instead of an answer [MQTT-3.8.4-1, MQTT-3.10.4-4]")
    if counts["bad_answers"]:
        failures.append(f"{counts['bad_answers']} answers with the wrong number of return codes")
    return {"packets": sz.fuzz_packets, **counts, "server_died": died, "failures": failures}


def _fuzz_connect(port: int, level: int, counts: dict) -> RawMqtt | None:
    try:
        c = RawMqtt(port, timeout=5.0)
    except OSError:
        return None
    ack = c.connect(f"fuzz-{level}", level=level, keepalive=0)
    if not ack or ack[0] != 0x20:
        c.close()
        return None
    counts["reconnects"] += 1
    return c
