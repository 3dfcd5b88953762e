"""DISCONNECT, AUTH, PINGREQ, PINGRESP: malformed-input table and short forms."""

from __future__ import annotations

import pytest

from bridge.mqtt import (
    Auth, Disconnect, MalformedPacket, PingReq, PingResp, Properties, ProtocolError,
    decode_packet,
)
from bridge.mqtt.reason_codes import DisconnectReason
from tests.mqtt.helpers import Bad, check_bad, params, wire

M, P = MalformedPacket, ProtocolError

CASES = [
    Bad("MQTT-3.14.1-1-disconnect-flags", 4, """
        E1 00           # DISCONNECT with flag bit 0 set
        """, M, "MQTT-3.14.1-1", 0x81, "DISCONNECT fixed-header flags are 0x1, not 0x0"),
    Bad("MQTT-3.14.1-1-disconnect-flags-5", 5, """
        E8 00           # DISCONNECT with flag bit 3 set
        """, M, "MQTT-3.14.1-1", 0x81, "DISCONNECT fixed-header flags are 0x8, not 0x0"),
    Bad("LG-trailing-bytes-disconnect-3.1.1", 4, """
        E0 01 00        # 3.1.1 DISCONNECT has no variable header
        """, M, "LG-trailing-bytes", 0x81,
        "DISCONNECT has 1 bytes left over after the fixed header"),
    Bad("MQTT-3.14.2-1-reason-0x01", 5, """
        E0 01           # DISCONNECT, Remaining Length 1
        01              # 0x01 is not a Disconnect Reason Code
        """, P, "MQTT-3.14.2-1", 0x82, "DISCONNECT reason code 0x01 is not defined"),
    Bad("MQTT-3.14.2-1-server-only-reason-from-client", 5, """
        E0 01           # DISCONNECT, Remaining Length 1
        8B              # Server shutting down: only a Server may send it
        """, P, "MQTT-3.14.2-1", 0x82, "DISCONNECT reason code 0x8B may not be sent by a Client"),
    Bad("MQTT-3.14.2-1-client-only-reason-from-server", 5, """
        E0 01           # DISCONNECT, Remaining Length 1
        04              # Disconnect with Will Message: only a Client may send it
        """, P, "MQTT-3.14.2-1", 0x82, "DISCONNECT reason code 0x04 may not be sent by a Server",
        from_client=False),
    Bad("MQTT-3.14.2-2-session-expiry-from-server", 5, """
        E0 07 00        # DISCONNECT, Remaining Length 7, Normal disconnection
        05 11 00000000  # Property Length 5: Session Expiry Interval 0
        """, P, "MQTT-3.14.2-2", 0x82, "DISCONNECT from a Server has a Session Expiry Interval",
        from_client=False),
    Bad("LG-property-unknown-0x00-in-disconnect", 5, """
        E0 03 00        # DISCONNECT, Remaining Length 3, Normal disconnection
        01 00           # Property Length 1: identifier 0
        """, M, "LG-property-unknown", 0x81, "DISCONNECT has unknown property identifier 0x00"),
    Bad("LG-truncated-disconnect-session-expiry-short", 5, """
        E0 05 00        # DISCONNECT, Remaining Length 5, Normal disconnection
        03 11 0000      # Property Length 3: Session Expiry Interval with 2 of 4 bytes
        """, M, "LG-truncated", 0x81, "DISCONNECT ends before the Session Expiry Interval value"),
    Bad("LG-property-not-allowed-topic-alias-in-disconnect", 5, """
        E0 05 00        # DISCONNECT, Remaining Length 5, Normal disconnection
        03 23 0101      # Property Length 3: Topic Alias
        """, M, "LG-property-not-allowed", 0x81,
        r"Topic Alias \(0x23\) is not allowed in DISCONNECT"),
    Bad("LG-packet-type-reserved-auth-in-3.1.1", 4, """
        F0 00           # AUTH does not exist before MQTT 5
        """, P, "LG-packet-type-reserved", 0x82, "packet type 15 is reserved before MQTT 5"),
    Bad("MQTT-3.15.1-1-auth-flags", 5, """
        F1 00           # AUTH with flag bit 0 set
        """, M, "MQTT-3.15.1-1", 0x81, "AUTH fixed-header flags are 0x1, not 0x0"),
    Bad("MQTT-3.15.2-1-auth-success-from-client", 5, """
        F0 01 00        # AUTH, reason Success: only a Server may send it
        """, P, "MQTT-3.15.2-1", 0x82, "AUTH reason code 0x00 may not be sent by a Client"),
    Bad("MQTT-3.15.2-1-auth-short-form-from-client", 5, """
        F0 00           # AUTH, Remaining Length 0 means reason Success
        """, P, "MQTT-3.15.2-1", 0x82, "AUTH reason code 0x00 may not be sent by a Client"),
    Bad("MQTT-3.15.2-1-auth-reason-0x82", 5, """
        F0 02 82 00     # AUTH, reason 0x82 is not an Authenticate Reason Code
        """, P, "MQTT-3.15.2-1", 0x82, "AUTH reason code 0x82 is not defined"),
    Bad("LG-auth-method-missing", 5, """
        F0 02 18        # AUTH, Continue authentication
        00              # Property Length 0: no Authentication Method
        """, P, "LG-auth-method-missing", 0x82, "AUTH has no Authentication Method"),
    Bad("LG-auth-method-missing-short-form-from-server", 5, """
        F0 00           # AUTH, Remaining Length 0
        """, P, "LG-auth-method-missing", 0x82, "AUTH has no Authentication Method",
        from_client=False),
    Bad("LG-trailing-bytes-pingreq", 5, """
        C0 01 00        # PINGREQ has no body
        """, M, "LG-trailing-bytes", 0x81, "PINGREQ has 1 bytes left over after the fixed header"),
    Bad("MQTT-2.1.3-1-pingreq-flags", 4, """
        C2 00           # PINGREQ with flag bit 1 set
        """, M, "MQTT-2.1.3-1", 0x81, "PINGREQ fixed-header flags are 0x2, not 0x0"),
    Bad("LG-packet-direction-pingresp-from-client", 5, """
        D0 00           # PINGRESP sent by a client
        """, P, "LG-packet-direction", 0x82, "PINGRESP sent by a Client"),
    Bad("LG-packet-direction-pingresp-before-flags", 5, """
        D1 00           # PINGRESP from a client, also with a bad flag
        """, P, "LG-packet-direction", 0x82, "PINGRESP sent by a Client"),
    Bad("LG-trailing-bytes-pingresp", 4, """
        D0 01 00        # PINGRESP has no body
        """, M, "LG-trailing-bytes", 0x81,
        "PINGRESP has 1 bytes left over after the fixed header", from_client=False),
    Bad("LG-packet-direction-pingreq-from-server", 4, """
        C0 00           # PINGREQ received by a client
        """, P, "LG-packet-direction", 0x82, "PINGREQ sent by a Server", from_client=False),
]


@pytest.mark.parametrize("case", params(CASES))
def test_malformed_disconnect_family(case: Bad):
    check_bad(case)


def test_disconnect_short_forms():
    assert decode_packet(wire("E0 00"), 5) == (Disconnect(), 2)
    assert decode_packet(wire("E0 01 04"), 5) == (Disconnect(0x04), 3)
    assert decode_packet(wire("E0 02 82 00"), 5) == (Disconnect(0x82), 4)
    assert decode_packet(wire("E0 00"), 3) == (Disconnect(), 2)


@pytest.mark.parametrize("code", [int(c) for c in DisconnectReason])
def test_every_disconnect_reason_from_its_senders(code):
    for from_client in (True, False):
        try:
            packet, _ = decode_packet(bytes((0xE0, 1, code)), 5, from_client=from_client)
        except ProtocolError as err:
            assert err.rule == "MQTT-3.14.2-1"
        else:
            assert packet == Disconnect(code)


def test_auth_round_trip_and_repr_hides_authentication_data():
    auth = Auth(0x18, Properties(authentication_method="M", authentication_data=b"s3cr3t"))
    from bridge.mqtt import encode
    assert decode_packet(encode(auth, 5), 5) == (auth, len(encode(auth, 5)))
    assert "s3cr3t" not in repr(auth) and "<6 bytes>" in repr(auth)


def test_pings_decode_to_singletons_equal_to_fresh_instances():
    assert decode_packet(b"\xc0\x00", 3)[0] == PingReq()
    assert decode_packet(b"\xd0\x00", 5, from_client=False)[0] == PingResp()
