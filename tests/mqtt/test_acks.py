"""PUBACK, PUBREC, PUBREL, PUBCOMP: malformed-input table and the short forms."""

from __future__ import annotations

import pytest

from bridge.mqtt import (
    MalformedPacket, Properties, ProtocolError, PubAck, PubComp, PubRec, PubRel, decode_packet,
    encode,
)
from tests.mqtt.helpers import Bad, check_bad, params, wire

M, P = MalformedPacket, ProtocolError

CASES = [
    Bad("MQTT-2.2.1-5-puback-packet-id-0", 5, """
        40 03           # PUBACK, Remaining Length 3
        0000            # Packet Identifier 0
        00              # Success
        """, P, "MQTT-2.2.1-5", 0x82, "PUBACK has Packet Identifier 0"),
    Bad("MQTT-2.2.1-5-pubrel-packet-id-0-3.1.1", 4, """
        62 02 0000      # PUBREL, Packet Identifier 0
        """, P, "MQTT-2.2.1-5", 0x82, "PUBREL has Packet Identifier 0"),
    Bad("MQTT-2.1.3-1-puback-flags", 4, """
        42 02 0001      # PUBACK with flag bit 1 set
        """, M, "MQTT-2.1.3-1", 0x81, "PUBACK fixed-header flags are 0x2, not 0x0"),
    Bad("MQTT-2.1.3-1-pubrec-flags", 5, """
        58 03 0001 00   # PUBREC with flag bit 3 set
        """, M, "MQTT-2.1.3-1", 0x81, "PUBREC fixed-header flags are 0x8, not 0x0"),
    Bad("MQTT-3.6.1-1-pubrel-flags-0", 4, """
        60 02 0001      # PUBREL without its required flag bit 1
        """, M, "MQTT-3.6.1-1", 0x81, "PUBREL fixed-header flags are 0x0, not 0x2"),
    Bad("MQTT-3.6.1-1-pubrel-flags-6", 5, """
        66 03 0001 00   # PUBREL with flags 0110
        """, M, "MQTT-3.6.1-1", 0x81, "PUBREL fixed-header flags are 0x6, not 0x2"),
    Bad("MQTT-2.1.3-1-pubcomp-flags", 4, """
        71 02 0001      # PUBCOMP with flag bit 0 set
        """, M, "MQTT-2.1.3-1", 0x81, "PUBCOMP fixed-header flags are 0x1, not 0x0"),
    Bad("MQTT-3.4.2-1-puback-reason-0xFF", 5, """
        40 04 0001      # PUBACK, Remaining Length 4, Packet Identifier 1
        FF              # reason 0xFF is not a PUBACK Reason Code
        00              # Property Length 0
        """, P, "MQTT-3.4.2-1", 0x82, "PUBACK reason code 0xFF is not defined"),
    Bad("MQTT-3.5.2-1-pubrec-reason-0x92", 5, """
        50 03 0001      # PUBREC, Packet Identifier 1
        92              # 0x92 belongs to PUBREL/PUBCOMP, not PUBREC
        """, P, "MQTT-3.5.2-1", 0x82, "PUBREC reason code 0x92 is not defined"),
    Bad("MQTT-3.6.2-1-pubrel-reason-0x10", 5, """
        62 03 0001      # PUBREL, Packet Identifier 1
        10              # 0x10 belongs to PUBACK/PUBREC
        """, P, "MQTT-3.6.2-1", 0x82, "PUBREL reason code 0x10 is not defined"),
    Bad("MQTT-3.7.2-1-pubcomp-reason-0x80", 5, """
        70 03 0001      # PUBCOMP, Packet Identifier 1
        80              # 0x80 is not a PUBCOMP Reason Code
        """, P, "MQTT-3.7.2-1", 0x82, "PUBCOMP reason code 0x80 is not defined"),
    Bad("LG-trailing-bytes-puback-3.1.1", 4, """
        40 03 0001      # PUBACK, Remaining Length 3, Packet Identifier 1
        00              # 3.1.1 has no reason code
        """, M, "LG-trailing-bytes", 0x81,
        "PUBACK has 1 bytes left over after the Packet Identifier"),
    Bad("LG-trailing-bytes-puback-5", 5, """
        40 05 0001      # PUBACK, Remaining Length 5, Packet Identifier 1
        00 00           # Success, Property Length 0
        00              # one byte too many
        """, M, "LG-trailing-bytes", 0x81, "PUBACK has 1 bytes left over after the last field"),
    Bad("LG-truncated-puback-short-0", 4, """
        40 00           # PUBACK with no Packet Identifier
        """, M, "LG-truncated", 0x81, "PUBACK ends before the Packet Identifier"),
    Bad("LG-truncated-pubcomp-short-1", 5, """
        70 01 01        # PUBCOMP with half a Packet Identifier
        """, M, "LG-truncated", 0x81, "PUBCOMP ends before the Packet Identifier"),
    Bad("LG-truncated-puback-property-length-past-end", 5, """
        40 04 0001 00   # PUBACK, Packet Identifier 1, Success
        01              # Property Length 1, nothing follows
        """, M, "LG-truncated", 0x81, "PUBACK Property Length 1 runs past the end of the packet"),
    Bad("LG-property-duplicate-reason-string", 5, """
        40 0C 0001 00   # PUBACK, Packet Identifier 1, Success
        08              # Property Length 8
        1F 0001 70      # Reason String "p"
        1F 0001 71      # Reason String "q"
        """, P, "LG-property-duplicate", 0x82, "Reason String appears more than once in PUBACK"),
    Bad("LG-property-not-allowed-topic-alias-in-pubrel", 5, """
        62 07 0001 00   # PUBREL, Packet Identifier 1, Success
        03 23 0001      # Property Length 3: Topic Alias 1
        """, M, "LG-property-not-allowed", 0x81, r"Topic Alias \(0x23\) is not allowed in PUBREL"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_malformed_acks(case: Bad):
    check_bad(case)


@pytest.mark.parametrize("cls, first", [(PubAck, 0x40), (PubRec, 0x50), (PubRel, 0x62),
                                        (PubComp, 0x70)])
def test_the_four_acks_share_one_shape(cls, first):
    assert encode(cls(0x1234), 4) == bytes((first, 2, 0x12, 0x34))
    assert encode(cls(0x1234), 5) == bytes((first, 2, 0x12, 0x34))
    props = Properties(reason_string="r")
    frame = encode(cls(9, 0, props), 5)
    assert decode_packet(frame, 5)[0] == cls(9, 0, props)
    # Remaining Length 2, 3 and 4 all mean "Success, no properties" in MQTT 5.
    for body in ("0009", "0009 00", "0009 00 00"):
        data = bytes((first, len(wire(body)))) + wire(body)
        assert decode_packet(data, 5)[0] == cls(9)
    assert cls(1) != PubAck(1) or cls is PubAck


def test_server_may_send_failure_reasons_and_client_too():
    for from_client in (True, False):
        assert decode_packet(wire("40 03 0001 80"), 5, from_client=from_client)[0] == PubAck(1, 0x80)
