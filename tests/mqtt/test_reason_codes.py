"""Reason-code enums against the standard's tables, and validity per family."""

from __future__ import annotations

import pytest

from bridge.mqtt import PacketType, ProtocolError
from bridge.mqtt.reason_codes import (
    AuthReason, ConnackReturnCode, ConnectReason, DisconnectReason, PubAckReason, PubRelReason,
    SubackReason, UnsubackReason, check_reason, connack_v3_code, valid_reasons,
)

# Values typed from MQTT 5.0 tables 3-1, 3-4..3-11 and MQTT 3.1.1 table 3.1.
EXPECTED = {
    ConnackReturnCode: {0, 1, 2, 3, 4, 5},
    ConnectReason: {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A,
                    0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F},
    PubAckReason: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
    PubRelReason: {0x00, 0x92},
    SubackReason: {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2},
    UnsubackReason: {0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91},
    DisconnectReason: {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F,
                       0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D,
                       0x9E, 0x9F, 0xA0, 0xA1, 0xA2},
    AuthReason: {0x00, 0x18, 0x19},
}


@pytest.mark.parametrize("enum", list(EXPECTED), ids=lambda e: e.__name__)
def test_enum_values_match_the_standard(enum):
    assert {int(c) for c in enum} == EXPECTED[enum]


@pytest.mark.parametrize("ptype, level, codes", [
    (PacketType.PUBACK, 5, EXPECTED[PubAckReason]),
    (PacketType.PUBREC, 5, EXPECTED[PubAckReason]),
    (PacketType.PUBREL, 5, EXPECTED[PubRelReason]),
    (PacketType.PUBCOMP, 5, EXPECTED[PubRelReason]),
    (PacketType.SUBACK, 3, {0, 1, 2}),
    (PacketType.SUBACK, 4, {0, 1, 2, 0x80}),
    (PacketType.SUBACK, 5, EXPECTED[SubackReason]),
    (PacketType.UNSUBACK, 5, EXPECTED[UnsubackReason]),
    (PacketType.CONNACK, 4, EXPECTED[ConnackReturnCode]),
    (PacketType.CONNACK, 5, EXPECTED[ConnectReason]),
])
def test_valid_reasons_per_family(ptype, level, codes):
    assert valid_reasons(ptype, level) == codes
    for code in range(256):
        if code in codes:
            check_reason(ptype, code, level, False)
        else:
            with pytest.raises(ProtocolError):
                check_reason(ptype, code, level, False)


def test_disconnect_and_auth_restrict_by_sender():
    client = valid_reasons(PacketType.DISCONNECT, 5, True)
    server = valid_reasons(PacketType.DISCONNECT, 5, False)
    assert 0x04 in client and 0x04 not in server
    assert 0x8B in server and 0x8B not in client
    assert client & server >= {0x00, 0x80, 0x81, 0x82, 0x83, 0x90, 0x93, 0x94, 0x95, 0x96,
                               0x97, 0x98, 0x99}
    assert valid_reasons(PacketType.AUTH, 5, True) == {0x18, 0x19}
    assert valid_reasons(PacketType.AUTH, 5, False) == {0x00, 0x18}


def test_connack_v3_code_mapping():
    assert connack_v3_code(0x84) == 1 and connack_v3_code(0x85) == 2
    assert connack_v3_code(0x88) == 3 and connack_v3_code(0x86) == 4
    assert connack_v3_code(0x87) == 5 and connack_v3_code(0x00) == 0
    assert connack_v3_code(0x81) is None
