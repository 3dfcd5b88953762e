"""Password-check admission (issue 21 item 4): the AuthQueue alone, then the
edge over real sockets under a burst of wrong-password CONNECTs."""

from __future__ import annotations

import socket
import threading

import pytest

from bridge.edge.admission import AuthQueue
from bridge.edge.auth import PasswordFile, hash_password, write_password_file
from tests.edge.conftest import RawClient, wait_for
from tests.edge.util import connect

BUSY_V3 = b"\x20\x02\x00\x03"
BUSY_V5 = b"\x20\x03\x00\x89\x00"
BAD_V3 = b"\x20\x02\x00\x04"


class _Loop:
    """Runs the queue's callbacks in the test thread, like the event loop would."""

    def __init__(self) -> None:
        self.calls: list = []
        self.lock = threading.Lock()

    def call_soon_threadsafe(self, fn, *args) -> None:
        with self.lock:
            self.calls.append((fn, args))

    def run(self) -> int:
        with self.lock:
            calls, self.calls = self.calls, []
        for fn, args in calls:
            fn(*args)
        return len(calls)


def _queue(loop, *, workers=2, max_pending=8, per_address=4, backoff=10.0, clock=None):
    kw = {} if clock is None else {"clock": clock}
    return AuthQueue(workers, max_pending, per_address, backoff, loop.call_soon_threadsafe, **kw)


def test_lg_edge_auth_busy_queue_full_refuses_at_once():
    loop = _Loop()
    gate = threading.Event()
    q = _queue(loop, workers=1, max_pending=2, per_address=100)
    done = []
    try:
        for i in range(3):  # one runs, two wait
            assert q.submit(f"10.0.0.{i}", gate.wait, lambda: True, done.append) is None
        why = q.submit("10.0.0.9", gate.wait, lambda: True, done.append)
        assert why is not None and "edge.auth_max_pending = 2" in why
    finally:
        gate.set()
        wait_for(lambda: loop.run() or len(done) == 3, 10, "three checks")
        q.close()


def test_lg_edge_auth_busy_per_address_limit():
    loop = _Loop()
    gate = threading.Event()
    q = _queue(loop, workers=1, max_pending=100, per_address=2)
    try:
        assert q.submit("10.0.0.1", gate.wait, lambda: True, lambda f: None) is None
        assert q.submit("10.0.0.1", gate.wait, lambda: True, lambda f: None) is None
        why = q.submit("10.0.0.1", gate.wait, lambda: True, lambda f: None)
        assert why is not None and "edge.auth_max_pending_per_address = 2" in why
        assert q.submit("10.0.0.2", gate.wait, lambda: True, lambda f: None) is None
    finally:
        gate.set()
        q.close()


def test_closed_connection_is_not_checked():
    loop = _Loop()
    gate = threading.Event()
    q = _queue(loop, workers=1, max_pending=100, per_address=100)
    ran = []
    done = []
    alive = {"a": True, "b": True}
    try:
        q.submit("10.0.0.1", lambda: gate.wait() and ran.append("a"), lambda: alive["a"],
                 done.append)
        q.submit("10.0.0.2", lambda: ran.append("b"), lambda: alive["b"], done.append)
        alive["b"] = False  # the client hung up while waiting
        gate.set()
        wait_for(lambda: loop.run() or len(done) == 2, 10, "both done")
        assert ran == ["a"] and done[1] is None
        assert q.stats["skipped"] == 1 and q.stats["checked"] == 1
    finally:
        gate.set()
        q.close()


def test_suspect_address_leaves_a_worker_for_others():
    loop = _Loop()
    gate = threading.Event()
    started = []
    now = [100.0]
    q = _queue(loop, workers=2, max_pending=100, per_address=100, backoff=1.0,
               clock=lambda: now[0])
    q.failed("10.0.0.66")
    now[0] += 1.5  # past the back-off, still on record
    assert q.suspect("10.0.0.66") and not q.suspect("10.0.0.1")
    try:
        for i in range(3):
            q.submit("10.0.0.66", lambda i=i: started.append(f"bad{i}") or gate.wait(),
                     lambda: True, lambda f: None)
        wait_for(lambda: started, 10, "first suspect check")
        assert q.running == 1 and q.pending == 2  # a second worker is free, but kept
        q.submit("10.0.0.1", lambda: started.append("good") or True, lambda: True,
                 lambda f: None)
        wait_for(lambda: "good" in started, 10, "the clean address's check")
        assert started[0] == "bad0" and "bad1" not in started
    finally:
        gate.set()
        q.close()


def test_lg_edge_auth_busy_backoff_doubles_and_success_clears():
    loop = _Loop()
    now = [100.0]
    q = _queue(loop, backoff=1.0, clock=lambda: now[0])
    q.failed("h")
    q.failed("h")
    assert q.backoff_left("h") == 0.0  # two typos are free
    q.failed("h")
    assert q.backoff_left("h") == pytest.approx(0.1)
    why = q.submit("h", lambda: True, lambda: True, lambda f: None)
    assert why is not None and "3 failed password checks in a row" in why
    q.failed("h")
    q.failed("h")
    assert q.backoff_left("h") == pytest.approx(0.4)
    for _ in range(10):
        q.failed("h")
    assert q.backoff_left("h") == pytest.approx(1.0)  # capped
    now[0] += 1.5
    assert q.backoff_left("h") == 0.0 and q.suspect("h")
    now[0] += 1.0  # 2 * cap without a failure: forgotten
    assert not q.suspect("h")
    q.failed("h")
    q.succeeded("h")
    assert not q.suspect("h")
    q.close()


# ------------------------------------------------------------------ over sockets
@pytest.fixture
def slow_passwords(tmp_path):
    path = tmp_path / "passwd"
    write_password_file(path, {"alice": hash_password(b"wonderland", ln=14)})
    return path


def _from(address: str, port: int) -> RawClient:
    c = RawClient.__new__(RawClient)
    c.sock = socket.create_connection(("127.0.0.1", port), timeout=10,
                                      source_address=(address, 0))
    c.buf = b""
    return c


def test_burst_of_closed_wrong_password_connects_is_not_hashed(run_edge, slow_passwords,
                                                               monkeypatch):
    """600 wrong-password CONNECTs whose sockets closed at once kept every
    client waiting while the edge hashed them all; now a check whose
    connection is gone is skipped."""
    calls = []
    real = PasswordFile.check

    def counting(self, username, password):
        calls.append(username)
        return real(self, username, password)

    monkeypatch.setattr(PasswordFile, "check", counting)
    e = run_edge(f"edge.password_file={slow_passwords}", "edge.allow_anonymous=false",
                 "edge.auth_workers=1", "edge.auth_max_pending=1000",
                 "edge.auth_max_pending_per_address=1000", "edge.auth_failure_backoff_s=0")
    n = 60
    for i in range(n):
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(connect(4, client_id=f"flood{i}", username="alice", password=b"guess"))
    ok = RawClient(e.port, timeout=30).connect(4, client_id="legit", username="alice",
                                               password=b"wonderland")
    assert ok == b"\x20\x02\x00\x00"
    # The checks are served in order: every flood CONNECT was checked or skipped by now.
    assert len(calls) < n // 2, f"{len(calls)} of {n + 1} checks ran, mostly for gone connections"
    assert e.server.auth.stats["skipped"] >= n // 2


@pytest.mark.parametrize("level, busy", [(4, BUSY_V3), (5, BUSY_V5)])
def test_lg_edge_auth_busy_connack_when_checks_pile_up(run_edge, slow_passwords, level, busy,
                                                       monkeypatch):
    gate = threading.Event()  # holds every check until the test has seen the refusal
    real = PasswordFile.check
    monkeypatch.setattr(PasswordFile, "check",
                        lambda self, u, p: gate.wait(30) and real(self, u, p))
    e = run_edge(f"edge.password_file={slow_passwords}", "edge.allow_anonymous=false",
                 "edge.auth_workers=1", "edge.auth_max_pending=2",
                 "edge.auth_max_pending_per_address=1000", "edge.auth_failure_backoff_s=0")
    waiting = [RawClient(e.port, timeout=30) for _ in range(3)]
    for i, c in enumerate(waiting):
        c.send(connect(level, client_id=f"w{i}", username="alice", password=b"guess"))
    wait_for(lambda: sum(c.session.state == "connecting" for c in list(e.server.conns)) == 3, 10,
             "3 CONNECTs waiting for their checks")
    extra = RawClient(e.port, timeout=30)
    try:
        assert extra.connect(level, client_id="late", username="alice",
                             password=b"wonderland") == busy
    finally:
        gate.set()
    for c in waiting:
        assert c.packet()[:2] in (b"\x20\x02", b"\x20\x03")  # each answered in the end
        c.close()


def test_lg_edge_auth_busy_backoff_after_a_wrong_password(run_edge, slow_passwords):
    e = run_edge(f"edge.password_file={slow_passwords}", "edge.allow_anonymous=false",
                 "edge.auth_max_pending_per_address=2", "edge.auth_failure_backoff_s=30")
    # Three wrong passwords from 127.0.0.2: refused; the address then backs off.
    for i in range(3):
        bad = _from("127.0.0.2", e.port)
        assert bad.connect(4, client_id=f"b{i}", username="alice", password=b"guess") == BAD_V3
        bad.close()
    again = _from("127.0.0.2", e.port)
    assert again.connect(4, client_id="b2", username="alice", password=b"wonderland") == BUSY_V3
    # Another address is not affected.
    good = _from("127.0.0.1", e.port)
    assert good.connect(4, client_id="g1", username="alice",
                        password=b"wonderland") == b"\x20\x02\x00\x00"
    for c in (again, good):
        c.close()


def test_lg_edge_auth_busy_backoff_counts_checks_of_clients_that_hung_up(run_edge, slow_passwords,
                                                                        monkeypatch):
    """A flood closes each socket right after its CONNECT, while the check
    runs. Those failed checks must still count for the address, or it never
    backs off and one worker hashes the flood's guesses for ever."""
    started, gate = threading.Semaphore(0), threading.Semaphore(0)
    real = PasswordFile.check

    def held(self, u, p):  # the test lets each check finish after its client is gone
        started.release()
        gate.acquire(timeout=30)
        return real(self, u, p)

    monkeypatch.setattr(PasswordFile, "check", held)
    e = run_edge(f"edge.password_file={slow_passwords}", "edge.allow_anonymous=false",
                 "edge.auth_failure_backoff_s=30")
    for i in range(3):
        with _from("127.0.0.2", e.port).sock as s:
            s.sendall(connect(4, client_id=f"gone{i}", username="alice", password=b"guess"))
            assert started.acquire(timeout=10), "the check did not start"
        wait_for(lambda: not any(c.session.state == "connecting" and c.transport is not None
                                 and not c.transport.is_closing() for c in list(e.server.conns)),
                 10, "the edge to see the client hang up")
        checked = e.server.auth.stats["checked"]
        gate.release()
        wait_for(lambda: e.server.auth.running == 0, 10, "the check to finish")
        assert e.server.auth.stats["checked"] == checked
    again = _from("127.0.0.2", e.port)
    gate.release()  # (not needed: the address is refused before any check)
    assert again.connect(4, client_id="g", username="alice", password=b"wonderland") == BUSY_V3
    again.close()
