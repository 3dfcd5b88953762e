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


def test_the_reverse_table_lists_every_rule():
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


# ------------------------------------------------ absent and typed values (issue 39, items 1-2)
def wire(m: Message) -> Message:
    """``m`` as a peer receives it: encoded and decoded by proton."""
    out = Message()
    out.decode(m.encode())
    return out


def test_absent_fields_map_to_absent_mqtt_properties():
    d = map_message(wire(msg(address="t/1", body=b"p")), None, "seed", NOW)
    assert d.content_type is None  # proton 0.40 reads it as symbol('None')
    assert (d.correlation_data, d.response_topic, d.payload_format_indicator, d.expiry) == (
        None, None, None, None)
    assert d.user_properties == [] and d.retain is False and d.qos == 0


def test_a_content_type_that_says_none_is_kept():
    d = map_message(wire(msg(address="t/1", body=b"p", content_type="None")), None, "seed", NOW)
    assert d.content_type == "None"


@pytest.mark.parametrize("profile", sorted(REVERSE))
def test_typed_values_become_their_text_in_every_field(profile):
    from proton import byte, char, float32, short, timestamp, ubyte, uint, ulong, ushort

    props = {"u": uint(7), "neg": int32(-3), "l": ulong(2**40), "b": True, "f": False, "by": byte(-1),
             "ub": ubyte(255), "sh": short(-2), "us": ushort(9), "c": char("z"), "sym": symbol("s"),
             "ts": timestamp(1_700_000_000_000), "fl": float32(1.5), "d": 0.25, "n": None,
             "bin": b"\xc3\xa9", "uu": uuid.UUID(int=1), "list": [uint(1), "x", True],
             "map": {symbol("k"): int32(2)}}
    m = msg(address=symbol("t/typed"), body=b"p", properties=props, correlation_id=ulong(42),
            reply_to=symbol("/topic/resp.dev7"), content_type=symbol("text/plain"),
            annotations={symbol(QOS[profile]): ubyte(1), symbol(RETAIN[profile]): True})
    d = map_message(wire(m), None, profile, NOW)
    assert d.topic == "t/typed" and d.qos == 1 and d.retain is True
    assert d.correlation_data == b"42" and d.response_topic == "resp/dev7" and d.content_type == "text/plain"
    assert dict(d.user_properties) == {
        "u": "7", "neg": "-3", "l": str(2**40), "b": "true", "f": "false", "by": "-1", "ub": "255",
        "sh": "-2", "us": "9", "c": "z", "sym": "s", "ts": "1700000000000", "fl": "1.5", "d": "0.25",
        "n": "", "bin": "é", "uu": str(uuid.UUID(int=1)), "list": '[1,"x",true]', "map": '{"k":2}'}
    assert all("(" not in v for _, v in d.user_properties)


@pytest.mark.parametrize("profile", sorted(REVERSE))
def test_lg_amqp_qos_a_typed_qos_out_of_range_is_described_by_its_value(profile):
    from proton import uint

    with pytest.raises(ReverseMappingError) as e:
        map_message(wire(msg(address="t", body=b"", annotations={symbol(QOS[profile]): uint(5)})),
                    None, profile, NOW)
    assert e.value.rule == BAD_QOS and "'5'" in str(e.value) and "uint" not in str(e.value)


def test_retain_annotation_as_text():
    for text, want in (("true", True), ("false", False), ("0", False)):
        d = map_message(wire(msg(address="t", body=b"", annotations={symbol("x-retain"): text})),
                        None, "seed", NOW)
        assert d.retain is want, text


def test_lg_amqp_payload_format_an_indicator_other_than_0_or_1_is_rejected():
    from proton import ubyte

    from bridge.amqp.mapping import ANN_PAYLOAD_FORMAT
    from bridge.amqp.reverse import BAD_PFI

    ok = map_message(wire(msg(address="t", body=b"", annotations={symbol(ANN_PAYLOAD_FORMAT): ubyte(1)})),
                     None, "seed", NOW)
    assert ok.payload_format_indicator == 1
    for bad in (ubyte(2), "x"):
        with pytest.raises(ReverseMappingError) as e:
            map_message(wire(msg(address="t", body=b"", annotations={symbol(ANN_PAYLOAD_FORMAT): bad})),
                        None, "seed", NOW)
        assert e.value.rule == BAD_PFI and "MQTT-3.3.2-4" in str(e.value)


# ------------------------------------------------ the configured address template (issue 39, item 3)
@pytest.mark.parametrize("template, address, topic", [
    ("topic://{routing_key}", "topic://resp.dev7", "resp/dev7"),
    ("topic://{topic}", "topic://resp/dev7", "resp/dev7"),
    ("/exchange/events/{routing_key}", "/exchange/events/a.b.c", "a/b/c"),
    ("{routing_key}", "a.b", "a/b"),
    ("topic://{routing_key}", "/topic/x.y", "x/y"),  # RabbitMQ's forms still understood
    ("topic://{routing_key}", "queue://orders", None),
    ("topic://{routing_key}", "topic://", None),
    (None, "topic://x.y", None),
])
def test_topic_of_address_inverts_the_address_template(template, address, topic):
    assert topic_of_address(address, template) == topic


def test_request_response_through_another_peers_template():
    t = "topic://{routing_key}"
    d = map_message(wire(msg(address="t/req", body=b"", reply_to="topic://resp.dev7")), None, "seed",
                    NOW, address_template=t)
    assert d.response_topic == "resp/dev7"
    # no 'to': the topic is the link's address, read through the template
    d = map_message(wire(msg(body=b"x")), "topic://cmd.devices.9", "seed", NOW, address_template=t)
    assert d.topic == "cmd/devices/9"
    # the forward mapping's reply-to and the reverse mapping agree
    from bridge.amqp.mapping import address_for

    assert topic_of_address(address_for("t/resp/1", t), t) == "t/resp/1"


def test_lg_amqp_no_topic_an_activemq_wildcard_address_names_no_topic():
    with pytest.raises(ReverseMappingError) as e:
        map_message(wire(msg(body=b"x")), "topic://cmd.>", "seed", NOW, address_template="topic://{routing_key}")
    assert e.value.rule == NO_TOPIC


def test_the_amqp_to_mqtt_page_shows_the_seed_profiles_table_as_the_code_has_it():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "amqp-to-mqtt.md").read_text()
    assert reverse_table_markdown("seed") in page  # python -m bridge.commands.docs_reference writes it
