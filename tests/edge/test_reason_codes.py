"""Every reason code the edge can send is one its packet may carry
(MQTT 5.0 tables: CONNACK 3.2.2.2, PUBACK 3.4.2.1, PUBREC 3.5.2.1, PUBCOMP
3.7.2.1, SUBACK 3.9.3, UNSUBACK 3.11.3, DISCONNECT 3.14.2.1 [MQTT-3.14.2-1]).

The edge answers a violation with the rule's reason code in the packet that
ends the exchange: a CONNACK while the CONNECT is being judged, a DISCONNECT
afterwards (MQTT 5; 3.x closes, or answers a CONNECT with the mapped 3.x
return code), and a few refusals that keep the connection in a PUBACK or
PUBREC. This test walks every rule of both rule tables against every packet
the edge can end a connection (or an exchange) with. Rules whose code one of
those packets cannot carry must be rules that can never reach it; the test
names them, and checks by driving a session that the edge indeed never
sends them there. tests/edge/test_edge_job_agreement.py adds the empirical
side: everything the edge sends for thousands of random frames decodes with
the codec's own reason-code checks.
"""

from __future__ import annotations

import pytest

from bridge.edge.rules import EDGE_RULES
from bridge.edge.session import Limits, Session
from bridge.mqtt import Properties, decode_packet
from bridge.mqtt.fixed_header import PacketType
from bridge.mqtt.reason_codes import connack_v3_code, valid_reasons
from bridge.mqtt.rules import RULES
from tests.edge.util import Harness, connect, publish

ALL_RULES = {**RULES, **EDGE_RULES}

# Rules raised only while a CONNECT is judged (the edge answers with CONNACK):
# their codes are CONNACK codes that no DISCONNECT carries. After the CONNECT a
# CONNECT is a Protocol Error 0x82 whatever else is wrong with it
# [MQTT-3.1.0-2], and refuse() is a no-op once connected.
CONNECT_ONLY = {
    "MQTT-3.1.2-1": 0x84,   # Protocol Name
    "MQTT-3.1.2-2": 0x84,   # Protocol Version
    "MQTT-3.1.3-8": 0x85,   # Client Identifier refused
    "MQTT-3.1.4-2": 0x86,   # credentials (server decision, refuse())
    "MQTT-4.12.0-1": 0x8C,  # Authentication Method
    # a cluster edge refuses a CONNECT with 0x88 Server unavailable: without a lease, or when a
    # session cannot be moved to it; a lease lost later ends connections with DISCONNECT 0x9C
    # Use another server (Session.lease_lost), not with the rule's code
    "LG-cluster-lease": 0x88,
    "LG-cluster-move": 0x88,
}
# Rules that need an established connection (PUBLISH state, timers, a newer
# connection): their codes are DISCONNECT codes that no CONNACK carries.
CONNECTED_ONLY = {
    "MQTT-3.3.2-8": 0x94, "MQTT-3.3.2-9": 0x94, "MQTT-3.3.2-11": 0x94,  # Topic Alias
    "MQTT-3.3.4-7": 0x93,          # Receive Maximum
    "LG-edge-keep-alive": 0x8D,    # tick()
    "MQTT-3.1.4-3": 0x8E,          # take_over()
    "LG-edge-shutdown": 0x8B,      # shutdown(): sent to connected MQTT 5 clients only
}
# Resource limits that close a connection mid-frame without sending anything
# (the client is in the middle of a packet, so no packet of ours can follow
# its partial one); the code is only recorded in the log's close line.
# tests/edge/test_limits.py checks at level 5 that no byte is sent.
CLOSED_SILENTLY = {
    "LG-edge-frame-timeout": 0x8D,
    "LG-edge-buffer-budget": 0x97,
    "LG-edge-connect-timeout": 0x8D,  # no CONNECT accepted: no CONNACK to carry it
}
# Refusals that keep the connection: the rule's code goes in this ack.
ACK_REFUSALS = {
    "LG-payload-format-invalid": (PacketType.PUBACK, PacketType.PUBREC),
    "LG-edge-qos2-quota": (PacketType.PUBREC,),
    "LG-edge-topic-levels": (PacketType.PUBACK, PacketType.PUBREC),
    "LG-edge-topic-length": (PacketType.PUBACK, PacketType.PUBREC),
}

SERVER = False  # from_client=False: the edge is the sender


@pytest.mark.parametrize("rule", sorted(ALL_RULES))
def test_every_rule_code_fits_every_packet_the_edge_sends_it_in(rule):
    code = ALL_RULES[rule].reason_code
    disconnect = valid_reasons(PacketType.DISCONNECT, 5, SERVER)
    connack = valid_reasons(PacketType.CONNACK, 5, SERVER)
    if rule in CONNECT_ONLY:
        assert code == CONNECT_ONLY[rule] and code in connack and code not in disconnect
    elif rule in CLOSED_SILENTLY:
        assert code == CLOSED_SILENTLY[rule]
    elif rule in CONNECTED_ONLY:
        assert code == CONNECTED_ONLY[rule] and code in disconnect and code not in connack
    else:  # may end a connection before or after the CONNECT was accepted
        assert code in disconnect, f"[MQTT-3.14.2-1] 0x{code:02X} is no DISCONNECT reason"
        assert code in connack, f"[MQTT-3.2.2-8] 0x{code:02X} is no CONNACK reason"
    v3 = connack_v3_code(code)
    assert v3 is None or v3 in valid_reasons(PacketType.CONNACK, 4)
    for ack in ACK_REFUSALS.get(rule, ()):
        assert code in valid_reasons(ack, 5, SERVER), (ack.name, hex(code))


def test_the_lists_above_name_rules_of_the_tables():
    assert set(CONNECT_ONLY) | set(CONNECTED_ONLY) | set(CLOSED_SILENTLY) | set(ACK_REFUSALS) <= set(ALL_RULES)


def test_server_initiated_disconnect_codes_are_disconnect_codes():
    # shutdown 0x8B, take-over 0x8E, keep alive 0x8D: sent by the Server
    disconnect = valid_reasons(PacketType.DISCONNECT, 5, SERVER)
    for make in (lambda s: s.shutdown(), lambda s: s.take_over(), lambda s: s.tick(100.0)):
        h = Harness()
        h.feed(connect(5, keepalive=10))
        h.take()
        h.perform(make(h.session))
        sent = h.take()
        p, used = decode_packet(sent, 5, from_client=False)
        assert used == len(sent) and p.reason_code in disconnect


@pytest.mark.parametrize("rule, frame", [
    ("MQTT-3.1.2-1", bytes.fromhex("100D00044D5154550502000A000170")),
    ("MQTT-3.1.2-2", bytes.fromhex("100D00044D5154540702000A000170")),
    ("MQTT-3.1.3-8", connect(3, client_id="x" * 30)),
    ("MQTT-4.12.0-1", bytes.fromhex(
        "102300044D5154540502000A1515000B756E737570706F7274656416000474657374000170")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_connect_only_rules_never_reach_a_disconnect(rule, frame):
    first = Harness()
    first.feed(frame)  # as the first packet: the rule itself, in a CONNACK or a close
    rec = dict(first.records[-1][1])
    assert rec["reject"].decode() == rule
    h = Harness()
    h.feed(connect(5))
    h.take()
    h.feed(frame)  # after the CONNECT: a Protocol Error [MQTT-3.1.0-2]
    sent = h.take()
    p, _ = decode_packet(sent, 5, from_client=False)
    assert p.reason_code == 0x82
    s = Session("c2", "r", Limits(), 0.0)
    assert s.refuse("MQTT-3.1.4-2", 0x86, "x") == []  # only while a CONNECT awaits


def test_ack_refusals_decode_as_server_acks():
    h = Harness(Limits(max_inflight_qos2=1))
    h.feed(connect(5))
    h.take()
    bad = Properties(payload_format_indicator=1)
    h.feed(publish(5, qos=1, packet_id=1, payload=b"\xff", properties=bad)
           + publish(5, qos=2, packet_id=2, payload=b"\xff", properties=bad)
           + publish(5, qos=2, packet_id=3) + publish(5, qos=2, packet_id=4)
           + b"\x62\x02\x00\x09")  # PUBREL for an unknown id: PUBCOMP 0x92
    sent = h.take()
    codes = []
    while sent:
        p, used = decode_packet(sent, 5, from_client=False)  # checks each reason code
        codes.append((type(p).__name__, p.reason_code))
        sent = sent[used:]
    assert codes == [("PubAck", 0x99), ("PubRec", 0x99), ("PubRec", 0x00), ("PubRec", 0x97),
                     ("PubComp", 0x92)]
