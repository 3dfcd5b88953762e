"""The Forwarder against a scripted AMQP peer (tests/amqp/peer.py).

What RabbitMQ cannot be made to do on demand -- reject, release, modify, stay
silent, refuse a link at link level, attach rcv-settle-mode second -- and
what it hides from a consumer (the header's delivery-count, the attach
frames) is checked here, on the wire.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import socket
import subprocess
import time
from typing import Any

import pytest
from proton import SSLDomain

from bridge.amqp.sender import ForwardError, Forwarder
from bridge.config import AmqpConfig, load_config
from tests.amqp.peer import FakePeer, free_port
from tests.amqp.rows import row


def cfg(url: str, **kw: Any) -> AmqpConfig:
    sets = [f"amqp.url={url}", "amqp.max_retries=2", "amqp.retry_backoff_s=0.02", "amqp.disposition_timeout_s=5"]
    sets += [f"amqp.{k}={v}" for k, v in kw.items()]
    return load_config(None, sets, env={}).amqp


def rows(topic: str, n: int, qos: int = 1, start: int = 0, **kw: Any) -> list[dict]:
    return [row(topic, start + i, qos=qos, packet_id=None if qos == 0 else (start + i) % 65535 + 1, **kw)
            for i in range(n)]


# ------------------------------------------------------------------ links
def test_seed_links_one_per_address_and_class_unsettled_first_kept_between_batches():
    with FakePeer() as peer, Forwarder(cfg(peer.url)) as fwd:
        batch = rows("a/b", 3, qos=0) + rows("a/b", 3, qos=1, start=3) + rows("a/b", 3, qos=2, start=6) \
            + rows("c", 2, qos=1, start=9)
        res = fwd.forward(batch)
        assert (res.accepted, res.qos0, res.transfers) == (8, 3, 11)
        got = sorted((a["address"], a["name"].split("-")[1], a["snd_settle_mode"], a["rcv_settle_mode"])
                     for a in peer.attaches)
        assert got == [("/topic/a.b", "qos01", 0, 0), ("/topic/a.b", "qos2", 0, 0), ("/topic/c", "qos01", 0, 0)]
        fwd.forward(rows("a/b", 2, qos=1, start=20) + rows("a/b", 1, qos=2, start=22))
        assert len(peer.attaches) == 3  # the links stayed attached
        # QoS 0 and 1 share a link; QoS 2 has its own
        by_link = {}
        for m in peer.messages:
            by_link.setdefault(m["link"], set()).add(m["message"].annotations["x-qos"])
        assert sorted(map(sorted, by_link.values())) == [[0, 1], [1], [2]]


def test_enmasse_qos2_link_attaches_rcv_second_and_completes_both_steps():
    with FakePeer() as peer, Forwarder(cfg(peer.url, profile="enmasse")) as fwd:
        res = fwd.forward(rows("a", 4, qos=2) + rows("a", 2, qos=1, start=4) + [row("a", 9, kind="pubrel", packet_id=1)])
        assert res.accepted == 7
        modes = {a["name"].split("-")[1]: a["rcv_settle_mode"] for a in peer.attaches}
        assert modes == {"qos2": 1, "qos01": 0}
        # each QoS 2 delivery (4 PUBLISH + 1 PUBREL): outcome unsettled, then the sender settled
        assert peer.wait(lambda p: p.second_step == 5)
        assert fwd.describe()["links"][0]["remote_rcv_settle_mode"] in ("first", "second")


@pytest.mark.parametrize("profile, mode, expected", [("enmasse", "first", 0), ("seed", "second", 1), ("seed", "profile", 0)])
def test_qos2_rcv_settle_mode_setting(profile, mode, expected):
    with FakePeer() as peer, Forwarder(cfg(peer.url, profile=profile, qos2_rcv_settle_mode=mode)) as fwd:
        fwd.forward(rows("a", 1, qos=2))
        assert [a["rcv_settle_mode"] for a in peer.attaches] == [expected]


def test_pubrel_goes_on_the_qos2_link_after_its_publish():
    with FakePeer() as peer, Forwarder(cfg(peer.url)) as fwd:
        fwd.forward([row("a/b", 0, qos=2, packet_id=5, payload=b"x"), row("a/b", 1, kind="pubrel", packet_id=5)])
        subjects = [(m["link"].split("-")[1], m["message"].subject, m["message"].id) for m in peer.messages]
        assert subjects == [("qos2", "publish", 5), ("qos2", "pubrel", 5)]


def test_dup_flag_is_the_header_delivery_count_on_the_wire():
    with FakePeer() as peer, Forwarder(cfg(peer.url)) as fwd:
        fwd.forward([row("a", 0, qos=1, packet_id=1, dup=True), row("a", 1, qos=1, packet_id=2, dup=False)])
        assert [m["message"].delivery_count for m in peer.messages] == [1, 0]


def test_ttl_on_the_wire_is_the_remaining_lifetime_and_expired_rows_are_counted():
    now = time.time()
    with FakePeer() as peer, Forwarder(cfg(peer.url)) as fwd:
        res = fwd.forward([row("a", 0, qos=1, packet_id=1, message_expiry_interval=100, receive_time=now - 40),
                           row("a", 1, qos=1, packet_id=2, message_expiry_interval=5, receive_time=now - 6)])
        assert (res.accepted, res.expired) == (1, 1)
        [m] = [m["message"] for m in peer.messages]
        assert 58.0 < m.ttl <= 60.0


# ------------------------------------------------------------------ delivery
def test_many_unsettled_deliveries_in_flight_at_once():
    # the peer answers nothing until it holds 200 unsettled deliveries
    with FakePeer(policy=lambda p, a, m, n: "hold") as peer, Forwarder(cfg(peer.url)) as fwd:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(fwd.forward, rows("a", 200, qos=1))
            assert peer.wait(lambda p: len(p.messages) == 200, timeout=10)
            assert not fut.done()
            peer.release_held()
            res = fut.result(timeout=10)
        assert res.accepted == 200 and res.transfers == 200


def test_qos0_is_not_awaited_and_not_resent():
    with FakePeer(policy=lambda p, a, m, n: "hold") as peer, Forwarder(cfg(peer.url)) as fwd:
        res = fwd.forward(rows("a", 5, qos=0))
        assert (res.qos0, res.accepted, res.transfers) == (5, 0, 5)
        assert peer.wait(lambda p: len(p.messages) == 5)
        assert all(not m["settled"] for m in peer.messages)  # the link is snd-settle-mode unsettled


@pytest.mark.parametrize("outcome", ["reject", "release", "modify"])
def test_non_accepted_outcome_is_resent_then_accepted(outcome):
    policy = lambda p, a, m, n: outcome if n == 1 else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        res = fwd.forward(rows("a", 10, qos=1) + rows("a", 10, qos=2, start=10))
        assert (res.accepted, res.retried, res.transfers) == (20, 20, 40)
        assert set(peer.counts.values()) == {2}


@pytest.mark.parametrize("outcome, text", [
    ("reject", r"rejected \(amqp:internal-error: test peer rejects\)"),
    ("release", r"released"),
    ("modify", r"modified \(delivery-failed=true, undeliverable-here=false\)"),
])
def test_outcome_past_the_retry_bound_fails_the_batch_naming_address_and_outcome(outcome, text):
    policy = lambda p, a, m, n: "accept" if a == "/topic/ok" else outcome  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        with pytest.raises(ForwardError, match=rf"^AMQP peer did not accept publish mqtt-frames/0/0 sent to "
                                               rf"address '/topic/dev\.1': {text} \(3 attempts\)$") as err:
            fwd.forward(rows("dev/1", 1, qos=1))
        assert err.value.address == "/topic/dev.1" and err.value.attempts == 3
        assert peer.counts == {"mqtt-frames/0/0": 3}  # max_retries=2: three tries in all
        assert fwd.forward(rows("ok", 1, qos=1, start=5)).accepted == 1  # the forwarder goes on


# ------------------------------------------------------------------ LG-amqp-rejected
@pytest.mark.parametrize("condition", ["amqp:decode-error", "amqp:link:message-size-exceeded"])
def test_lg_amqp_rejected_message_faults_are_quarantined_after_their_retries_and_the_batch_goes_on(condition):
    bad = "mqtt-frames/0/1"
    policy = lambda p, a, m, n: f"reject:{condition}" if m.properties["lakegate-id"] == bad else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        res = fwd.forward(rows("a", 3, qos=1) + rows("a", 2, qos=2, start=3))
        assert (res.rows, res.accepted, res.unforwardable) == (5, 4, 1)
        [f] = res.failures
        assert (f.stream, f.partition, f.offset, f.rule) == ("mqtt-frames", 0, 1, "LG-amqp-rejected")
        assert f.error == (f"[LG-amqp-rejected] AMQP peer did not accept publish {bad} sent to address '/topic/a': "
                           f"rejected ({condition}: test peer rejects) (3 attempts)")
        assert peer.counts[bad] == 3  # max_retries=2: retried like any failure first
        # the messages after it to the same address were forwarded, in order
        got = [m["message"].properties["lakegate-id"] for m in peer.messages]
        assert [k for k in got if k != bad] == [f"mqtt-frames/0/{i}" for i in (0, 2, 3, 4)]


@pytest.mark.parametrize("condition", ["amqp:unauthorized-access", "amqp:resource-limit-exceeded",
                                       "amqp:not-allowed", "amqp:internal-error", "amqp:invalid-field"])
def test_lg_amqp_rejected_not_for_the_peers_conditions_which_still_fail_the_batch(condition):
    policy = lambda p, a, m, n: f"reject:{condition}"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        with pytest.raises(ForwardError, match=rf"^AMQP peer did not accept publish mqtt-frames/0/0 sent to address "
                                               rf"'/topic/a': rejected \({condition}: test peer rejects\) "
                                               rf"\(3 attempts\)$"):
            fwd.forward(rows("a", 2, qos=1))
        assert peer.counts["mqtt-frames/0/0"] == 3


def test_lg_amqp_rejected_only_when_every_attempt_was_the_messages_fault():
    # a decode-error once, then the peer's own trouble: not the message's fault
    policy = lambda p, a, m, n: "reject:amqp:decode-error" if n == 1 else "reject:amqp:internal-error"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        with pytest.raises(ForwardError, match=r"rejected \(amqp:internal-error: test peer rejects\) \(3 attempts\)$"):
            fwd.forward(rows("a", 1, qos=1))


def test_lg_amqp_rejected_message_over_the_links_max_message_size_is_not_sent():
    with FakePeer(max_message_size=2000) as peer, Forwarder(cfg(peer.url)) as fwd:
        batch = [row("a", 0, qos=1, packet_id=1, payload=b"s" * 10),
                 row("a", 1, qos=1, packet_id=2, payload=b"b" * 5000),
                 row("a", 2, qos=2, packet_id=3, payload=b"s" * 10)]
        res = fwd.forward(batch)
        assert (res.accepted, res.unforwardable, res.transfers) == (2, 1, 2)
        [f] = res.failures
        assert (f.partition, f.offset, f.rule) == (0, 1, "LG-amqp-rejected")
        assert f.error.startswith("[LG-amqp-rejected] amqp:link:message-size-exceeded: publish mqtt-frames/0/1 is ")
        assert f.error.endswith(" bytes encoded, over the max-message-size 2000 of its link to address '/topic/a'; "
                                "not sent")
        assert sorted(peer.counts) == ["mqtt-frames/0/0", "mqtt-frames/0/2"]


def test_no_disposition_times_out_and_is_resent():
    policy = lambda p, a, m, n: "ignore" if n == 1 else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url, disposition_timeout_s=0.3)) as fwd:
        res = fwd.forward(rows("a", 3, qos=1))
        assert (res.accepted, res.retried) == (3, 3)


def test_no_disposition_past_the_bound_names_the_timeout():
    with FakePeer(policy=lambda p, a, m, n: "ignore") as peer, \
            Forwarder(cfg(peer.url, disposition_timeout_s=0.2, max_retries=1)) as fwd:
        with pytest.raises(ForwardError, match=r"no disposition within 0\.2s \(2 attempts\)$"):
            fwd.forward(rows("a", 1, qos=1))


def test_link_refused_at_link_level_names_the_address():
    with FakePeer(refuse=("/topic/no.such",)) as peer, Forwarder(cfg(peer.url)) as fwd:
        with pytest.raises(ForwardError, match=r"^AMQP peer refused the qos01 link to address '/topic/no\.such': "
                                               r"amqp:not-found: no such node: /topic/no\.such \(3 attempts\)$"):
            fwd.forward(rows("no/such", 1, qos=1))


def test_idle_links_are_detached_and_attached_again_when_needed():
    with FakePeer() as peer, Forwarder(cfg(peer.url, link_idle_s=0.3)) as fwd:
        fwd.forward(rows("a", 1, qos=1))
        assert peer.wait(lambda p: len(p.detaches) == 1, timeout=5)
        fwd.forward(rows("a", 1, qos=1, start=1))
        assert len(peer.attaches) == 2


# ------------------------------------------------------------------ connection
def test_lost_connection_resends_what_was_not_accepted():
    port = free_port()
    first = FakePeer(policy=lambda p, a, m, n: "hold")
    first.port, first.url = port, f"amqp://127.0.0.1:{port}"
    with Forwarder(cfg(first.url, retry_backoff_s=0.05, max_retries=6)) as fwd:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with first:
                fut = pool.submit(fwd.forward, rows("a", 30, qos=1) + rows("a", 10, qos=0, start=30))
                assert first.wait(lambda p: len(p.messages) == 40)
                assert len(fwd._engine.deliveries) == 40  # held while unsettled (reactor.send)
            second = FakePeer()
            second.port, second.url = port, first.url
            with second:
                res = fut.result(timeout=20)
                assert res.accepted == 30 and res.qos0 == 10 and res.reconnects == 1
                # every QoS 1 message again, in order; QoS 0 was not sent again
                keys = [m["message"].properties["lakegate-id"] for m in second.messages]
                assert keys == [f"mqtt-frames/0/{i}" for i in range(30)]
                # every delivery of the lost connection released, the new ones once settled
                assert second.wait(lambda p: not fwd._engine.deliveries, timeout=5)


def test_refused_connection_fails_after_the_retry_bound():
    port = free_port()
    with Forwarder(cfg(f"amqp://127.0.0.1:{port}")) as fwd:
        with pytest.raises(ForwardError, match=rf"^AMQP connection to amqp://127\.0\.0\.1:{port} failed: .+ \(3 attempts\)$"):
            fwd.forward(rows("a", 1, qos=1))


def test_silent_peer_times_out_on_open():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)  # accepts TCP, never speaks AMQP
        port = srv.getsockname()[1]
        with Forwarder(cfg(f"amqp://127.0.0.1:{port}", disposition_timeout_s=0.3, max_retries=1)) as fwd:
            with pytest.raises(ForwardError, match=r"no open from the peer within 0\.3s \(2 attempts\)$"):
                fwd.forward(rows("a", 1, qos=1))


def test_credentials_never_reach_logs_or_errors(caplog):
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-Pa55"
    with FakePeer() as peer:
        url = peer.url.replace("amqp://", f"amqp://bob:{secret}@")
        with Forwarder(cfg(url)) as fwd:
            fwd.forward(rows("a", 2, qos=1))
        with Forwarder(cfg(f"amqp://bob:{secret}@127.0.0.1:{free_port()}", max_retries=0)) as fwd:
            with pytest.raises(ForwardError) as err:
                fwd.forward(rows("a", 1, qos=1))
    assert secret not in str(err.value)
    assert caplog.records and all(secret not in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_the_configured_ca(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = SSLDomain(SSLDomain.MODE_SERVER)
    server.set_credentials(str(cert), str(key), None)
    with FakePeer(ssl_domain=server) as peer:
        url = f"amqps://localhost:{peer.port}"
        with Forwarder(cfg(url, tls_ca_file=str(cert))) as fwd:
            assert fwd.forward(rows("a", 2, qos=1)).accepted == 2
        with Forwarder(cfg(url, max_retries=0)) as fwd:  # the system CAs do not know it
            with pytest.raises(ForwardError, match=r"^AMQP connection to amqps://localhost:\d+ failed: .*certificate"):
                fwd.forward(rows("a", 1, qos=1))


# ------------------------------------------------------------------ the disposition fast path
def _count_fast(fwd: Forwarder) -> dict[str, int]:
    """Wrap the container's fast_delivery to count what it handled and passed on."""
    counts = {"handled": 0, "passed": 0}
    inner = fwd._container.fast_delivery

    def counting(d):
        ok = inner(d)
        counts["handled" if ok else "passed"] += 1
        return ok

    fwd._container.fast_delivery = counting
    return counts


def test_accepted_outcomes_take_the_fast_path_and_nothing_stays_held():
    with FakePeer() as peer, Forwarder(cfg(peer.url)) as fwd:
        counts = _count_fast(fwd)
        res = fwd.forward(rows("a", 50, qos=1) + rows("a", 10, qos=0, start=50))
        assert (res.accepted, res.qos0) == (50, 10)
        assert peer.wait(lambda p: len(p.messages) == 60)
        assert peer.wait(lambda p: not fwd._engine.deliveries, timeout=5)  # QoS 0 dispositions settled too
        assert counts["handled"] >= 50 and counts["passed"] == 0


@pytest.mark.parametrize("outcome", ["reject", "release", "modify"])
def test_other_outcomes_leave_the_fast_path_for_on_delivery_and_are_released(outcome):
    policy = lambda p, a, m, n: outcome if n == 1 else "accept"  # noqa: E731
    with FakePeer(policy=policy) as peer, Forwarder(cfg(peer.url)) as fwd:
        counts = _count_fast(fwd)
        res = fwd.forward(rows("a", 10, qos=1))
        assert (res.accepted, res.retried) == (10, 10)
        assert counts["passed"] == 10 and counts["handled"] >= 10
        assert not fwd._engine.deliveries

