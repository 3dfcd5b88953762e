"""SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK: malformed-input table, topic filters."""

from __future__ import annotations

import pytest

from bridge.mqtt import (
    MalformedPacket, ProtocolError, Subscribe, Subscription, decode_packet,
)
from bridge.mqtt.subscribe import check_topic_filter
from tests.mqtt.helpers import Bad, check_bad, params, wire

M, P = MalformedPacket, ProtocolError

CASES = [
    Bad("MQTT-3.8.1-1-subscribe-flags-0", 4, """
        80 06           # SUBSCRIBE without its required flag bit 1
        """, M, "MQTT-3.8.1-1", 0x81, "SUBSCRIBE fixed-header flags are 0x0, not 0x2"),
    Bad("MQTT-3.8.1-1-subscribe-flags-A", 5, """
        8A 07 1234 00 0001 70 00  # SUBSCRIBE with flags 1010
        """, M, "MQTT-3.8.1-1", 0x81, "SUBSCRIBE fixed-header flags are 0xA, not 0x2"),
    Bad("MQTT-2.2.1-3-subscribe-packet-id-0", 4, """
        82 06           # SUBSCRIBE, Remaining Length 6
        0000            # Packet Identifier 0
        0001 70 00      # "p" QoS 0
        """, P, "MQTT-2.2.1-3", 0x82, "SUBSCRIBE has Packet Identifier 0"),
    Bad("MQTT-3.8.3-2-subscribe-without-filters-3.1.1", 4, """
        82 02 1234      # SUBSCRIBE with a Packet Identifier and nothing else
        """, P, "MQTT-3.8.3-2", 0x82, "SUBSCRIBE contains no Topic Filter"),
    Bad("MQTT-3.8.3-2-subscribe-without-filters-5", 5, """
        82 03 1234      # SUBSCRIBE, Packet Identifier
        00              # Property Length 0, no payload
        """, P, "MQTT-3.8.3-2", 0x82, "SUBSCRIBE contains no Topic Filter"),
    Bad("LG-truncated-subscribe-options-missing", 4, """
        82 05 1234      # SUBSCRIBE, Packet Identifier
        0001 70         # Topic Filter "p" without its options byte
        """, M, "LG-truncated", 0x81, "SUBSCRIBE ends before the Subscription Options"),
    Bad("LG-truncated-subscribe-half-filter-length", 5, """
        82 04 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        00              # half a Topic Filter length
        """, M, "LG-truncated", 0x81, "SUBSCRIBE ends before the Topic Filter"),
    Bad("MQTT-3.8.3-5-reserved-option-bits-3.1.1", 4, """
        82 06 1234      # SUBSCRIBE, Packet Identifier
        0001 70         # Topic Filter "p"
        04              # bit 2 is reserved in 3.1.1
        """, M, "MQTT-3.8.3-5", 0x81,
        "SUBSCRIBE Requested QoS byte 0x04 has reserved bits set"),
    Bad("MQTT-3.8.3-5-reserved-option-bits-5", 5, """
        82 07 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0001 70         # Topic Filter "p"
        40              # bit 6 is reserved
        """, M, "MQTT-3.8.3-5", 0x81,
        "SUBSCRIBE Subscription Options 0x40 has reserved bits set"),
    Bad("LG-subscription-qos-3-in-3.1.1", 4, """
        82 06 1234      # SUBSCRIBE, Packet Identifier
        0001 70         # Topic Filter "p"
        03              # Requested QoS 3
        """, P, "LG-subscription-qos", 0x82, "SUBSCRIBE requests QoS 3"),
    Bad("LG-subscription-qos-3-in-5", 5, """
        82 07 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0001 70         # Topic Filter "p"
        03              # Maximum QoS 3
        """, P, "LG-subscription-qos", 0x82, "SUBSCRIBE requests QoS 3"),
    Bad("LG-retain-handling-3", 5, """
        82 07 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0001 70         # Topic Filter "p"
        30              # Retain Handling 3
        """, P, "LG-retain-handling", 0x82, "SUBSCRIBE has Retain Handling 3"),
    Bad("MQTT-3.8.3-4-no-local-on-shared", 5, """
        82 10 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        000A 2473686172652F702F70  # Topic Filter "$share/p/p"
        04              # No Local
        """, P, "MQTT-3.8.3-4", 0x82, "SUBSCRIBE sets No Local on a Shared Subscription"),
    Bad("MQTT-4.7.3-1-empty-filter", 4, """
        82 09 1234      # SUBSCRIBE, Packet Identifier
        0001 71 00      # "q" QoS 0
        0000 00         # "" QoS 0
        """, M, "MQTT-4.7.3-1", 0x81, "SUBSCRIBE Topic Filter is empty"),
    Bad("MQTT-4.7.1-1-hash-not-last", 4, """
        82 08 1234      # SUBSCRIBE, Packet Identifier
        0003 232F61 00  # "#/a" QoS 0
        """, M, "MQTT-4.7.1-1", 0x81,
        "SUBSCRIBE Topic Filter has '#' that is not alone in the last level"),
    Bad("MQTT-4.7.1-1-hash-inside-level", 5, """
        82 0A 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0004 612F6123   # "a/a#" ('#' shares its level)
        00              # QoS 0
        """, M, "MQTT-4.7.1-1", 0x81,
        "SUBSCRIBE Topic Filter has '#' that is not alone in the last level"),
    Bad("MQTT-4.7.1-2-plus-inside-level", 4, """
        82 08 1234      # SUBSCRIBE, Packet Identifier
        0003 612B62 00  # "a+b" QoS 0
        """, M, "MQTT-4.7.1-2", 0x81,
        "SUBSCRIBE Topic Filter has '\\+' that is not a whole level"),
    Bad("MQTT-4.8.2-1-empty-share-name", 5, """
        82 0F 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0009 2473686172652F2F61  # "$share//a" (empty ShareName)
        00              # QoS 0
        """, P, "MQTT-4.8.2-1", 0x82, "SUBSCRIBE Shared Subscription has an empty ShareName"),
    Bad("MQTT-4.8.2-2-share-without-filter", 5, """
        82 0F 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        0009 2473686172652F702F  # "$share/p/" (no Topic Filter)
        00              # QoS 0
        """, P, "MQTT-4.8.2-2", 0x82,
        "SUBSCRIBE Shared Subscription has no Topic Filter after its ShareName"),
    Bad("MQTT-4.8.2-2-share-name-with-wildcard", 5, """
        82 10 1234 00   # SUBSCRIBE, Packet Identifier, Property Length 0
        000A 2473686172652F2B2F70  # "$share/+/p"
        00              # QoS 0
        """, P, "MQTT-4.8.2-2", 0x82,
        "SUBSCRIBE Shared Subscription ShareName contains a wildcard"),
    Bad("LG-property-not-allowed-in-subscribe", 5, """
        82 09 0001      # SUBSCRIBE, Packet Identifier 1
        02 01 00        # Property Length 2: Payload Format Indicator 0
        0001 70 00      # "p" QoS 0
        """, M, "LG-property-not-allowed", 0x81,
        r"Payload Format Indicator \(0x01\) is not allowed in SUBSCRIBE"),
    Bad("LG-property-duplicate-subscription-identifier-in-subscribe", 5, """
        82 0B 0001      # SUBSCRIBE, Packet Identifier 1
        04 0B01 0B01    # Property Length 4: Subscription Identifier 1 twice
        0001 70 00      # "p" QoS 0
        """, P, "LG-property-duplicate", 0x82,
        "Subscription Identifier appears more than once in SUBSCRIBE"),
    Bad("LG-property-value-subscription-identifier-0", 5, """
        82 09 0001      # SUBSCRIBE, Packet Identifier 1
        02 0B00         # Property Length 2: Subscription Identifier 0
        0001 70 00      # "p" QoS 0
        """, P, "LG-property-value", 0x82, "Subscription Identifier is 0"),
    Bad("LG-packet-direction-suback-from-client", 4, """
        90 03 1234 00   # SUBACK sent by a client
        """, P, "LG-packet-direction", 0x82, "SUBACK sent by a Client"),
    Bad("MQTT-2.2.1-6-suback-packet-id-0", 4, """
        90 03 0000 00   # SUBACK, Packet Identifier 0, granted QoS 0
        """, P, "MQTT-2.2.1-6", 0x82, "SUBACK has Packet Identifier 0", from_client=False),
    Bad("MQTT-3.9.3-2-suback-reason-0x03", 4, """
        90 04 1234      # SUBACK, Packet Identifier
        00 03           # granted QoS 0, then 3 (undefined)
        """, P, "MQTT-3.9.3-2", 0x82, "SUBACK reason code 0x03 is not defined",
        from_client=False),
    Bad("MQTT-3.9.3-2-suback-failure-in-3.1", 3, """
        90 03 1234      # SUBACK, Packet Identifier
        80              # 0x80 (failure) was added in 3.1.1
        """, P, "MQTT-3.9.3-2", 0x82, "SUBACK reason code 0x80 is not defined",
        from_client=False),
    Bad("MQTT-3.9.3-2-suback-without-reason-codes", 5, """
        90 03 1234 00   # SUBACK, Packet Identifier, Property Length 0, no codes
        """, P, "MQTT-3.9.3-2", 0x82, "SUBACK contains no reason code", from_client=False),
    Bad("MQTT-3.10.1-1-unsubscribe-flags", 4, """
        A0 05 1234 0001 70  # UNSUBSCRIBE without its required flag bit 1
        """, M, "MQTT-3.10.1-1", 0x81, "UNSUBSCRIBE fixed-header flags are 0x0, not 0x2"),
    Bad("MQTT-3.10.3-2-unsubscribe-without-filters", 5, """
        A2 03 1234      # UNSUBSCRIBE, Packet Identifier
        00              # Property Length 0, no payload
        """, P, "MQTT-3.10.3-2", 0x82, "UNSUBSCRIBE contains no Topic Filter"),
    Bad("MQTT-2.2.1-3-unsubscribe-packet-id-0", 4, """
        A2 05 0000      # UNSUBSCRIBE, Packet Identifier 0
        0001 70         # "p"
        """, P, "MQTT-2.2.1-3", 0x82, "UNSUBSCRIBE has Packet Identifier 0"),
    Bad("MQTT-4.7.3-1-unsubscribe-empty-filter", 4, """
        A2 07 1234      # UNSUBSCRIBE, Packet Identifier
        0000            # ""
        0001 71         # "q"
        """, M, "MQTT-4.7.3-1", 0x81, "UNSUBSCRIBE Topic Filter is empty"),
    Bad("LG-truncated-unsubscribe-filter", 4, """
        A2 04 1234      # UNSUBSCRIBE, Packet Identifier
        0001            # Topic Filter length 1, no byte
        """, M, "LG-truncated", 0x81, "UNSUBSCRIBE Topic Filter of 1 bytes runs past the end"),
    Bad("MQTT-1.5.4-1-unsubscribe-surrogate", 5, """
        A2 0A 1234 00   # UNSUBSCRIBE, Packet Identifier, Property Length 0
        0005 746FEDA080 # "to" + encoded U+D800
        """, M, "MQTT-1.5.4-1", 0x81, "Topic Filter encodes a surrogate code point at byte 2"),
    Bad("LG-property-not-allowed-subscription-identifier-in-unsubscribe", 5, """
        A2 08 0001      # UNSUBSCRIBE, Packet Identifier 1
        02 0B01         # Property Length 2: Subscription Identifier 1
        0001 70         # "p"
        """, M, "LG-property-not-allowed", 0x81,
        r"Subscription Identifier \(0x0B\) is not allowed in UNSUBSCRIBE"),
    Bad("LG-trailing-bytes-unsuback-3.1.1", 4, """
        B0 03 1234 00   # UNSUBACK carries no reason codes before MQTT 5
        """, M, "LG-trailing-bytes", 0x81,
        "UNSUBACK has 1 bytes left over after the Packet Identifier", from_client=False),
    Bad("MQTT-3.11.3-2-unsuback-reason-0x01", 5, """
        B0 04 1234 00   # UNSUBACK, Packet Identifier, Property Length 0
        01              # 0x01 is not an Unsubscribe Reason Code
        """, P, "MQTT-3.11.3-2", 0x82, "UNSUBACK reason code 0x01 is not defined",
        from_client=False),
    Bad("MQTT-3.11.3-2-unsuback-without-reason-codes", 5, """
        B0 03 1234 00   # UNSUBACK, Packet Identifier, Property Length 0, no codes
        """, P, "MQTT-3.11.3-2", 0x82, "UNSUBACK contains no reason code", from_client=False),
    Bad("MQTT-2.2.1-6-unsuback-packet-id-0", 4, """
        B0 02 0000      # UNSUBACK, Packet Identifier 0
        """, P, "MQTT-2.2.1-6", 0x82, "UNSUBACK has Packet Identifier 0", from_client=False),
    Bad("LG-packet-direction-unsubscribe-from-server", 4, """
        A2 05 1234 0001 70  # UNSUBSCRIBE received by a client
        """, P, "LG-packet-direction", 0x82, "UNSUBSCRIBE sent by a Server", from_client=False),
]


@pytest.mark.parametrize("case", params(CASES))
def test_malformed_subscribe_family(case: Bad):
    check_bad(case)


@pytest.mark.parametrize("tf", ["#", "+", "a/+/b", "+/+", "a/#", "/", "//", "a//b", "$SYS/#",
                                "sport/tennis/+", "$share"])
def test_valid_topic_filters(tf):
    assert check_topic_filter(tf, 5) is False


@pytest.mark.parametrize("tf", ["$share/g/#", "$share/g/a/+/c", "$share/g//"])
def test_shared_subscriptions_are_recognised_in_5(tf):
    assert check_topic_filter(tf, 5) is True
    assert check_topic_filter(tf, 4) is False  # 3.1.1: an ordinary filter


def test_mqtt_3_1_ignores_unused_option_bits():
    # MQTT 3.1: the upper six bits of the requested QoS byte are "not used".
    packet, _ = decode_packet(wire("82 06 1234 0001 70 FD"), 3)
    assert packet == Subscribe(0x1234, [Subscription("p", 1)])


def test_subscription_options_of_mqtt_5_decode():
    packet, _ = decode_packet(wire("82 07 1234 00 0001 70 2E"), 5)
    assert packet.subscriptions == [Subscription("p", 2, True, True, 2)]
