"""Forwarding to the real RabbitMQ 3.x (AMQP 1.0 plugin): an AMQP consumer
checks every field of the mapping, in both profiles.

RabbitMQ 3.x rebuilds the header when it delivers: the consumer sees its
own delivery-count (0 on a first delivery), not the one sent; the DUP flag
on the wire is checked in test_sender_peer.py. RabbitMQ 3.x does not do
rcv-settle-mode second, so the enmasse profile runs here with
``amqp.qos2_rcv_settle_mode = "first"`` (and a test shows the clear error
without it).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid

import pytest
from proton import symbol

from bridge.amqp.mapping import ANN_PAYLOAD_FORMAT, ANN_USER_PROPERTIES, ID_PROPERTY
from bridge.amqp.sender import ForwardError, Forwarder
from bridge.config import load_config
from tests.amqp.rows import row
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

ANNS = {"seed": ("x-retain", "x-qos"), "enmasse": ("x-opt-retain-message", "x-opt-mqtt-qos")}


@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_every_field_of_the_mapping_arrives(profile, consumer, make_config):
    retain_ann, qos_ann = ANNS[profile]
    topic = consumer.topic(f"fields-{profile}")
    now = time.time()
    ups = [{"key": "k", "value": "1"}, {"key": "unit", "value": "C"}, {"key": "k", "value": "2"}]
    batch = [
        row(topic, 0, qos=0, payload=b"q0"),
        row(topic, 1, qos=1, packet_id=11, retain=True, payload=b"q1-retained"),
        row(topic, 2, qos=1, packet_id=12, dup=True, payload=b"q1-dup"),
        row(topic, 3, qos=2, packet_id=13, payload=b"\x00\xffq2"),
        row(topic, 4, kind="pubrel", packet_id=13),
        row(topic, 5, qos=1, packet_id=14, payload="{\"t\": 21.5}".encode(), payload_format_indicator=1,
            message_expiry_interval=3600, receive_time=dt.datetime.fromtimestamp(now - 600, dt.timezone.utc),
            response_topic=f"{topic}/reply", correlation_data=b"\x01corr", user_properties=ups,
            content_type="application/json"),
    ]
    cfg = make_config(profile=profile, qos2_rcv_settle_mode="first")
    with Forwarder(cfg) as fwd:
        res = fwd.forward(batch)
    assert (res.qos0, res.accepted, res.expired) == (1, 5, 0)
    got = {m.properties[ID_PROPERTY]: m for m in consumer.wait(topic, 6)}
    assert len(got) == 6

    def common(m, offset, qos, retain, payload):
        assert m.address == topic  # `to`: the MQTT topic, verbatim
        assert m.properties[ID_PROPERTY] == f"mqtt-frames/0/{offset}"
        assert m.annotations[symbol(retain_ann)] is retain
        assert m.annotations[symbol(qos_ann)] == qos
        assert m.durable is (qos > 0)
        assert m.inferred and bytes(m.body) == payload  # one Data section
        assert m.subject == ("publish" if profile == "seed" else None)
        assert m.delivery_count == 0  # RabbitMQ's own count (see the module docstring)

    m = got["mqtt-frames/0/0"]
    common(m, 0, 0, False, b"q0")
    assert m.id is None
    common(got["mqtt-frames/0/1"], 1, 1, True, b"q1-retained")
    assert got["mqtt-frames/0/1"].id == 11
    common(got["mqtt-frames/0/2"], 2, 1, False, b"q1-dup")
    common(got["mqtt-frames/0/3"], 3, 2, False, b"\x00\xffq2")
    assert got["mqtt-frames/0/3"].id == 13

    rel = got["mqtt-frames/0/4"]
    assert (rel.subject, rel.id, rel.address, rel.durable) == ("pubrel", 13, topic, True)
    assert rel.annotations is None
    assert bytes(rel.body or b"") == b""  # sent with no body; RabbitMQ 3.x delivers an empty Data section

    m5 = got["mqtt-frames/0/5"]
    common(m5, 5, 1, False, b'{"t": 21.5}')
    assert m5.content_type == "application/json"
    assert bytes(m5.correlation_id) == b"\x01corr"
    assert m5.reply_to == "/topic/" + f"{topic}/reply".replace("/", ".")
    assert 2990 < m5.ttl <= 3000  # an hour, received ten minutes ago
    assert m5.annotations[symbol(ANN_PAYLOAD_FORMAT)] == 1
    assert m5.properties == {"k": "1", "unit": "C", ID_PROPERTY: "mqtt-frames/0/5"}
    assert m5.annotations[symbol(ANN_USER_PROPERTIES)] == [["k", "1"], ["unit", "C"], ["k", "2"]]


def test_qos2_gives_the_publish_then_the_pubrel(consumer, make_config):
    topic = consumer.topic("qos2")
    with Forwarder(make_config()) as fwd:
        fwd.forward([row(topic, 0, qos=2, packet_id=77, payload=b"x"), row(topic, 1, kind="pubrel", packet_id=77)])
    pub, rel = consumer.wait(topic, 2)
    assert (pub.subject, pub.id, rel.subject, rel.id) == ("publish", 77, "pubrel", 77)


def test_expired_message_is_not_sent_and_is_counted(consumer, make_config):
    topic = consumer.topic("expired")
    with Forwarder(make_config()) as fwd:
        res = fwd.forward([row(topic, 0, qos=1, packet_id=1, message_expiry_interval=1, receive_time=time.time() - 2),
                           row(topic, 1, qos=1, packet_id=2, payload=b"live")])
    assert (res.expired, res.accepted) == (1, 1)
    [m] = consumer.wait(topic, 1)
    assert bytes(m.body) == b"live"


def test_message_expiry_interval_beyond_ttl_range_arrives_with_absolute_expiry_time(consumer, make_config):
    topic = consumer.topic("long-expiry")
    now = time.time()
    with Forwarder(make_config()) as fwd:  # raised struct.error on every retry before
        res = fwd.forward([row(topic, 0, qos=1, packet_id=1, message_expiry_interval=2**32 - 1, receive_time=now)])
    assert (res.accepted, res.unforwardable) == (1, 0)
    [m] = consumer.wait(topic, 1)
    assert m.expiry_time == pytest.approx(now + 2**32 - 1, abs=0.01)


def test_lg_amqp_unforwardable_row_is_set_aside_counted_logged_and_the_rest_goes(consumer, make_config, caplog):
    topic = consumer.topic("unforwardable")
    rows = [row(topic, 0, qos=1, packet_id=1, payload=b"before"),
            row(topic, 1, qos=1, packet_id=-1, payload=b"secret-payload"),  # no ulong message-id: fails every time
            row(topic, 2, qos=1, packet_id=2, payload=b"after")]
    with caplog.at_level(logging.WARNING, logger="bridge.amqp"), Forwarder(make_config()) as fwd:
        res = fwd.forward(rows)
    assert (res.rows, res.accepted, res.unforwardable, res.unroutable) == (3, 2, 1, 0)
    [f] = res.failures
    assert (f.stream, f.partition, f.offset, f.rule) == ("mqtt-frames", 0, 1, "LG-amqp-unforwardable")
    assert f.error == "[LG-amqp-unforwardable] AssertionError: initializing ulong with negative value"
    assert [bytes(m.body) for m in consumer.wait(topic, 2)] == [b"before", b"after"]
    [line] = [r.getMessage() for r in caplog.records if "not forwardable" in r.getMessage()]
    assert line == ("AMQP row mqtt-frames/0/1 (payload 14 bytes) not forwardable, quarantined: "
                    "[LG-amqp-unforwardable] AssertionError: initializing ulong with negative value")
    assert "secret-payload" not in caplog.text
    assert res.as_dict()["unforwardable"] == 1 and "failures" not in res.as_dict()  # counts only


def test_lg_amqp_unforwardable_at_send_time_does_not_stop_the_forwarder(consumer, make_config):
    from bridge.amqp.wire import encode_row

    topic = consumer.topic("unforwardable-send")
    now = time.time()
    outs = [encode_row(row(topic, i, qos=1, packet_id=i + 1, payload=b"%d" % i), "seed", "/topic/{routing_key}", now)
            for i in range(3)]
    outs[1].delivery_count = 2**40  # the header cannot hold it: wire_bytes raises in the engine thread
    with Forwarder(make_config()) as fwd:
        res = fwd.forward_mapped(outs)
        assert (res.accepted, res.unforwardable) == (2, 1)
        assert res.failures[0].offset == 1 and res.failures[0].error.startswith("[LG-amqp-unforwardable] ValueError: ")
        again = fwd.forward([row(topic, 9, qos=1, packet_id=9, payload=b"9")])  # the engine thread lives on
    assert again.accepted == 1
    assert sorted(bytes(m.body) for m in consumer.wait(topic, 3)) == [b"0", b"2", b"9"]


def test_an_address_the_broker_refuses_fails_the_batch_naming_it(consumer, make_config):
    exchange = f"lakegate-missing-{uuid.uuid4().hex[:8]}"
    cfg = make_config(address_template=f"/exchange/{exchange}/{{routing_key}}", max_retries=1)
    with Forwarder(cfg) as fwd:
        with pytest.raises(ForwardError) as err:
            fwd.forward([row("dev/7/temp", 0, qos=1, packet_id=1)])
    assert str(err.value) == (
        f"AMQP peer refused the qos01 link to address '/exchange/{exchange}/dev.7.temp': "
        f"amqp:not-found: NOT_FOUND - no exchange '{exchange}' in vhost '/' (2 attempts)")
    assert err.value.address == f"/exchange/{exchange}/dev.7.temp"


def test_a_refused_address_among_good_ones(consumer, make_config):
    # RabbitMQ 3.x ends the whole session for a refused attach, taking the
    # good links with it: the forwarder blames the right address and goes on.
    exchange = f"lakegate-missing-{uuid.uuid4().hex[:8]}"
    good = f"/exchange/amq.topic/{consumer.prefix}.mix-{uuid.uuid4().hex[:8]}"
    bad = f"/exchange/{exchange}/x"
    with Forwarder(make_config(address_template="{topic}", max_retries=2)) as fwd:
        with pytest.raises(ForwardError, match=rf"^AMQP peer refused the qos01 link to address '{bad}': "
                                               rf"amqp:not-found: .* \(3 attempts\)$"):
            fwd.forward([row(good, 0, qos=1, packet_id=1), row(bad, 1, qos=1, packet_id=2),
                         row(good, 2, qos=1, packet_id=3)])
        assert fwd.forward([row(good, 3, qos=1, packet_id=4)]).accepted == 1
    # messages 0 and 2 may have been accepted before the batch failed: wait for 3 itself
    wait_for(lambda: "mqtt-frames/0/3" in {m.properties[ID_PROPERTY] for m in list(consumer.by_topic.get(good, []))},
             timeout=15, what="the message sent after the failed batch")


def test_enmasse_qos2_on_rabbitmq_3_names_rcv_settle_mode_second(make_config):
    with Forwarder(make_config(profile="enmasse")) as fwd:
        with pytest.raises(ForwardError, match=r"^AMQP peer refused the qos2 link to address '/topic/lg\.enm': "
                                               r"amqp:not-implemented: rcv-settle-mode second not supported "
                                               r"\(this peer cannot do rcv-settle-mode second: "
                                               r'set amqp.qos2_rcv_settle_mode = "first"\) \(1 attempt\)$'):
            fwd.forward([row("lg/enm", 0, qos=2, packet_id=1)])


@pytest.mark.parametrize("how", ["plain-from-config", "plain-from-environment", "plain-from-url", "anonymous"])
def test_sasl_plain_and_anonymous(how, consumer, make_config, rabbitmq):
    host = rabbitmq.split("@")[-1]
    topic = consumer.topic(how)
    env = {"LAKEGATE_AMQP_URL": f"amqp://{host}", "LAKEGATE_AMQP_USERNAME": "guest",
           "LAKEGATE_AMQP_PASSWORD": "guest", "LAKEGATE_AMQP_SASL_MECHANISMS": "PLAIN"}
    cfg = {
        "plain-from-config": make_config(url=f"amqp://{host}", username="guest", password="guest",
                                         sasl_mechanisms="PLAIN"),
        "plain-from-environment": load_config(None, env=env).amqp,
        "plain-from-url": make_config(url=rabbitmq, sasl_mechanisms="PLAIN"),
        "anonymous": make_config(url=f"amqp://{host}", sasl_mechanisms="ANONYMOUS"),
    }[how]
    with Forwarder(cfg) as fwd:
        assert fwd.forward([row(topic, 0, qos=1, packet_id=1)]).accepted == 1
    consumer.wait(topic, 1)


def test_wrong_password_fails_at_once_and_is_never_shown(make_config, rabbitmq, caplog):
    caplog.set_level(logging.DEBUG)
    host = rabbitmq.split("@")[-1]
    secret = "wr0ng-s3cret"
    with Forwarder(make_config(url=f"amqp://guest:{secret}@{host}")) as fwd:
        with pytest.raises(ForwardError, match=r"^AMQP connection to amqp://[\d.]+:\d+ failed: "
                                               r"amqp:unauthorized-access: .* \(1 attempt\)$") as err:
            fwd.forward([row("lg/auth", 0, qos=1, packet_id=1)])
    assert secret not in str(err.value)
    assert all(secret not in r.getMessage() for r in caplog.records)
