"""The reverse mapping, AMQP 1.0 message -> MQTT (bridge/amqp/reverse.py),
in both profiles; and that it inverts the forward mapping
(bridge/amqp/mapping.py) for every MQTT 5 field the forward mapping carries."""

from __future__ import annotations

import uuid

import pytest
from proton import Message, int32, symbol

from bridge.amqp.mapping import map_row
from bridge.amqp.reverse import (
    BAD_BODY, BAD_QOS, NO_TOPIC, OWN, REVERSE, ReverseMappingError, map_message,
    reverse_table_markdown, topic_of_address,
)

NOW = 1_800_000_000.0
QOS = {"seed": "x-qos", "enmasse": "x-opt-mqtt-qos"}
RETAIN = {"seed": "x-retain", "enmasse": "x-opt-retain-message"}


def msg(**kw) -> Message:
    m = Message()
    for k, v in kw.items():
        setattr(m, k, v)
    return m


@pytest.mark.parametrize("profile", sorted(REVERSE))
def test_fields_from_the_profiles_annotations(profile):
    m = msg(address="devices/7/cmd", body=b"on", durable=False,
            annotations={symbol(QOS[profile]): int32(2), symbol(RETAIN[profile]): True})
    d = map_message(m, "$mqtt.to.dev7", profile, NOW)
    assert (d.topic, d.payload, d.qos, d.retain, d.pubrel) == ("devices/7/cmd", b"on", 2, True, False)


@pytest.mark.parametrize("durable, qos", [(True, 1), (False, 0)])
def test_without_the_qos_annotation_durable_decides(durable, qos):
    d = map_message(msg(address="a/b", body=b"x", durable=durable), None, "seed", NOW)
    assert d.qos == qos


def test_topic_from_a_topic_address_when_there_is_no_to():
    for address in ("/topic/site.a.temp", "/exchange/amq.topic/site.a.temp"):
        d = map_message(msg(body=b"x"), address, "seed", NOW)
        assert d.topic == "site/a/temp"
    assert topic_of_address("$mqtt.to.dev7") is None and topic_of_address("/amq/queue/q") is None


@pytest.mark.parametrize("to, address, why", [
    (None, "$mqtt.to.dev7", "names no topic"),
    ("a/+/b", None, "MQTT-3.3.2-2"),
    ("a/#", None, "MQTT-3.3.2-2"),
    (None, "/topic/a\x00b", "MQTT-4.7.3-2"),  # (proton's own 'to' stops at U+0000)
    ("x" * 65536, None, "MQTT-4.7.3-3"),
])
def test_lg_amqp_no_topic_a_message_without_a_usable_topic_is_rejected(to, address, why):
    with pytest.raises(ReverseMappingError) as e:
        map_message(msg(address=to, body=b"x"), address, "seed", NOW)
    assert e.value.rule == NO_TOPIC and why in str(e.value) and str(e.value).startswith(f"[{NO_TOPIC}]")


def test_lg_amqp_body_an_amqp_value_string_is_utf8_and_other_bodies_are_rejected():
    d = map_message(msg(address="a", body="grüß"), None, "seed", NOW)
    assert d.payload == "grüß".encode() and d.payload_format_indicator == 1
    assert map_message(msg(address="a", body=None), None, "seed", NOW).payload == b""
    for body in ([1, 2], {"k": "v"}, 42):
        with pytest.raises(ReverseMappingError) as e:
            map_message(msg(address="a", body=body), None, "seed", NOW)
        assert e.value.rule == BAD_BODY


@pytest.mark.parametrize("value", [3, -1, "x"])
def test_lg_amqp_qos_a_qos_annotation_out_of_range_is_rejected(value):
    with pytest.raises(ReverseMappingError) as e:
        map_message(msg(address="a", body=b"", annotations={symbol("x-qos"): value}), None, "seed", NOW)
    assert e.value.rule == BAD_QOS


def test_mqtt_3_3_2_5_expiry_from_ttl_or_absolute_expiry_time():
    assert map_message(msg(address="a", body=b"", ttl=1.5), None, "seed", NOW).expiry == 2
    assert map_message(msg(address="a", body=b""), None, "seed", NOW).expiry is None
    late = map_message(msg(address="a", body=b"", expiry_time=NOW + 90.2), None, "seed", NOW)
    assert late.expiry == 91 and not late.expired
    gone = map_message(msg(address="a", body=b"", expiry_time=NOW - 1), None, "seed", NOW)
    assert gone.expired


def test_properties_inverse_of_the_forward_mapping_mqtt_3_3_2_18():
    row = {"topic": "t/1", "payload": b"p", "qos": 1, "retain": False, "stream": "s", "partition": 0,
           "offset": 9, "packet_id": 5, "content_type": "application/json",
           "correlation_data": b"\x00\x01", "response_topic": "reply/here",
           "payload_format_indicator": 1, "message_expiry_interval": 60,
           "receive_time": NOW, "user_properties": [("a", "1"), ("b", "2"), ("a", "3")]}
    out = map_row(row, "seed", "/topic/{routing_key}", NOW)
    m = out.message
    m.properties = {k: v for k, v in m.properties.items() if k != "lakegate-id"}  # not ours
    d = map_message(m, out.address, "seed", NOW)
    assert (d.topic, d.payload, d.qos, d.content_type, d.correlation_data) == (
        "t/1", b"p", 1, "application/json", b"\x00\x01")
    assert d.response_topic == "reply/here" and d.payload_format_indicator == 1
    assert d.user_properties == [("a", "1"), ("b", "2"), ("a", "3")]  # in order, repeats kept
    assert d.expiry == 60


def test_correlation_id_of_other_types_becomes_text():
    u = uuid.UUID(int=7)
    assert map_message(msg(address="a", body=b"", correlation_id=u), None, "seed", NOW
                       ).correlation_data == str(u).encode()
    assert map_message(msg(address="a", body=b"", correlation_id="req-1"), None, "seed", NOW
                       ).correlation_data == b"req-1"


def test_application_properties_become_user_properties_as_text():
    d = map_message(msg(address="a", body=b"", properties={"n": 5, "s": "x"}), None, "seed", NOW)
    assert d.user_properties == [("n", "5"), ("s", "x")]


def test_a_message_lakegate_forwarded_itself_is_not_delivered_again():
    assert map_message(msg(address="a", body=b"", properties={"lakegate-id": "s/0/1"}),
                       None, "seed", NOW) is OWN


def test_amqp_pubrel_is_qos_2s_second_step():
    d = map_message(msg(address="a/b", subject="pubrel", id=17), None, "enmasse", NOW)
    assert d.pubrel and d.qos == 2 and d.message_id == 17 and d.topic == "a/b"


def test_the_readme_table_lists_every_rule():
    text = reverse_table_markdown("seed")
    assert all(r.mqtt in text for r in REVERSE["seed"]) and "x-qos" in text
    assert "x-opt-mqtt-qos" in reverse_table_markdown("enmasse")


def test_lg_amqp_no_topic_a_wildcard_address_names_no_topic_and_x_routing_key_does():
    with pytest.raises(ReverseMappingError) as e:
        map_message(msg(body=b"x"), "/topic/site.#", "seed", NOW)
    assert e.value.rule == NO_TOPIC and "no 'to'" in str(e.value)
    d = map_message(msg(body=b"x", annotations={symbol("x-routing-key"): "site.a.temp"}),
                    "/topic/site.#", "seed", NOW)
    assert d.topic == "site/a/temp"
