"""SIGKILL of the edge while clients publish: after a restart every message a
client got PUBACK, PUBREC or PUBCOMP for is in the capture log, and the QoS 2
state of a persistent session is back (PUBREL answered with rel_topic, a
re-sent PUBLISH recognised as a duplicate)."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from bridge.config import load_config
from tests.edge.conftest import RawClient, wait_for
from tests.edge.util import headers_of, publish, read_log

#: both tests run on both capture logs (tests/edge/conftest.py): the edge
#: subprocess gets the test's capture settings (capture_backend)
CAPTURE_BACKENDS = ("local", "kafka")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACKS_BEFORE_KILL = 400


def start_edge(data_dir, *settings: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "edge", "--port", "0", "--set", f"data_dir={data_dir}",
         "--set", "log_level=WARNING", *(a for s in settings for a in ("--set", s))],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the edge prints one line once it listens
    m = re.search(r"mqtt://127\.0\.0\.1:(\d+)", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"no listening line: {line!r} {proc.stderr.read()}")
    return proc, int(m.group(1))


class Publisher(threading.Thread):
    """Publishes unique payloads in batches; records what was acknowledged."""

    def __init__(self, port: int, client_id: str, level: int, qos: int, full_flow: bool = False,
                 clean: bool = True) -> None:
        super().__init__(daemon=True)
        self.port, self.client_id, self.level, self.qos = port, client_id, level, qos
        self.full_flow, self.clean = full_flow, clean
        self.sent: dict[int, bytes] = {}     # packet id -> frame
        self.acked: list[int] = []           # PUBACK (QoS 1) / PUBREC (QoS 2) received
        self.completed: list[int] = []       # PUBCOMP received (full QoS 2 flow)

    def run(self) -> None:
        try:
            c = RawClient(self.port, timeout=10)
            c.connect(self.level, client_id=self.client_id, clean_start=self.clean)
            pid = 0
            while pid < 60000:
                batch, inflight = [], collections.deque()
                for _ in range(25):
                    pid += 1
                    frame = publish(self.level, topic=f"k/{self.client_id}",
                                    payload=f"{self.client_id}-{pid}".encode(), qos=self.qos,
                                    packet_id=pid)
                    self.sent[pid] = frame
                    batch.append(frame)
                    inflight.append(pid)
                c.send(b"".join(batch))
                rels = []
                for _ in range(25):
                    pkt = c.packet()
                    if not pkt:
                        return
                    self.acked.append(inflight.popleft())
                    if self.full_flow:
                        rels.append(b"\x62\x02" + pkt[2:4])
                if rels:
                    c.send(b"".join(rels))
                    for _ in rels:
                        pkt = c.packet()
                        if not pkt:
                            return
                        self.completed.append((pkt[2] << 8) | pkt[3])
        except OSError:
            return


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_message(tmp_path, capture_backend):
    data = tmp_path / "data"
    log = load_config(None, [f"data_dir={data}", *capture_backend], env={})  # read_log's
    # killA withholds every PUBREL and publishes until the kill: on a slow
    # machine it can pass the default edge.max_inflight_qos2 (1024) before the
    # others have 400 acknowledgements, and the edge rightly closes it
    # (LG-edge-qos2-quota), which is not what this test is about.
    quota = "edge.max_inflight_qos2=65535"
    proc, port = start_edge(data, quota, *capture_backend)
    try:
        pubs = [Publisher(port, "killB", 5, 1),                        # QoS 1
                Publisher(port, "killA", 4, 2, clean=False),           # QoS 2, PUBREL withheld
                Publisher(port, "killC", 4, 2, full_flow=True)]        # QoS 2 to PUBCOMP
        for p in pubs:
            p.start()
        wait_for(lambda: all(len(p.acked) >= ACKS_BEFORE_KILL for p in pubs), 60,
                 "acknowledgements before the kill")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for p in pubs:
            p.join(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    qos1, held, full = pubs
    proc, port = start_edge(data, quota, *capture_backend)  # recovers the log and the sessions
    try:
        recs = read_log(log)

        def payloads(cid: str, dup=False):
            return collections.Counter(
                r.value for r in recs if r.key == cid.encode() and r.value[0] >> 4 == 3
                and (headers_of(r).get("dup") == b"1") == dup)

        for p in pubs:
            got = payloads(p.client_id)
            missing = [pid for pid in p.acked if got[p.sent[pid]] != 1]
            assert not missing, f"{p.client_id}: {len(missing)} acknowledged messages missing"
        rels = {(r.value[2] << 8) | r.value[3]: headers_of(r) for r in recs
                if r.key == b"killC" and r.value[0] == 0x62}
        assert set(full.completed) <= set(rels)
        assert all(rels[pid]["rel_topic"] == b"k/killC" for pid in full.completed)

        # The persistent session comes back with its QoS 2 ids.
        c = RawClient(port, timeout=10)
        assert c.connect(4, client_id="killA", clean_start=False) == b"\x20\x02\x01\x00"
        unacked = [pid for pid in held.sent if pid not in set(held.acked)][:50]
        # Re-send (DUP) what got no PUBREC: those that reached the disk are
        # known and marked dup, the others are new.
        c.send(b"".join(bytes((f[0] | 8,)) + f[1:] for f in (held.sent[pid] for pid in unacked)))
        answers = [c.packet() for _ in unacked]
        assert answers == [b"\x50\x02" + pid.to_bytes(2, "big") for pid in unacked], (
            f"{len(held.sent)} sent, {len(held.acked)} acknowledged, unacked {unacked}")
        c.send(b"".join(b"\x62\x02" + pid.to_bytes(2, "big") for pid in held.acked))
        comps = [c.packet() for _ in held.acked]
        assert comps == [b"\x70\x02" + pid.to_bytes(2, "big") for pid in held.acked]
        c.send(b"\xe0\x00")
        assert c.closed()
        c.close()
        recs = wait_for(lambda: (lambda rs: rs if sum(
            1 for r in rs if r.key == b"killA" and r.value[0] == 0x62) >= len(held.acked) else None)(
            read_log(log)), 20, "PUBREL records")
        rel = {(r.value[2] << 8) | r.value[3]: headers_of(r) for r in recs
               if r.key == b"killA" and r.value[0] == 0x62}
        by_seq = {r.seq: r for r in recs}
        for pid in held.acked:
            h = rel[pid]
            assert h["rel_topic"] == b"k/killA"
            assert by_seq[int(h["rel_seq"])].value == held.sent[pid]
        # Every message of killA is in the log exactly once without a dup mark.
        plain = collections.Counter(r.value[2:] for r in recs if r.key == b"killA"
                                    and r.value[0] >> 4 == 3 and "dup" not in headers_of(r))
        for pid in list(held.acked) + unacked:
            assert plain[held.sent[pid][2:]] == 1, pid
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.subprocess
def test_sigkill_keeps_the_wills_it_owed_MQTT_3_1_2_8(tmp_path, capture_backend):
    """Wills of connections the crash cut, and a delayed Will still pending,
    are captured after the restart (a resumed session cancels its Will)."""
    import time

    from bridge.mqtt import Properties, Will

    def will(topic, delay=None, **kw):
        props = Properties(will_delay_interval=delay) if delay is not None else Properties()
        return Will(topic=topic, payload=b"offline", properties=props, **kw)

    def wills_in(recs, cid: str):
        return [r for r in recs if r.key == cid.encode() and headers_of(r).get("origin") == b"will"]

    data = tmp_path / "data"
    log = load_config(None, [f"data_dir={data}", *capture_backend], env={})  # read_log's
    proc, port = start_edge(data, *capture_backend)
    clients = []
    try:
        v311 = RawClient(port)
        assert v311.connect(4, client_id="w311", will=will("st/w311", qos=1, retain=True))[:2] == b"\x20\x02"
        v5 = RawClient(port)
        assert v5.connect(5, client_id="w5", will=will("st/w5", 3),
                          properties=Properties(session_expiry_interval=60))[2:4] == b"\x00\x00"
        gone = RawClient(port)  # lost before the crash; its 3 s Will Delay still runs at the kill
        gone.connect(5, client_id="w5gone", will=will("st/w5gone", 3),
                     properties=Properties(session_expiry_interval=60))
        back = RawClient(port)  # will come back within its delay
        back.connect(5, client_id="w5back", will=will("st/w5back", 30),
                     properties=Properties(session_expiry_interval=300))
        clients = [v311, v5, back]
        gone.close()
        wait_for(lambda: sum(1 for r in read_log(log) if r.value[0] == 0x10) == 4, 10,
                 "four durable CONNECT records")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for c in clients:
            c.close()
    assert not any(wills_in(read_log(log), c) for c in ("w311", "w5", "w5gone"))

    proc, port = start_edge(data, *capture_backend)
    restarted = time.monotonic()
    try:
        resumed = RawClient(port)
        assert resumed.connect(5, client_id="w5back", clean_start=False,
                               properties=Properties(session_expiry_interval=300))[2:4] == b"\x01\x00"
        recs = wait_for(lambda: (lambda rs: rs if wills_in(rs, "w311") else None)(
            read_log(log)), 10, "the 3.1.1 Will")
        assert time.monotonic() - restarted < 2.5 and not wills_in(recs, "w5")  # delayed: not yet
        recs = wait_for(lambda: (lambda rs: rs if wills_in(rs, "w5") and wills_in(rs, "w5gone") else None)(
            read_log(log)), 15, "the delayed Wills")
        assert time.monotonic() - restarted >= 3.0
        (w311,) = wills_in(recs, "w311")
        assert w311.value == publish(4, topic="st/w311", payload=b"offline", qos=1, packet_id=1, retain=True)
        assert len(wills_in(recs, "w5")) == len(wills_in(recs, "w5gone")) == 1
        assert not wills_in(recs, "w5back")  # resumed within its Will Delay Interval [MQTT-3.1.3-9]
        resumed.send(b"\xe0\x00")
        resumed.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert len(wills_in(read_log(log), "w311")) == 1  # once, also after a clean stop
