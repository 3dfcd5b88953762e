"""The MQTT -> AMQP mapping, without a broker: every field of both profiles."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cproton import pn_message_get_content_type
from proton import Message, int32, symbol, ubyte

from bridge.amqp.mapping import (
    ANN_CONTENT_TYPE,
    ANN_PAYLOAD_FORMAT,
    ANN_USER_PROPERTIES,
    ID_PROPERTY,
    LINK_QOS01,
    LINK_QOS2,
    PROFILES,
    MappingError,
    address_for,
    map_row,
    mapping_table_markdown,
    routing_key,
    user_properties_map,
)
from tests.amqp.rows import row

ROOT = Path(__file__).resolve().parents[2]
T = "/topic/{routing_key}"
NOW = 1_700_000_000.0


def roundtrip(msg: Message) -> Message:
    out = Message()
    out.decode(msg.encode())
    return out


def full_row(**kw):
    fields = dict(qos=1, packet_id=7, retain=True, dup=True, payload=b"\x00\x01hi",
                  payload_format_indicator=1, message_expiry_interval=60, response_topic="replies/dev1",
                  correlation_data=b"\x01\x02", user_properties=[{"key": "a", "value": "1"}, {"key": "b", "value": "2"}],
                  content_type="application/json", partition=3,
                  receive_time=dt.datetime.fromtimestamp(NOW - 10, dt.timezone.utc))
    fields.update(kw)
    return row("sensors/v1.2/temp", 41, **fields)


def content_type(m: Message):
    """The content-type, None when absent (proton's getter says symbol('None'))."""
    return pn_message_get_content_type(m._msg)


# ------------------------------------------------------------------ seed
@pytest.mark.parametrize("qos, link, durable", [(0, LINK_QOS01, False), (1, LINK_QOS01, True), (2, LINK_QOS2, True)])
def test_seed_publish_fields_per_qos(qos, link, durable):
    out = map_row(row("a/b", 5, qos=qos, packet_id=None if qos == 0 else 9, payload=b"p"), "seed", T, NOW)
    assert (out.address, out.link, out.qos, out.kind, out.key) == ("/topic/a.b", link, qos, "publish", "mqtt-frames/0/5")
    m = roundtrip(out.message)
    assert m.subject == "publish"
    assert m.id == (None if qos == 0 else 9)
    assert m.address == "a/b"
    assert m.durable is durable
    assert m.delivery_count == 0
    assert m.annotations == {symbol("x-retain"): False, symbol("x-qos"): qos}
    assert type(out.message.annotations[symbol("x-qos")]) is int32
    assert bytes(m.body) == b"p" and m.inferred  # one Data section
    assert m.properties == {ID_PROPERTY: "mqtt-frames/0/5"}
    assert m.ttl == 0 and content_type(m) is None and m.reply_to is None and m.correlation_id is None


def test_seed_retain_and_dup():
    m = roundtrip(map_row(row("a", 1, qos=1, packet_id=3, retain=True, dup=True), "seed", T, NOW).message)
    assert m.annotations[symbol("x-retain")] is True
    assert m.delivery_count == 1


def test_message_id_is_ulong():
    enc = map_row(row("a", 1, qos=1, packet_id=65535), "seed", T, NOW).message.encode()
    assert b"\x80" + (65535).to_bytes(8, "big") in enc  # ulong constructor 0x80


def test_payload_is_one_data_section_even_when_empty():
    for payload in (b"", None, b"\x00" * 3):
        enc = map_row(row("a", 1, payload=payload), "seed", T, NOW).message.encode()
        assert enc.count(b"\x00\x53\x75") == 1  # data section descriptor
        assert b"\x00\x53\x77" not in enc  # no amqp-value section


def test_seed_pubrel():
    out = map_row(row("a/b", 8, kind="pubrel", packet_id=9, qos=None), "seed", T, NOW)
    assert (out.address, out.link, out.qos, out.kind) == ("/topic/a.b", LINK_QOS2, 2, "pubrel")
    m = roundtrip(out.message)
    assert (m.subject, m.id, m.address, m.durable) == ("pubrel", 9, "a/b", True)
    assert m.annotations is None
    assert m.properties == {ID_PROPERTY: "mqtt-frames/0/8"}
    assert m.body is None


# ------------------------------------------------------------------ enmasse
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_enmasse_publish(qos):
    out = map_row(row("a/b", 5, qos=qos, packet_id=None if qos == 0 else 4, retain=True, dup=True, payload=b"z"),
                  "enmasse", T, NOW)
    m = roundtrip(out.message)
    assert m.subject is None
    assert m.annotations == {symbol("x-opt-retain-message"): True, symbol("x-opt-mqtt-qos"): qos}
    assert (m.address, m.durable, m.delivery_count, bytes(m.body)) == ("a/b", qos > 0, 1, b"z")
    assert out.link == (LINK_QOS2 if qos == 2 else LINK_QOS01)


def test_enmasse_pubrel_keeps_its_subject_and_qos2_link_is_second():
    m = roundtrip(map_row(row("a", 2, kind="pubrel", packet_id=4), "enmasse", T, NOW).message)
    assert (m.subject, m.id) == ("pubrel", 4)
    assert PROFILES["enmasse"].qos2_rcv_settle_mode == 1
    assert PROFILES["seed"].qos2_rcv_settle_mode == 0


# ------------------------------------------------------------------ MQTT 5
@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_mqtt5_properties(profile):
    out = map_row(full_row(), profile, T, NOW)
    m = roundtrip(out.message)
    assert m.content_type == "application/json"
    assert bytes(m.correlation_id) == b"\x01\x02"
    assert m.reply_to == "/topic/replies.dev1"
    assert m.ttl == pytest.approx(50.0)  # 60 s expiry, received 10 s ago
    assert m.properties == {"a": "1", "b": "2", ID_PROPERTY: "mqtt-frames/3/41"}
    assert m.annotations[symbol(ANN_PAYLOAD_FORMAT)] == 1
    assert type(out.message.annotations[symbol(ANN_PAYLOAD_FORMAT)]) is ubyte
    assert symbol(ANN_USER_PROPERTIES) not in m.annotations


def test_ttl_is_whole_milliseconds_remaining_at_send_time():
    r = row("a", 1, qos=1, packet_id=1, message_expiry_interval=2, receive_time=NOW - 0.7655)
    m = map_row(r, "seed", T, NOW).message
    assert roundtrip(m).ttl == pytest.approx(1.234, abs=1e-9)  # floor(1234.5 ms)


def test_expired_message_is_not_mapped():
    r = row("a", 1, qos=1, packet_id=1, message_expiry_interval=5, receive_time=NOW - 5)
    out = map_row(r, "seed", T, NOW)
    assert out.expired and out.message is None and out.expires_at == NOW


def test_no_receive_time_counts_from_now():
    out = map_row(row("a", 1, message_expiry_interval=3), "seed", T, NOW)
    assert out.expires_at == NOW + 3


def test_non_ascii_content_type_goes_to_an_annotation():
    m = roundtrip(map_row(row("a", 1, content_type="text/plain; charset=ü"), "seed", T, NOW).message)
    assert content_type(m) is None
    assert m.annotations[symbol(ANN_CONTENT_TYPE)] == "text/plain; charset=ü"


def test_repeated_user_property_keys_first_value_wins_full_list_annotated():
    ups = [{"key": "k", "value": "1"}, {"key": "z", "value": "x"}, {"key": "k", "value": "2"},
           {"key": ID_PROPERTY, "value": "theirs"}]
    m = roundtrip(map_row(row("a", 1, user_properties=ups), "seed", T, NOW).message)
    assert m.properties == {"k": "1", "z": "x", ID_PROPERTY: "mqtt-frames/0/1"}
    assert list(m.properties) == ["k", "z", ID_PROPERTY]
    assert m.annotations[symbol(ANN_USER_PROPERTIES)] == [["k", "1"], ["z", "x"], ["k", "2"], [ID_PROPERTY, "theirs"]]


def test_user_properties_map_accepts_tuples_and_none():
    assert user_properties_map(None) == (None, None)
    assert user_properties_map([("a", "1")]) == ({"a": "1"}, None)


# ------------------------------------------------------------------ addresses
def test_routing_key_maps_slash_to_dot_and_leaves_the_rest():
    assert routing_key("a/b/c") == "a.b.c"
    assert routing_key("v1.2/x") == "v1.2.x"  # '.' stays: a word separator, as in RabbitMQ's MQTT plugin
    assert routing_key("/a//b*") == ".a..b*"  # '*' is literal in a routing key


def test_address_template_placeholders():
    assert address_for("a/b", "/topic/{routing_key}") == "/topic/a.b"
    assert address_for("a/b", "{topic}") == "a/b"
    assert address_for("a/b", "/exchange/mqtt/{routing_key}") == "/exchange/mqtt/a.b"
    assert address_for("a/b", "x{y}/{topic}") == "x{y}/a/b"


def test_to_stays_verbatim_whatever_the_address():
    out = map_row(row("a/b.c", 1), "seed", "/exchange/x/{routing_key}", NOW)
    assert out.address == "/exchange/x/a.b.c" and out.message.address == "a/b.c"


def test_row_without_topic_is_a_mapping_error():
    with pytest.raises(MappingError, match=r"^mqtt-frames/0/4: pubrel has no topic$"):
        map_row(row(None, 4, kind="pubrel"), "seed", T, NOW)


# ------------------------------------------------------------------ tables are data
def _present(m: Message) -> set[tuple[str, str]]:
    got = set()
    for name, value in (("durable", m.durable), ("delivery-count", m.delivery_count), ("ttl", m.ttl)):
        if value not in (None, 0, 0.0, False) or name == "durable":
            got.add(("header", name))
    for name, value in (("subject", m.subject), ("message-id", m.id), ("to", m.address),
                        ("content-type", content_type(m)), ("correlation-id", m.correlation_id),
                        ("reply-to", m.reply_to), ("absolute-expiry-time", m.expiry_time or None)):
        if value is not None:
            got.add(("properties", name))
    for k in m.annotations or {}:
        got.add(("message-annotations", str(k)))
    for k in m.properties or {}:
        got.add(("application-properties", k if k == ID_PROPERTY else "<key>"))
    if m.body is not None:
        got.add(("body", "data"))
    return got


@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_every_table_rule_and_only_those_make_the_message(profile):
    prof = PROFILES[profile]
    dup_ups = [{"key": "k", "value": "1"}, {"key": "k", "value": "2"}]
    loaded = [full_row(), full_row(content_type="ü", user_properties=dup_ups, message_expiry_interval=2**32 - 1)]
    seen: set[tuple[str, str]] = set()
    for r in loaded:
        m = roundtrip(map_row(r, prof, T, NOW).message)
        got = _present(m)
        assert got <= {(rule.section, rule.name) for rule in prof.publish}
        seen |= got
    assert seen == {(rule.section, rule.name) for rule in prof.publish}
    m = roundtrip(map_row(row("a", 1, kind="pubrel", packet_id=1), prof, T, NOW).message)
    assert _present(m) == {(rule.section, rule.name) for rule in prof.pubrel}


@pytest.mark.parametrize("profile", ["seed", "enmasse"])
def test_the_amqp_pages_mapping_table_is_generated_from_the_rules(profile):
    page = (ROOT / "docs" / "amqp.md").read_text()  # python -m bridge.commands.docs_reference writes it
    assert mapping_table_markdown(profile) in page


def test_every_header_and_property_rule_of_every_profile_has_a_setter():
    from bridge.amqp.mapping import _SETTERS, HEADER, PROFILES, PROPERTIES

    for name, prof in PROFILES.items():
        for rule in (*prof.publish, *prof.pubrel):
            if rule.section in (HEADER, PROPERTIES):
                assert (rule.section, rule.name) in _SETTERS, (name, rule.section, rule.name)
