"""CONNECT and CONNACK: malformed-input table (layer 3), levels, session helper."""

from __future__ import annotations

import re

import pytest

from bridge.mqtt import (
    Connack, Connect, MalformedPacket, MqttError, ProtocolError, Will, check_client_id,
    decode_packet, encode,
)
from bridge.mqtt.reason_codes import ConnackReturnCode, connack_v3_code
from tests.mqtt.helpers import Bad, check_bad, params, wire

M, P = MalformedPacket, ProtocolError

CONNECT_CASES = [
    Bad("MQTT-3.1.0-1-first-packet-must-be-connect", None, """
        30              # PUBLISH before any CONNECT
        """, P, "MQTT-3.1.0-1", 0x82, "first packet is PUBLISH, not CONNECT"),
    Bad("MQTT-3.1.2-1-protocol-name-MQTU", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515455   # Protocol Name "MQTU"
        04 02 000A      # level 4, Clean Session, Keep Alive 10
        0001 70         # Client Identifier "p"
        """, P, "MQTT-3.1.2-1", 0x84, "CONNECT Protocol Name of 4 bytes is neither MQTT nor MQIsdp"),
    Bad("MQTT-3.1.2-1-protocol-name-empty", None, """
        10 09           # CONNECT, Remaining Length 9
        0000            # Protocol Name ""
        04 02 000A      # level 4, Clean Session, Keep Alive 10
        0001 70         # Client Identifier "p"
        """, P, "MQTT-3.1.2-1", 0x84, "CONNECT Protocol Name of 0 bytes is neither MQTT nor MQIsdp"),
    Bad("MQTT-3.1.2-2-MQTT-level-2", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515454   # Protocol Name "MQTT"
        02 00 000A      # level 2 (unsupported), flags 0, Keep Alive 10
        0001 70         # Client Identifier "p"
        """, P, "MQTT-3.1.2-2", 0x84,
        "CONNECT Protocol Version 2 is not supported with Protocol Name 'MQTT'"),
    Bad("MQTT-3.1.2-2-MQIsdp-level-4", None, """
        10 0F           # CONNECT, Remaining Length 15
        0006 4D5149736470  # Protocol Name "MQIsdp"
        04 02 000A      # level 4 does not go with MQIsdp
        0001 70         # Client Identifier "p"
        """, P, "MQTT-3.1.2-2", 0x84,
        "CONNECT Protocol Version 4 is not supported with Protocol Name 'MQIsdp'"),
    Bad("MQTT-2.1.3-1-connect-fixed-header-flags", None, """
        11 0D           # CONNECT with flag bit 0 set
        0004 4D515454   # Protocol Name "MQTT"
        04 02 000A      # level 4, Clean Session, Keep Alive 10
        0001 70         # Client Identifier "p"
        """, M, "MQTT-2.1.3-1", 0x81, "CONNECT fixed-header flags are 0x1, not 0x0"),
    Bad("MQTT-3.1.2-3-reserved-connect-flag", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515454   # Protocol Name "MQTT"
        04 01 000A      # level 4, reserved Connect Flag set, Keep Alive 10
        0001 70         # Client Identifier "p"
        """, M, "MQTT-3.1.2-3", 0x81, "CONNECT reserved Connect Flag is 1"),
    Bad("MQTT-3.1.2-11-will-qos-without-will", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515454   # Protocol Name "MQTT"
        04 0A 000A      # level 4, Will QoS 1 + Clean Session, no Will Flag
        0001 70         # Client Identifier "p"
        """, M, "MQTT-3.1.2-11", 0x81, "CONNECT has Will QoS 1 without Will Flag"),
    Bad("MQTT-3.1.2-13-will-retain-without-will", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515454   # Protocol Name "MQTT"
        04 22 000A      # level 4, Will Retain + Clean Session, no Will Flag
        0001 70         # Client Identifier "p"
        """, M, "MQTT-3.1.2-13", 0x81, "CONNECT has Will Retain without Will Flag"),
    Bad("MQTT-3.1.2-12-will-qos-3", None, """
        10 13           # CONNECT, Remaining Length 19
        0004 4D515454   # Protocol Name "MQTT"
        04 1E 000A      # level 4, Will QoS 3 + Will Flag + Clean Session
        0001 70         # Client Identifier "p"
        0001 70         # Will Topic "p"
        0001 70         # Will Payload "p"
        """, M, "MQTT-3.1.2-12", 0x81, "CONNECT has Will QoS 3"),
    Bad("MQTT-3.1.2-9-will-flag-without-will", None, """
        10 0D           # CONNECT, Remaining Length 13
        0004 4D515454   # Protocol Name "MQTT"
        04 06 000A      # level 4, Will Flag + Clean Session
        0001 70         # Client Identifier "p", then nothing
        """, M, "MQTT-3.1.2-9", 0x81, "CONNECT ends before the Will Message"),
    Bad("MQTT-3.1.2-9-will-payload-missing", None, """
        10 10           # CONNECT, Remaining Length 16
        0004 4D515454   # Protocol Name "MQTT"
        04 06 000A      # level 4, Will Flag + Clean Session
        0001 70         # Client Identifier "p"
        0001 70         # Will Topic "p", no Will Payload
        """, M, "MQTT-3.1.2-9", 0x81, "CONNECT ends before the Will Payload"),
    Bad("MQTT-3.1.2-9-will-properties-missing-in-5", None, """
        10 0E           # CONNECT, Remaining Length 14
        0004 4D515454   # Protocol Name "MQTT"
        05 06 000A      # level 5, Will Flag + Clean Start
        00              # Property Length 0
        0001 70         # Client Identifier "p", then nothing
        """, M, "MQTT-3.1.2-9", 0x81, "CONNECT ends before the Will Message"),
    Bad("MQTT-4.7.3-1-will-topic-empty", None, """
        10 12           # CONNECT, Remaining Length 18
        0004 4D515454   # Protocol Name "MQTT"
        04 06 000A      # level 4, Will Flag + Clean Session
        0001 70         # Client Identifier "p"
        0000            # Will Topic ""
        0001 70         # Will Payload "p"
        """, M, "MQTT-4.7.3-1", 0x81, "CONNECT Will Topic is empty"),
    Bad("MQTT-4.7.0-1-will-topic-wildcard", None, """
        10 13           # CONNECT, Remaining Length 19
        0004 4D515454   # Protocol Name "MQTT"
        04 06 000A      # level 4, Will Flag + Clean Session
        0001 70         # Client Identifier "p"
        0001 2B         # Will Topic "+"
        0001 70         # Will Payload "p"
        """, M, "MQTT-4.7.0-1", 0x81, "CONNECT Will Topic contains a wildcard character"),
    Bad("MQTT-1.5.4-2-null-in-will-topic", None, """
        10 17           # CONNECT, Remaining Length 23
        0004 4D515454   # Protocol Name "MQTT"
        04 06 000A      # level 4, Will Flag + Clean Session
        0001 70         # Client Identifier "p"
        0005 746F700000 # Will Topic with U+0000
        0001 70         # Will Payload "p"
        """, M, "MQTT-1.5.4-2", 0x81, r"Will Topic contains U\+0000"),
    Bad("MQTT-3.1.3-3-client-identifier-missing", None, """
        10 0A           # CONNECT, Remaining Length 10
        0004 4D515454   # Protocol Name "MQTT"
        04 02 000A      # level 4, Clean Session, Keep Alive 10 -- no payload
        """, M, "MQTT-3.1.3-3", 0x81, "CONNECT ends before the Client Identifier"),
    Bad("LG-utf8-disallowed-client-identifier", None, """
        10 11           # CONNECT, Remaining Length 17
        0004 4D515454   # Protocol Name "MQTT"
        04 02 000A      # level 4, Clean Session, Keep Alive 10
        0005 746F700170 # Client Identifier "top" U+0001 "p"
        """, M, "LG-utf8-disallowed", 0x81,
        r"Client Identifier contains the disallowed code point U\+0001"),
    Bad("MQTT-1.5.4-1-surrogate-in-user-name", None, """
        10 14           # CONNECT, Remaining Length 20
        0004 4D515454   # Protocol Name "MQTT"
        04 82 000A      # level 4, User Name Flag + Clean Session
        0001 70         # Client Identifier "p"
        0005 746FEDA080 # User Name with encoded U+D800
        """, M, "MQTT-1.5.4-1", 0x81, "User Name encodes a surrogate code point at byte 2"),
    Bad("MQTT-3.1.2-16-user-name-without-flag", None, """
        10 10           # CONNECT, Remaining Length 16
        0004 4D515454   # Protocol Name "MQTT"
        04 02 000A      # level 4, Clean Session only
        0001 70         # Client Identifier "p"
        0001 70         # a User Name nobody announced
        """, M, "MQTT-3.1.2-16", 0x81,
        "CONNECT has 3 bytes after its fields but the User Name Flag is 0"),
    Bad("MQTT-3.1.2-17-user-name-missing", None, """
        10 0E           # CONNECT, Remaining Length 14
        0004 4D515454   # Protocol Name "MQTT"
        05 82 000A      # level 5, User Name Flag + Clean Start
        00              # Property Length 0
        0001 70         # Client Identifier "p", no User Name
        """, M, "MQTT-3.1.2-17", 0x81, "CONNECT ends before the User Name"),
    Bad("MQTT-3.1.2-18-password-without-flag", None, """
        10 13           # CONNECT, Remaining Length 19
        0004 4D515454   # Protocol Name "MQTT"
        04 82 000A      # level 4, User Name Flag + Clean Session
        0001 70         # Client Identifier "p"
        0001 70         # User Name "p"
        0001 70         # a Password nobody announced
        """, M, "MQTT-3.1.2-18", 0x81,
        "CONNECT has 3 bytes after its fields but the Password Flag is 0"),
    Bad("MQTT-3.1.2-19-password-missing", None, """
        10 11           # CONNECT, Remaining Length 17
        0004 4D515454   # Protocol Name "MQTT"
        05 C2 000A      # level 5, User Name + Password Flags + Clean Start
        00              # Property Length 0
        0001 70         # Client Identifier "p"
        0001 70         # User Name "p", no Password
        """, M, "MQTT-3.1.2-19", 0x81, "CONNECT ends before the Password"),
    Bad("MQTT-3.1.2-22-password-without-user-name-3.1.1", None, """
        10 10           # CONNECT, Remaining Length 16
        0004 4D515454   # Protocol Name "MQTT"
        04 42 000A      # level 4, Password Flag + Clean Session, no User Name Flag
        0001 70         # Client Identifier "p"
        0001 70         # Password "p"
        """, M, "MQTT-3.1.2-22", 0x81, "CONNECT has the Password Flag without the User Name Flag"),
    Bad("LG-trailing-bytes-after-password", None, """
        10 16           # CONNECT, Remaining Length 22
        0004 4D515454   # Protocol Name "MQTT"
        04 C2 000A      # level 4, User Name + Password Flags + Clean Session
        0001 70         # Client Identifier "p"
        0001 70         # User Name "p"
        0001 70         # Password "p"
        0001 70         # three more bytes
        """, M, "LG-trailing-bytes", 0x81, "CONNECT has 3 bytes left over after the Password"),
    Bad("LG-property-not-allowed-topic-alias-in-connect", None, """
        10 11           # CONNECT, Remaining Length 17
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        03 23 0001      # Property Length 3: Topic Alias 1
        0001 70         # Client Identifier "p"
        """, M, "LG-property-not-allowed", 0x81, r"Topic Alias \(0x23\) is not allowed in CONNECT"),
    Bad("LG-property-not-allowed-session-expiry-in-will", None, """
        10 1A           # CONNECT, Remaining Length 26
        0004 4D515454   # Protocol Name "MQTT"
        05 06 000A      # level 5, Will Flag + Clean Start
        00              # Property Length 0
        0001 70         # Client Identifier "p"
        05 11 0000000A  # Will Properties: Session Expiry Interval (CONNECT only)
        0001 70         # Will Topic "p"
        0001 70         # Will Payload "p"
        """, M, "LG-property-not-allowed", 0x81,
        r"Session Expiry Interval \(0x11\) is not allowed in Will Properties"),
    Bad("LG-auth-data-without-method", None, """
        10 12           # CONNECT, Remaining Length 18
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        04 16 0001 70   # Property Length 4: Authentication Data "p"
        0001 70         # Client Identifier "p"
        """, P, "LG-auth-data-without-method", 0x82,
        "CONNECT has Authentication Data without Authentication Method"),
    Bad("LG-property-value-receive-maximum-0", None, """
        10 11           # CONNECT, Remaining Length 17
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        03 21 0000      # Property Length 3: Receive Maximum 0
        0001 70         # Client Identifier "p"
        """, P, "LG-property-value", 0x82, "Receive Maximum is 0"),
    Bad("LG-property-value-maximum-packet-size-0", None, """
        10 13           # CONNECT, Remaining Length 19
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        05 27 00000000  # Property Length 5: Maximum Packet Size 0
        0001 70         # Client Identifier "p"
        """, P, "LG-property-value", 0x82, "Maximum Packet Size is 0"),
    Bad("LG-property-value-request-problem-information-2", None, """
        10 10           # CONNECT, Remaining Length 16
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        02 17 02        # Property Length 2: Request Problem Information 2
        0001 70         # Client Identifier "p"
        """, P, "LG-property-value", 0x82, "Request Problem Information is 2, not 0 or 1"),
    Bad("LG-property-duplicate-session-expiry", None, """
        10 18           # CONNECT, Remaining Length 24
        0004 4D515454   # Protocol Name "MQTT"
        05 02 000A      # level 5, Clean Start, Keep Alive 10
        0A              # Property Length 10
        11 00000001     # Session Expiry Interval 1
        11 00000002     # Session Expiry Interval 2
        0001 70         # Client Identifier "p"
        """, P, "LG-property-duplicate", 0x82,
        "Session Expiry Interval appears more than once in CONNECT"),
    Bad("LG-packet-direction-connect-from-server", 4, """
        10 0D           # CONNECT received by a client
        """, P, "LG-packet-direction", 0x82, "CONNECT sent by a Server", from_client=False),
]

CONNACK_CASES = [
    Bad("LG-packet-direction-connack-from-client", 4, """
        20 02 00 00     # CONNACK sent by a client
        """, P, "LG-packet-direction", 0x82, "CONNACK sent by a Client"),
    Bad("MQTT-2.1.3-1-connack-fixed-header-flags", 4, """
        21 02 00 00     # CONNACK with flag bit 0 set
        """, M, "MQTT-2.1.3-1", 0x81, "CONNACK fixed-header flags are 0x1, not 0x0",
        from_client=False),
    Bad("MQTT-3.2.2-1-reserved-acknowledge-flags", 4, """
        20 02           # CONNACK, Remaining Length 2
        02              # Connect Acknowledge Flags with reserved bit 1
        00              # return code 0
        """, M, "MQTT-3.2.2-1", 0x81,
        "CONNACK Connect Acknowledge Flags 0x02 has reserved bits set", from_client=False),
    Bad("MQTT-3.2.2-8-return-code-6", 4, """
        20 02 00        # CONNACK, Remaining Length 2, flags 0
        06              # return code 6 (reserved)
        """, P, "MQTT-3.2.2-8", 0x82, "CONNACK reason code 0x06 is not defined",
        from_client=False),
    Bad("MQTT-3.2.2-8-v5-reason-0x01", 5, """
        20 03 00        # CONNACK, Remaining Length 3, flags 0
        01              # reason 0x01 is not a Connect Reason Code
        00              # Property Length 0
        """, P, "MQTT-3.2.2-8", 0x82, "CONNACK reason code 0x01 is not defined",
        from_client=False),
    Bad("MQTT-3.2.2-6-session-present-with-failure", 4, """
        20 02           # CONNACK, Remaining Length 2
        01              # Session Present
        05              # return code 5 Not authorized
        """, P, "MQTT-3.2.2-6", 0x82, "CONNACK has Session Present 1 with reason code 0x05",
        from_client=False),
    Bad("LG-trailing-bytes-connack-3.1.1", 4, """
        20 03 00 00     # CONNACK, Remaining Length 3
        00              # one byte too many
        """, M, "LG-trailing-bytes", 0x81, "CONNACK has 1 bytes left over after the last field",
        from_client=False),
    Bad("LG-truncated-connack-short", 4, """
        20 01 00        # CONNACK, Remaining Length 1: flags only
        """, M, "LG-truncated", 0x81, "CONNACK ends before the Connect Reason Code",
        from_client=False),
    Bad("LG-truncated-connack-v5-without-property-length", 5, """
        20 02 00 00     # MQTT 5 CONNACK needs a Property Length
        """, M, "LG-truncated", 0x81, "CONNACK ends before the Property Length",
        from_client=False),
    Bad("LG-property-value-maximum-qos-2", 5, """
        20 05 00 00     # CONNACK, Remaining Length 5, Success
        02 24 02        # Property Length 2: Maximum QoS 2
        """, P, "LG-property-value", 0x82, "Maximum QoS is 2, not 0 or 1", from_client=False),
]


@pytest.mark.parametrize("case", params(CONNECT_CASES))
def test_malformed_connect(case: Bad):
    check_bad(case)


@pytest.mark.parametrize("case", params(CONNACK_CASES))
def test_malformed_connack(case: Bad):
    check_bad(case)


@pytest.mark.parametrize("data, level", [
    ("10 0D 0004 4D515454 04 01 000A 0001 70", 4),     # reserved Connect Flag, 3.1.1
    ("10 0E 0004 4D515454 05 01 000A 00 0001 70", 5),  # reserved Connect Flag, 5
    ("10 0D 0004 4D515455 04 02 000A 0001 70", None),  # unknown Protocol Name
    ("10 0D 0004 4D515454 06 02 000A 0001 70", None),  # unsupported level
])
def test_connect_errors_carry_the_level_of_the_connect(data, level):
    with pytest.raises(MqttError) as info:
        decode_packet(wire(data), None)
    assert info.value.protocol_level == level


def test_mqtt_3_1_2_2_maps_to_connack_return_code_1():
    with pytest.raises(ProtocolError) as info:
        decode_packet(wire("10 0F 0006 4D5149736470 02 00 000A 0001 70"), None)
    assert info.value.rule == "MQTT-3.1.2-2"
    assert connack_v3_code(info.value.reason_code) is ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION


def test_mqtt_3_1_is_lenient_with_flags_it_does_not_define():
    # Mosquitto vectors "14 ok" and "10 ok" of v3.1: fixed-header flags and the
    # reserved Connect Flag are not checked for MQIsdp/3.
    for data in ("14 0F 0006 4D5149736470 03 01 000A 0001 70",
                 "10 0F 0006 4D5149736470 03 01 000A 0001 70"):
        packet, used = decode_packet(wire(data), None)
        assert packet.protocol_level == 3 and packet.protocol_name == "MQIsdp"
        assert packet.client_id == "p" and used == 17


def test_connect_at_a_known_level_is_still_decoded_for_the_session():
    frame = encode(Connect.for_level(4, client_id="again"), 4)
    packet, _ = decode_packet(frame, 5)  # the session flags a second CONNECT [MQTT-3.1.0-2]
    assert packet.client_id == "again" and packet.protocol_level == 4


def test_password_is_binary_and_may_contain_nul():
    packet, _ = decode_packet(wire("10 17 0004 4D515454 04 C2 000A 0001 70 0001 70 "
                                   "0005 746F700000"), None)
    assert packet.password == b"top\x00\x00"


def test_connect_repr_shows_password_and_will_payload_sizes_only():
    c = Connect.for_level(5, client_id="c", username="user", password=b"hunter2",
                          will=Will("w", b"last words"))
    text = repr(c)
    assert "hunter2" not in text and "last words" not in text
    assert "password=<7 bytes>" in text and "payload=<10 bytes>" in text


def test_encode_connect_requires_matching_level():
    with pytest.raises(ValueError):
        encode(Connect.for_level(3, client_id="c"), 4)
    assert encode(Connack(False, 0), 3) == b"\x20\x02\x00\x00"


# -- session helper -------------------------------------------------------------

@pytest.mark.parametrize("connect, message", [
    (Connect.for_level(3, client_id=""),
     r"MQTT 3\.1 Client Identifier has 0 characters, not 1\.\.23"),
    (Connect.for_level(3, client_id="x" * 24),
     r"MQTT 3\.1 Client Identifier has 24 characters, not 1\.\.23"),
    (Connect.for_level(4, client_id="", clean_start=False),
     r"empty Client Identifier with Clean Session 0"),
], ids=["MQTT-3.1.3-8-v31-empty", "MQTT-3.1.3-8-v31-too-long", "MQTT-3.1.3-8-v311-empty-resume"])
def test_check_client_id_rejects(connect, message):
    with pytest.raises(ProtocolError) as info:
        check_client_id(connect)
    err = info.value
    assert (err.rule, err.reason_code) == ("MQTT-3.1.3-8", 0x85)
    assert re.fullmatch(re.escape("[MQTT-3.1.3-8] ") + message, str(err))
    assert connack_v3_code(err.reason_code) is ConnackReturnCode.IDENTIFIER_REJECTED


@pytest.mark.parametrize("connect", [
    Connect.for_level(3, client_id="x" * 23),
    Connect.for_level(4, client_id="", clean_start=True),
    Connect.for_level(5, client_id="", clean_start=False),
    Connect.for_level(5, client_id="x" * 100),
])
def test_check_client_id_accepts(connect):
    check_client_id(connect)
