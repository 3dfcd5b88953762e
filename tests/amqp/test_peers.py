"""Peer profiles (``amqp.peer``, bridge/peers.py) and the characters a topic
must not hold in an address [LG-amqp-address-chars] (issue 39, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message

from bridge.amqp.addresses import RESERVED_PROPERTY, ReservedPropertyError
from bridge.amqp.mapping import ADDRESS_CHARS, AddressCharsError, address_for, map_row
from bridge.amqp.reverse import ReverseMappingError, map_message
from bridge.amqp.unforwardable import unforwardable
from bridge.amqp.wire import encode_row
from bridge.config import ConfigError, load_config
from bridge.peers import PEERS, peer_table_markdown

ROOT = Path(__file__).resolve().parents[2]


def row(topic: str, **fields):
    base = {"kind": "publish", "topic": topic, "qos": 1, "payload": b"x", "packet_id": 7, "retain": False,
            "dup": False, "stream": "s", "partition": 0, "offset": 11}
    base.update(fields)
    return base


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_a_peer_gives_the_address_keys_their_defaults(peer):
    cfg = load_config(None, [f"amqp.peer={peer}"], env={})
    p = PEERS[peer]
    assert (cfg.amqp.address_template, cfg.amqp.client_address_template, cfg.amqp.downlink_topic_address,
            cfg.amqp.address_refuse, cfg.amqp.property_refuse) == (
        p.address_template, p.client_address_template, p.downlink_topic_address, p.refuse, p.property_refuse)


def test_a_key_set_by_the_user_wins_over_the_peer(tmp_path):
    cfg = load_config(None, ["amqp.peer=artemis", "amqp.address_template=topic://{topic}",
                             "amqp.address_refuse="], env={})
    assert cfg.amqp.address_template == "topic://{topic}" and cfg.amqp.address_refuse == ""
    assert cfg.amqp.client_address_template == PEERS["artemis"].client_address_template
    f = tmp_path / "c.toml"  # from a file too: set is set, whatever the value
    f.write_text('[amqp]\npeer = "generic"\ndownlink_topic_address = "/topic/#"\n')
    cfg = load_config(f, env={})
    assert cfg.amqp.downlink_topic_address == "/topic/#" and cfg.amqp.address_template == "{topic}"


def test_the_default_peer_is_rabbitmq_and_the_builtin_defaults_are_its():
    cfg = load_config(None, env={})
    p = PEERS["rabbitmq"]
    assert cfg.amqp.peer == "rabbitmq"
    assert (cfg.amqp.address_template, cfg.amqp.client_address_template) == (p.address_template,
                                                                            p.client_address_template)


def test_an_unknown_peer_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="amqp.peer.*rabbitmq, artemis, generic"):
        load_config(None, ["amqp.peer=qpid"], env={})


@pytest.mark.parametrize("topic, bad", [("t/x,y/end", ","), ("t/a*b", "*"), ("t/>", ">"), ("t/q::r", "::")])
def test_lg_amqp_address_chars_a_topic_never_fans_out_on_a_generic_peer(topic, bad):
    # ActiveMQ sent t/x,y/end to topic://t.x AND topic://y.end: a list of destinations
    refuse = PEERS["generic"].refuse
    with pytest.raises(AddressCharsError, match=rf"\[{ADDRESS_CHARS}\].*holds '{'[*]' if bad == '*' else bad}'"):
        address_for(topic, "topic://{routing_key}", refuse)
    with pytest.raises(AddressCharsError):
        map_row(row(topic), "seed", "{topic}", 0.0, refuse)
    with pytest.raises(AddressCharsError):
        encode_row(row(topic), "seed", "{topic}", 0.0, refuse)


def test_lg_amqp_address_chars_a_response_topic_too():
    with pytest.raises(AddressCharsError):
        encode_row(row("ok/t", response_topic="reply/a*"), "seed", "topic://{routing_key}", 0.0, "* #")


def test_lg_amqp_address_chars_what_the_peer_does_not_read_goes_as_it_is():
    # RabbitMQ routes by routing key: '*' and ',' in a routing key are plain characters
    assert address_for("t/x,y/a*b", "/topic/{routing_key}", PEERS["rabbitmq"].refuse) == "/topic/t.x,y.a*b"
    out = encode_row(row("t/x,y"), "seed", "/topic/{routing_key}", 0.0, "")
    assert out.address == "/topic/t.x,y"
    # a template without a placeholder of the topic is not the topic's business
    assert address_for("a*", "fixed", "*") == "fixed"


def test_lg_amqp_address_chars_the_quarantine_row_names_the_rule():
    try:
        encode_row(row("t/a*b"), "seed", "{topic}", 0.0, "*")
    except AddressCharsError as exc:
        u = unforwardable(row("t/a*b"), exc)
    assert u.rule == ADDRESS_CHARS and u.error.startswith(f"[{ADDRESS_CHARS}]")
    assert (u.stream, u.partition, u.offset) == ("s", 0, 11)


@pytest.mark.parametrize("pairs", [[["_AMQ_DUPL_ID", "x"]], [{"key": "a", "value": "1"}, {"key": "_AMQ_X", "value": ""}]])
@pytest.mark.parametrize("encode", [encode_row, map_row])
def test_lg_amqp_reserved_property_quarantined_on_artemis_sent_elsewhere(encode, pairs):
    r = row("t/1", user_properties=pairs)
    reserved = load_config(None, ["amqp.peer=artemis"], env={}).amqp.property_refuse
    with pytest.raises(ReservedPropertyError) as caught:
        encode(r, "seed", "topic://{routing_key}", 0.0, "", reserved)
    u = unforwardable(r, caught.value)
    assert u.rule == RESERVED_PROPERTY and u.error.startswith(f"[{RESERVED_PROPERTY}] s/0/11: User Property '_AMQ_")
    for peer in ("rabbitmq", "generic"):  # they read no application property: it goes
        assert encode(r, "seed", "{topic}", 0.0, "", PEERS[peer].property_refuse).address == "t/1"
    assert encode(row("t/1", user_properties=[["_amq_dupl_id", "x"], ["x_AMQ_", "y"]]), "seed", "{topic}", 0.0, "",
                  reserved).address == "t/1"  # a prefix, case and all
    assert encode(row("t/1", kind="pubrel"), "seed", "{topic}", 0.0, "", reserved).address == "t/1"


def test_lg_amqp_address_chars_the_downlink_rejects_an_address_derived_topic_holding_it():
    m = Message(body=b"on")  # no 'to': the topic comes from the address
    with pytest.raises(ReverseMappingError) as err:
        map_message(m, "topic://cmd.q::r", "seed", 0.0, "topic://{routing_key}", "* # ::")
    assert err.value.rule == ADDRESS_CHARS
    # with 'to' the topic is the one sent, whatever the address
    m.address = "cmd/q::r"
    assert map_message(m, "topic://cmd.q::r", "seed", 0.0, "topic://{routing_key}", "* # ::").topic == "cmd/q::r"
    # and the same address names its topic where the peer reads nothing in it
    assert map_message(Message(body=b"on"), "topic://cmd.q::r", "seed", 0.0, "topic://{routing_key}",
                       "").topic == "cmd/q::r"


def test_the_amqp_page_shows_the_peer_table_as_the_code_has_it():
    assert peer_table_markdown() in (ROOT / "docs" / "amqp.md").read_text()  # bridge.commands.docs_reference
