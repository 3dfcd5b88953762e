"""Outages are visible: one WARNING line per failing batch with its cause
(not one per message), a black-holed connection noticed well before the
disposition time-out, and the batch's trouble reported to a callback (the
sink turns it into the status that ``lakegate status`` shows)."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import pytest

from bridge.amqp.sender import ForwardError, Forwarder
from bridge.config import load_config
from tests.amqp.peer import FakePeer, free_port
from tests.amqp.proxy import BlackHoleProxy
from tests.amqp.rows import row
from tests.waiting import wait_for


def cfg(url: str, *sets: str):
    return load_config(None, [f"amqp.url={url}", *sets], env={}).amqp


def rows(n: int, start: int = 0, topic: str = "a") -> list[dict]:
    return [row(topic, start + i, qos=1, packet_id=(start + i) % 65535 + 1) for i in range(n)]


def warnings(caplog, fwd: Forwarder) -> list[str]:
    """WARNING and ERROR lines of ``fwd``'s thread (not of forwarders other tests left behind)."""
    return [r.getMessage() for r in caplog.records
            if r.name == "bridge.amqp" and r.levelno >= logging.WARNING and r.threadName == f"amqp-{fwd.container_id}"]


def test_a_batch_whose_messages_fail_logs_one_warning_with_the_cause_not_one_per_message(caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.amqp")
    policy = lambda p, a, m, n: "release" if n <= 2 else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, \
            Forwarder(cfg(peer.url, "amqp.retry_backoff_s=0.01", "amqp.max_retries=3")) as fwd:
        res = fwd.forward(rows(200))
    assert res.accepted == 200 and res.retried == 400
    assert warnings(caplog, fwd) == [
        "AMQP forwarding trouble: released (address '/topic/a'); resending (each message up to 3 times, "
        "the batch fails after that)"]
    summary = [r.getMessage() for r in caplog.records if "forwarded after" in r.getMessage()]
    assert len(summary) == 1 and "400 messages resent" in summary[0] and "last cause: released" in summary[0]


def test_a_batch_that_fails_logs_its_trouble_once_and_its_failure_once(caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.amqp")
    with FakePeer(policy=lambda p, a, m, n: "reject") as peer, \
            Forwarder(cfg(peer.url, "amqp.retry_backoff_s=0.01", "amqp.max_retries=2")) as fwd:
        with pytest.raises(ForwardError):
            fwd.forward(rows(100))
    got = warnings(caplog, fwd)
    assert len(got) == 2, got
    assert got[0].startswith("AMQP forwarding trouble: rejected (amqp:internal-error: test peer rejects)")
    assert got[1].startswith("AMQP forwarding failed after ") and "(3 attempts)" in got[1]


def test_refused_connection_logs_one_warning_per_batch_and_reports_the_trouble(caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.amqp")
    port = free_port()
    told: list[tuple[str, float]] = []
    t0 = time.time()
    # attempts at about 0, 0.6 and 1.8 s: the trouble is reported at the first and again after a second
    with Forwarder(cfg(f"amqp://127.0.0.1:{port}", "amqp.retry_backoff_s=0.6", "amqp.max_retries=2")) as fwd:
        with pytest.raises(ForwardError):
            fwd.forward(rows(50), on_trouble=lambda cause, since: told.append((cause, since)))
    got = warnings(caplog, fwd)
    assert len(got) == 2, got
    assert got[0].startswith(f"AMQP forwarding trouble: connection to amqp://127.0.0.1:{port} failed: ")
    assert len(told) >= 2 and told[0][0].startswith(f"connection to amqp://127.0.0.1:{port} failed: ")
    assert t0 <= told[0][1] <= time.time() and {since for _, since in told} == {told[0][1]}  # since: the first


@pytest.mark.slow
def test_black_holed_connection_is_noticed_and_logged_well_before_the_disposition_timeout(caplog):
    """Defaults (idle time-out, 30 s disposition time-out): a peer that goes
    silent in the middle of a batch is declared dead and logged within 15 s,
    and the batch completes once the path is back."""
    caplog.set_level(logging.INFO, logger="bridge.amqp")
    noticed = threading.Event()
    thread = []  # the forwarder's thread name, once it exists

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING and "trouble" in record.getMessage() \
                    and record.threadName in thread:
                noticed.set()

    watch = Watch()
    logging.getLogger("bridge.amqp").addHandler(watch)
    try:
        def policy(peer, address, msg, n):  # the second batch (offsets 100-399) is answered only when resent
            return "accept" if n > 1 or int(msg.properties["lakegate-id"].rsplit("/", 1)[1]) < 100 else "hold"

        with FakePeer(policy=policy) as peer, \
                BlackHoleProxy(peer.port) as proxy, Forwarder(cfg(proxy.url)) as fwd:
            thread.append(f"amqp-{fwd.container_id}")
            assert fwd.config.disposition_timeout_s == 30.0
            assert fwd.forward(rows(10, start=90)).accepted == 10  # connected and working
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                fut = pool.submit(fwd.forward, rows(300, start=100))
                assert peer.wait(lambda p: len(p.messages) >= 310)  # all in flight, none answered
                proxy.black_hole.set()
                t0 = time.monotonic()
                try:
                    assert noticed.wait(15), "a silent peer was not noticed within 15 s"
                    took = time.monotonic() - t0
                finally:
                    proxy.black_hole.clear()
                res = fut.result(timeout=60)
        assert res.accepted == 300 and res.reconnects >= 1
        got = warnings(caplog, fwd)
        assert len(got) == 1 and "local-idle-timeout expired" in got[0], got
        assert took < 15
    finally:
        logging.getLogger("bridge.amqp").removeHandler(watch)


# ------------------------------------------------------------------ the sink on executors
def test_sink_records_the_trouble_while_its_forwarder_retries_and_clears_it_after(tmp_path):
    from bridge.amqp.sink import forward_rows
    from bridge.amqp.trouble import read_troubles

    with FakePeer(policy=lambda p, a, m, n: "accept" if n > 1 else "hold") as peer:
        amqp = cfg(peer.url, "amqp.disposition_timeout_s=2", "amqp.retry_backoff_s=0.01")
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(forward_rows, iter(rows(20)), amqp, str(tmp_path))
            wait_for(lambda: read_troubles(tmp_path), timeout=15, what="a trouble file")
            [t] = read_troubles(tmp_path)
            assert t["cause"] == "no disposition within 2s (address '/topic/a')"
            assert t0 <= t["since"] <= t["time"] <= time.time()
            assert fut.result(timeout=30).accepted == 20
    assert read_troubles(tmp_path) == []


@pytest.mark.subprocess
def test_executor_log_lines_carry_timestamps(tmp_path):
    """The sink's task body in a fresh interpreter (a Python worker has no
    logging configured): its warning and error lines start with a time."""
    import re
    import subprocess
    import sys

    port = free_port()
    code = f"""
import pyarrow as pa
from bridge.amqp.sink import _forward_arrow
from bridge.config import load_config
from schemas.ddl import to_arrow
from schemas.forward import FORWARD_DDL
from tests.amqp.rows import row
from tests.waiting import wait_for
amqp = load_config(None, ["amqp.url=amqp://127.0.0.1:{port}", "amqp.max_retries=1", "amqp.retry_backoff_s=0.01"],
                   env={{}}).amqp
rb = pa.RecordBatch.from_pylist([row("a", 0, qos=1, packet_id=1)], schema=to_arrow(FORWARD_DDL))
try:
    list(_forward_arrow(iter([rb]), amqp, {str(tmp_path)!r}))
except Exception as exc:
    print(type(exc).__name__)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert proc.stdout.strip() == "ForwardError", proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if " bridge.amqp: " in ln]
    assert any("WARNING bridge.amqp: AMQP forwarding trouble: connection to" in ln for ln in lines), proc.stderr
    assert any("ERROR bridge.amqp: AMQP forwarding failed after" in ln for ln in lines), proc.stderr
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) bridge\.amqp: ")
    bare = [ln for ln in proc.stderr.splitlines() if ln.strip() and not stamp.match(ln)
            and not ln.startswith(("Traceback", " "))]
    assert lines and all(stamp.match(ln) for ln in lines) and not bare, proc.stderr
