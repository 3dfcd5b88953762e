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


def cfg(url: str, *sets: str):
    return load_config(None, [f"amqp.url={url}", *sets], env={}).amqp


def rows(n: int, start: int = 0, topic: str = "a") -> list[dict]:
    return [row(topic, start + i, qos=1, packet_id=(start + i) % 65535 + 1) for i in range(n)]


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bridge.amqp" and r.levelno >= logging.WARNING]


def test_a_batch_whose_messages_fail_logs_one_warning_with_the_cause_not_one_per_message(caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.amqp")
    policy = lambda p, a, m, n: "release" if n <= 2 else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, \
            Forwarder(cfg(peer.url, "amqp.retry_backoff_s=0.01", "amqp.max_retries=3")) as fwd:
        res = fwd.forward(rows(200))
    assert res.accepted == 200 and res.retried == 400
    assert warnings(caplog) == [
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
    got = warnings(caplog)
    assert len(got) == 2, got
    assert got[0].startswith("AMQP forwarding trouble: rejected (amqp:internal-error: test peer rejects)")
    assert got[1].startswith("AMQP forwarding failed after ") and "(3 attempts)" in got[1]


def test_refused_connection_logs_one_warning_per_batch_and_reports_the_trouble(caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.amqp")
    port = free_port()
    told: list[tuple[str, float]] = []
    t0 = time.time()
    with Forwarder(cfg(f"amqp://127.0.0.1:{port}", "amqp.retry_backoff_s=0.01", "amqp.max_retries=3")) as fwd:
        with pytest.raises(ForwardError):
            fwd.forward(rows(50), on_trouble=lambda cause, since: told.append((cause, since)))
    got = warnings(caplog)
    assert len(got) == 2, got
    assert got[0].startswith(f"AMQP forwarding trouble: connection to amqp://127.0.0.1:{port} failed: ")
    assert told and told[0][0].startswith(f"connection to amqp://127.0.0.1:{port} failed: ")
    assert t0 <= told[0][1] <= time.time()


@pytest.mark.slow
def test_black_holed_connection_is_noticed_and_logged_well_before_the_disposition_timeout(caplog):
    """Defaults (idle time-out, 30 s disposition time-out): a peer that goes
    silent in the middle of a batch is declared dead and logged within 15 s,
    and the batch completes once the path is back."""
    caplog.set_level(logging.INFO, logger="bridge.amqp")
    noticed = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING and "trouble" in record.getMessage():
                noticed.set()

    watch = Watch()
    logging.getLogger("bridge.amqp").addHandler(watch)
    try:
        def policy(peer, address, msg, n):  # the second batch (offsets 100-399) is answered only when resent
            return "accept" if n > 1 or int(msg.properties["lakegate-id"].rsplit("/", 1)[1]) < 100 else "hold"

        with FakePeer(policy=policy) as peer, \
                BlackHoleProxy(peer.port) as proxy, Forwarder(cfg(proxy.url)) as fwd:
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
        got = warnings(caplog)
        assert len(got) == 1 and "local-idle-timeout expired" in got[0], got
        assert took < 15
    finally:
        logging.getLogger("bridge.amqp").removeHandler(watch)
