"""The seed's AMQP -> MQTT dispositions as the *producer* sees them: a
back end that speaks AMQP 1.0 itself (``tests/amqp/direct_peer.py``, no
broker in between) sends on the edge's receiver link for the seed's own
client address ``$mqtt.to.{client_id}`` and gets the edge's dispositions:
QoS 1 accepted only at PUBACK, QoS 2 accepted at PUBREC and its AMQP_PUBREL
at PUBCOMP, released when the client drops without acknowledging
(``../shared/seeds/001_4f7e894452682fb7.txt``, "From AMQP network to MQTT
client"). With RabbitMQ in between (tests/edge/test_downlink.py) the
producer's disposition is RabbitMQ's."""

from __future__ import annotations

import time

import pytest
from proton import Message, symbol

from bridge.mqtt import Subscribe, Subscription
from tests.amqp.direct_peer import DirectPeer
from tests.edge.conftest import RawClient
from tests.waiting import holds_for, wait_for


@pytest.fixture
def peer():
    p = DirectPeer().start()
    yield p
    p.stop()


def subscriber(edge, cid: str, level: int, topic: str, qos: int) -> RawClient:
    c = RawClient(edge.port, timeout=10)
    assert c.connect(level, client_id=cid)[0] == 0x20
    c.send_packet(Subscribe(1, [Subscription(topic, qos)]), level)
    assert c.packet()[0] == 0x90
    return c


def pid_of(frame: bytes, topic: str) -> bytes:
    return frame[4 + len(topic):6 + len(topic)]


@pytest.fixture
def direct(run_edge, peer):
    """An edge receiving from the peer on the seed's ``$mqtt.to.{client_id}``
    (``amqp.peer = "generic"``: a plain AMQP 1.0 node; no topic link)."""
    return run_edge(f"amqp.url={peer.url}", "amqp.downlink=true", "amqp.peer=generic",
                    "amqp.retry_backoff_s=0.1")


def test_qos1_the_producer_sees_accepted_only_after_the_puback(direct, peer):
    topic = "devices/7/cmd"
    c = subscriber(direct, "dev7", 4, topic, 1)
    address = "$mqtt.to.dev7"  # the seed's address, the default template
    wait_for(lambda: address in peer.links, 15, "the edge's link on $mqtt.to.dev7")
    peer.send(address, Message(address=topic, body=b"reboot", durable=True,
                               annotations={symbol("x-qos"): 1}), "reboot")
    pub = c.packet()
    assert pub[0] == 0x32 and pub.endswith(b"reboot")
    holds_for(lambda: "reboot" not in peer.outcomes, 0.5, "no disposition before the PUBACK")
    acked = time.monotonic()
    c.send(b"\x40\x02" + pid_of(pub, topic))
    wait_for(lambda: "reboot" in peer.outcomes, 10, "the producer's disposition")
    outcome, at = peer.outcomes["reboot"]
    assert outcome == "accepted" and at >= acked
    c.send(b"\xe0\x00")
    c.close()


def test_qos2_accepted_at_pubrec_then_amqp_pubrel_accepted_at_pubcomp(direct, peer):
    topic = "devices/7/cmd"
    c = subscriber(direct, "dev7q", 5, topic, 2)
    address = "$mqtt.to.dev7q"
    wait_for(lambda: address in peer.links, 15, "the edge's link")
    peer.send(address, Message(address=topic, body=b"two", id="c-2",
                               annotations={symbol("x-qos"): 2}), "publish")
    pub = c.packet()
    assert pub[0] == 0x34 and pub.endswith(b"two")
    pid = pid_of(pub, topic)
    holds_for(lambda: "publish" not in peer.outcomes, 0.3, "no disposition before PUBREC")
    c.send(b"\x50\x02" + pid)  # PUBREC
    wait_for(lambda: "publish" in peer.outcomes, 10, "AMQP_PUBLISH's disposition")
    assert peer.outcomes["publish"][0] == "accepted"
    peer.send(address, Message(address=topic, subject="pubrel", id="c-2"), "pubrel")
    assert c.packet() == b"\x62\x02" + pid  # PUBREL, once AMQP_PUBREL came
    holds_for(lambda: "pubrel" not in peer.outcomes, 0.3, "AMQP_PUBREL waits for PUBCOMP")
    c.send(b"\x70\x02" + pid)
    wait_for(lambda: "pubrel" in peer.outcomes, 10, "AMQP_PUBREL's disposition")
    assert peer.outcomes["pubrel"][0] == "accepted"
    c.send(b"\xe0\x00")
    c.close()


def test_a_client_that_drops_unacknowledged_gets_its_delivery_released(direct, peer):
    topic = "devices/8/cmd"
    c = subscriber(direct, "dev8", 5, topic, 1)
    address = "$mqtt.to.dev8"
    wait_for(lambda: address in peer.links, 15, "the edge's link")
    peer.send(address, Message(address=topic, body=b"x", annotations={symbol("x-qos"): 1}), "x")
    assert c.packet().endswith(b"x")
    c.close()  # no PUBACK, no DISCONNECT: a clean session ends
    wait_for(lambda: "x" in peer.outcomes, 10, "the disposition")
    assert peer.outcomes["x"][0] == "released"  # the peer may deliver it again, never accepted


def test_no_subscription_matches_rejected_LG_amqp_no_subscription(direct, peer, caplog):
    c = subscriber(direct, "dev9", 5, "devices/9/cmd", 1)
    address = "$mqtt.to.dev9"
    wait_for(lambda: address in peer.links, 15, "the edge's link")
    with caplog.at_level("WARNING", logger="bridge.edge"):
        peer.send(address, Message(address="devices/9/other", body=b"secret-payload", id="m-7",
                                   annotations={symbol("x-qos"): 1}), "other")
        wait_for(lambda: "other" in peer.outcomes, 10, "the disposition")
    assert peer.outcomes["other"][0] == "rejected"
    cond, why = peer.conditions["other"]
    assert cond == "amqp:not-found" and "[LG-amqp-no-subscription]" in why
    # logged once, with rule, client, topic, size and id; never the payload
    lines = [r.getMessage() for r in caplog.records if "LG-amqp-no-subscription" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "client dev9" in lines[0] and "'devices/9/other'" in lines[0] and "14 bytes" in lines[0]
    assert "'m-7'" in lines[0] and "secret-payload" not in caplog.text
    c.send(b"\xe0\x00")
    c.close()


def test_an_amqp_pubrel_nothing_awaits_is_rejected_and_logged_LG_amqp_pubrel_unknown(direct, peer, caplog):
    from proton import ulong

    c = subscriber(direct, "dev8", 5, "devices/8/cmd", 2)
    address = "$mqtt.to.dev8"
    wait_for(lambda: address in peer.links, 15, "the edge's link")
    with caplog.at_level("WARNING", logger="bridge.edge"):
        peer.send(address, Message(address="devices/8/cmd", subject="pubrel", id=ulong(77)), "rel")
        wait_for(lambda: "rel" in peer.outcomes, 10, "the disposition")
    assert peer.outcomes["rel"][0] == "rejected"
    cond, why = peer.conditions["rel"]
    assert cond == "amqp:not-found" and "[LG-amqp-pubrel-unknown]" in why and "'77'" in why
    lines = [r.getMessage() for r in caplog.records if "LG-amqp-pubrel-unknown" in r.getMessage()]
    assert len(lines) == 1 and "'77'" in lines[0] and "ulong" not in lines[0], lines
    c.send(b"\xe0\x00")
    c.close()


def test_a_release_after_the_detach_was_taken_still_reaches_the_peer():
    """The race behind the test above, made certain: the session's end
    detaches the client's link, and its outbox releases what the link left
    unsettled just after; under load the receiver's thread takes the detach
    in one wake and the release in the next. A disposition cannot follow
    the link's detach, so the link stays attached (without more credit)
    until what it left unsettled is settled, then goes."""
    from bridge.amqp.receiver import DownlinkReceiver
    from bridge.config import load_config

    got: list = []
    peer = DirectPeer().start()  # stopped before the receiver, as the edge's tests do
    cfg = load_config(None, [f"amqp.url={peer.url}", "amqp.retry_backoff_s=0.1"], env={}).amqp
    rx = DownlinkReceiver(cfg, lambda address, result, token: got.append(token)).start()
    try:
        assert rx.ready.wait(15), "the receiver did not connect"
        address = "$mqtt.to.devR"
        rx.attach(address, credit=2, durable=True)
        wait_for(lambda: address in peer.links, 15, "the receiver's link")
        peer.send(address, Message(address="devices/R/cmd", body=b"r",
                                   annotations={symbol("x-qos"): 1}), "r")
        token = wait_for(lambda: got and got[0], 10, "the delivery, held unsettled")
        rx.detach(address)
        wait_for(lambda: address not in rx.links, 10, "the detach, taken by the receiver's thread")
        rx.settle(token, "released")  # a later wake than the detach's
        wait_for(lambda: "r" in peer.outcomes, 10, "the release")
        assert peer.outcomes["r"][0] == "released"
        wait_for(lambda: address not in peer.links, 10, "the link detached, nothing left unsettled")
    finally:
        peer.stop()
        rx.stop()


def test_a_detached_link_takes_nothing_new_and_goes_after_the_grace(monkeypatch):
    """While a detached link waits for what it left unsettled, what arrives
    on it is released at once; if the caller never settles, the link goes
    after ``_DETACH_GRACE_S`` all the same."""
    import bridge.amqp.receiver as receiver
    from bridge.config import load_config

    monkeypatch.setattr(receiver, "_DETACH_GRACE_S", 3.0)  # > the late one's round trip under load
    got: list = []
    peer = DirectPeer().start()
    cfg = load_config(None, [f"amqp.url={peer.url}", "amqp.retry_backoff_s=0.1"], env={}).amqp
    rx = receiver.DownlinkReceiver(cfg, lambda address, result, token: got.append(token)).start()
    try:
        assert rx.ready.wait(15), "the receiver did not connect"
        address = "$mqtt.to.devG"
        rx.attach(address, credit=2, durable=True)
        wait_for(lambda: address in peer.links, 15, "the receiver's link")
        peer.send(address, Message(address="devices/G/cmd", body=b"1"), "held")
        wait_for(lambda: got, 10, "the first delivery, held unsettled")
        rx.detach(address)
        wait_for(lambda: address not in rx.links, 10, "the detach, taken by the receiver's thread")
        peer.send(address, Message(address="devices/G/cmd", body=b"2"), "late")  # the credit left
        wait_for(lambda: "late" in peer.outcomes, 10, "the late one's disposition")
        assert peer.outcomes["late"][0] == "released" and len(got) == 1
        wait_for(lambda: address not in peer.links, 10, "the link gone after the grace")
        assert "held" not in peer.outcomes  # never settled: the peer's to deliver again
    finally:
        peer.stop()
        rx.stop()
