"""The error tree: IncompleteData apart, message format, reasons from the table."""

from __future__ import annotations

import pytest

from bridge.mqtt import IncompleteData, MalformedPacket, MqttError, ProtocolError, violation
from bridge.mqtt.rules import RULES


def test_incomplete_data_is_not_an_mqtt_error():
    assert not issubclass(IncompleteData, MqttError)
    err = IncompleteData(10, 4)
    assert (err.needed, err.have, err.missing) == (10, 4, 6)
    assert IncompleteData().missing is None


def test_message_starts_with_the_rule():
    err = MalformedPacket("MQTT-3.3.1-4", "PUBLISH has both QoS bits set")
    assert str(err) == "[MQTT-3.3.1-4] PUBLISH has both QoS bits set"
    assert (err.rule, err.reason_code, err.kind) == ("MQTT-3.3.1-4", 0x81, "malformed")


def test_reason_code_comes_from_the_table_unless_given():
    assert ProtocolError("MQTT-3.3.2-9", "alias 11 > 10").reason_code == 0x94
    assert ProtocolError("MQTT-3.3.4-7", "too many").reason_code == 0x93
    assert ProtocolError("not-a-rule", "x").reason_code == 0x82
    assert MalformedPacket("not-a-rule", "x").reason_code == 0x81
    assert ProtocolError("MQTT-3.3.2-9", "x", reason_code=0x82).reason_code == 0x82


@pytest.mark.parametrize("rule", sorted(RULES))
def test_violation_builds_the_class_of_the_table(rule):
    err = violation(rule, "detail", packet_type=3, protocol_level=5)
    expected = MalformedPacket if RULES[rule].kind == "malformed" else ProtocolError
    assert type(err) is expected
    assert err.reason_code == RULES[rule].reason_code
    assert (err.packet_type, err.protocol_level) == (3, 5)
    assert str(err) == f"[{rule}] detail"
    assert rule in repr(err)


def test_violation_rejects_unknown_rules():
    with pytest.raises(KeyError):
        violation("MQTT-9.9.9-9", "x")
