"""The edge's session state machine, driven by bytes alone (no socket, no loop).

Test names carry the rule id they check (OASIS MQTT 5.0 numbering; project
ids LG-... from bridge/mqtt/rules.py and bridge/edge/rules.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.edge.session import (
    Capture, Close, Limits, Session, redact_password, reject_record,
)
from bridge.edge.state import NEVER_EXPIRES, SessionStore
from bridge.mqtt import (
    Connack, Connect, MqttError, Properties, Publish, Subscribe, Subscription, Unsubscribe, Will,
    encode,
)
from bridge.mqtt.codec import decode_packet
from tests.edge.util import Harness, connect, publish

CONNACK_OK = b"\x20\x02\x00\x00"


def connected(level: int = 4, limits: Limits | None = None, **fields) -> Harness:
    h = Harness(limits)
    h.feed(connect(level, **fields))
    assert h.session.state == "connected", h.closed
    h.take()
    return h


def reject_headers(h: Harness, i: int = -1) -> tuple[str, int, str]:
    hd = h.headers(i)
    return hd["reject"].decode(), int(hd["reject_code"]), hd["reject_error"].decode()


# ------------------------------------------------------------------ CONNECT
@pytest.mark.parametrize("level", [3, 4, 5])
def test_connect_is_captured_and_acknowledged(level):
    h = Harness()
    h.feed(connect(level, client_id="dev-1", keepalive=30))
    req = h.requests[0]
    assert (req.client_id, req.clean_start, req.protocol_level) == ("dev-1", True, level)
    sent = h.take()
    if level == 5:
        ack, _ = decode_packet(sent, 5, from_client=False)
        assert isinstance(ack, Connack) and ack.reason_code == 0 and not ack.session_present
    else:
        assert sent == CONNACK_OK
    frame, _ = h.records[0]
    assert frame == connect(level, client_id="dev-1", keepalive=30)
    hd = h.headers(0)
    assert hd["conn_id"] == b"c1" and hd["proto"] == str(level).encode()
    assert hd["remote"] == b"127.0.0.1:40000" and hd["origin"] == b"client"
    assert "username" not in hd and "reject" not in hd
    assert h.session.key == b"dev-1"


def test_connack_v5_advertises_the_limits():
    limits = Limits(max_packet_bytes=4096, receive_maximum=7, topic_alias_maximum=3,
                    retain_available=False)
    h = Harness(limits)
    h.feed(connect(5))
    ack, _ = decode_packet(h.take(), 5, from_client=False)
    p = ack.properties
    assert (p.receive_maximum, p.topic_alias_maximum, p.maximum_packet_size,
            p.retain_available) == (7, 3, 4096, 0)
    assert p.maximum_qos is None  # absent = 2, the only way to say 2 (MQTT 5.0 3.2.2.3.4)


def test_connack_v5_omits_properties_at_their_defaults():
    h = Harness(Limits(max_packet_bytes=268435460, receive_maximum=65535, topic_alias_maximum=0))
    h.feed(connect(5))
    assert h.take() == b"\x20\x03\x00\x00\x00"


def test_mqtt_3_1_3_8_empty_client_id_is_assigned_in_311_and_5():
    h = Harness()
    h.feed(connect(4, client_id=""))
    assert h.take() == CONNACK_OK
    assert h.session.client_id == "lakegate-c1" and h.session.key == b"lakegate-c1"
    h5 = Harness()
    h5.feed(connect(5, client_id=""))
    ack, _ = decode_packet(h5.take(), 5, from_client=False)
    assert ack.properties.assigned_client_identifier == "lakegate-c1"


@pytest.mark.parametrize("level, fields", [
    (3, {"client_id": ""}),
    (3, {"client_id": "x" * 24}),
    (4, {"client_id": "", "clean_start": False}),
])
def test_mqtt_3_1_3_8_client_id_refused(level, fields):
    h = Harness()
    h.feed(connect(level, **fields))
    assert h.take() == b"\x20\x02\x00\x02"
    assert h.closed.startswith("[MQTT-3.1.3-8]")
    assert reject_headers(h)[:2] == ("MQTT-3.1.3-8", 0x85)
    assert not h.requests


@pytest.mark.parametrize("name, level", [(b"MQTT", 6), (b"MQTT", 3), (b"MQIsdp", 4)])
def test_mqtt_3_1_2_2_unsupported_version_gets_connack_0x01(name, level):
    body = len(name).to_bytes(2, "big") + name + bytes((level, 2, 0, 10, 0, 1)) + b"p"
    h = Harness()
    h.feed(bytes((0x10, len(body))) + body)
    assert h.take() == b"\x20\x02\x00\x01"
    assert h.closed and reject_headers(h)[0] == "MQTT-3.1.2-2"


def test_mqtt_3_1_2_1_wrong_protocol_name_closes_without_connack():
    h = Harness()
    h.feed(bytes.fromhex("100D00044D5154550402000A000170"))
    assert h.take() == b"" and h.closed.startswith("[MQTT-3.1.2-1]")


@pytest.mark.parametrize("level, expect", [(4, b""), (5, b"\xe0\x01\x82")])
def test_mqtt_3_1_0_1_first_packet_must_be_connect(level, expect):
    h = Harness()
    h.feed(publish(4))
    assert h.take() == b"" and h.closed.startswith("[MQTT-3.1.0-1]")
    assert reject_headers(h)[0] == "MQTT-3.1.0-1"
    assert h.headers()["conn_id"] == b"c1" and "proto" not in h.headers()


@pytest.mark.parametrize("level, expect", [(4, b""), (5, b"\xe0\x01\x82")])
def test_mqtt_3_1_0_2_second_connect_is_a_protocol_error(level, expect):
    h = connected(level)
    second = connect(level, client_id="other", username="u", password=b"hunter2")
    h.feed(second)
    assert h.take() == expect
    assert h.closed.startswith("[MQTT-3.1.0-2]")
    frame, _ = h.records[-1]
    assert b"hunter2" not in frame  # never store passwords, not even of rejected frames
    assert decode_packet(frame, None)[0].password is None
    assert reject_headers(h)[:2] == ("MQTT-3.1.0-2", 0x82)


SECOND_CONNECTS = {
    "bad protocol name [MQTT-3.1.2-1]": bytes.fromhex("100D00044D5154550502000A000170"),
    "bad protocol level [MQTT-3.1.2-2]": bytes.fromhex("100D00044D5154540702000A000170"),
    "malformed [MQTT-3.1.2-3]": bytes.fromhex("100E00044D5154540503000A00000170"),
    "authentication method [MQTT-4.12.0-1]": bytes.fromhex(
        "102300044D5154540502000A1515000B756E737570706F7274656416000474657374000170"),
    "client id refused in 3.1 [MQTT-3.1.3-8]": connect(3, client_id="x" * 30),
}


@pytest.mark.parametrize("what", list(SECOND_CONNECTS))
@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_3_1_0_2_any_second_connect_is_a_protocol_error_0x82(level, what):
    # A second CONNECT is a Protocol Error whatever else is wrong with it:
    # 0x84 (Unsupported Protocol Version) is a CONNACK code, not a DISCONNECT
    # one [MQTT-3.14.2-1].
    h = connected(level)
    h.feed(SECOND_CONNECTS[what])
    assert h.take() == (b"\xe0\x01\x82" if level == 5 else b"")
    assert h.closed.startswith("[MQTT-3.1.0-2] a second CONNECT")
    assert reject_headers(h)[:2] == ("MQTT-3.1.0-2", 0x82)


@pytest.mark.parametrize("level", [3, 4, 5])
def test_password_is_redacted_before_capture(level):
    h = Harness()
    raw = connect(level, username="user", password=b"s3cr3t-pw", keepalive=15)
    h.feed(raw)
    frame, _ = h.records[0]
    assert b"s3cr3t-pw" not in frame
    p, used = decode_packet(frame, None)
    assert used == len(frame) and p.password is None and p.username == "user"
    assert p.keepalive == 15 and p.client_id == "dev"
    assert h.headers(0)["redacted"] == b"password" and h.headers(0)["username"] == b"user"
    assert h.requests[0].password == b"s3cr3t-pw" and "s3cr3t" not in repr(h.requests[0])


def test_redact_password_keeps_every_other_field():
    will = Will("w/t", b"bye", 1, True, Properties(will_delay_interval=3))
    c = Connect.for_level(5, client_id="id", username="u", password=b"pw" * 100, will=will,
                          properties=Properties(session_expiry_interval=9))
    out = redact_password(encode(c, 5), 200)
    p, _ = decode_packet(out, None)
    assert p == Connect.for_level(5, client_id="id", username="u", will=will,
                                  properties=Properties(session_expiry_interval=9))


def test_malformed_connect_keeps_no_payload():
    # Password Flag 0 but a password present [MQTT-3.1.2-18]: the trailing
    # bytes may be a password, so nothing after Keep Alive is recorded.
    raw = bytes.fromhex("101300044D5154540482000A000170000170") + b"\x00\x05hello"
    raw = bytes((0x10, len(raw) - 2)) + raw[2:]
    h = Harness()
    h.feed(raw)
    frame, _ = h.records[0]
    assert frame == raw[:12] and b"hello" not in frame
    rule, code, error = reject_headers(h)
    assert rule == "MQTT-3.1.2-18" and code == 0x81 and "payload not recorded" in error


def test_mqtt_4_12_0_1_authentication_method_is_refused_with_0x8c():
    h = Harness()
    h.feed(bytes.fromhex("102300044D5154540502000A1515000B756E737570706F7274656416000474657374"
                         "000170"))
    assert h.take() == b"\x20\x03\x00\x8c\x00"
    assert reject_headers(h)[:2] == ("MQTT-4.12.0-1", 0x8C)


def test_mqtt_3_1_2_24_no_connack_fits_a_tiny_maximum_packet_size():
    h = Harness()
    h.feed(bytes.fromhex("101300044D5154540502000A052700000002000170"))
    assert h.take() == b"" and h.closed.startswith("[MQTT-3.1.2-24]")


def test_mqtt_3_1_2_24_a_connack_too_large_for_the_client_is_never_replaced_by_a_refusal():
    # From 5 bytes a refusing CONNACK would fit, but 0x95 (Packet too large)
    # would say the CONNECT was too large: the edge closes without a CONNACK,
    # and its log line (the close reason) says so, with both sizes.
    ok = Harness()
    ok.feed(connect(5))
    size = len(ok.take())
    assert size > 5
    for limit in range(1, size):
        h = Harness()
        h.feed(connect(5, properties=Properties(maximum_packet_size=limit)))
        assert h.take() == b"", limit
        assert h.closed == (f"[MQTT-3.1.2-24] the CONNACK of {size} bytes exceeds the client's "
                            f"Maximum Packet Size of {limit} bytes: closed without a CONNACK")
        assert reject_headers(h)[0] == "MQTT-3.1.2-24" and not h.requests
    h = Harness()
    h.feed(connect(5, properties=Properties(maximum_packet_size=size)))
    assert len(h.take()) == size and h.session.state == "connected"


@pytest.mark.parametrize("level, expect", [(4, b"\x20\x02\x00\x04"), (3, b"\x20\x02\x00\x04"),
                                           (5, b"\x20\x03\x00\x86\x00")])
def test_mqtt_3_1_4_2_refused_credentials(level, expect):
    h = Harness(auto_accept=False)
    h.feed(connect(level, username="u", password=b"nope"))
    h.perform(h.session.refuse("MQTT-3.1.4-2", 0x86, "bad user name or password"))
    assert h.take() == expect and h.closed
    frame, _ = h.records[0]
    assert b"nope" not in frame
    assert reject_headers(h)[:2] == ("MQTT-3.1.4-2", 0x86)


@pytest.mark.parametrize("level, expect", [(4, b"\x20\x02\x00\x03"), (5, b"\x20\x03\x00\x89\x00")])
def test_lg_edge_busy_refuses_with_server_unavailable(level, expect):
    h = Harness(busy=True)
    h.feed(connect(level))
    assert h.take() == expect and reject_headers(h)[0] == "LG-edge-busy"


def test_bytes_after_connect_wait_for_the_servers_decision():
    h = Harness(auto_accept=False)
    h.feed(connect(4) + publish(4, qos=1, packet_id=9) + b"\xc0")
    assert h.records == [] and h.take() == b""
    h.feed(b"\x00")
    h.accept(h.requests[0])
    assert h.take() == CONNACK_OK + b"\x40\x02\x00\x09" + b"\xd0\x00"
    assert [f[0] for f in h.frames()] == [0x10, 0x32]


# ------------------------------------------------------------------ PUBLISH
@pytest.mark.parametrize("level", [3, 4, 5])
def test_publish_qos_0_1_2_flows(level):
    h = connected(level)
    h.feed(publish(level, qos=0))
    h.feed(publish(level, qos=1, packet_id=5))
    h.feed(publish(level, qos=2, packet_id=6, topic="q/2"))
    assert h.take() == b"\x40\x02\x00\x05" + b"\x50\x02\x00\x06"
    h.feed(b"\x62\x02\x00\x06")
    assert h.take() == b"\x70\x02\x00\x06"
    rel = h.headers()
    assert rel["rel_topic"] == b"q/2" and rel["rel_seq"] == b"3"  # the PUBLISH's capture seq
    assert [f[0] for f in h.frames()] == [0x10, 0x30, 0x32, 0x34, 0x62]


def test_acknowledgements_leave_in_publish_order_in_one_chunk():
    h = connected(4)
    h.feed(b"".join(publish(4, qos=1 + i % 2, packet_id=i + 1) for i in range(6)))
    assert h.take() == b"".join(bytes((0x40 if i % 2 == 0 else 0x50, 2, 0, i + 1))
                                for i in range(6))


def test_frames_split_anywhere_give_the_same_outcome():
    stream = connect(5) + b"".join(publish(5, topic=f"t/{i}", qos=i % 3, packet_id=i + 1,
                                           payload=bytes(range(i * 7 % 50)))
                                   for i in range(12)) + b"\xc0\x00"
    whole = Harness()
    whole.feed(stream)
    for step in (1, 2, 3, 7):
        h = Harness()
        for i in range(0, len(stream), step):
            h.feed(stream[i:i + step])
        assert h.frames() == whole.frames() and h.sent == whole.sent


def test_qos2_resend_awaiting_pubrel_is_acknowledged_again_and_marked_dup():
    h = connected(5)
    first = publish(5, qos=2, packet_id=7, topic="x/y")
    h.feed(first)
    dup = bytes((first[0] | 0x08,)) + first[1:]
    h.feed(dup)
    assert h.take() == b"\x50\x02\x00\x07" * 2
    assert "dup" not in h.headers(-2) and h.headers(-1)["dup"] == b"1"
    h.feed(b"\x62\x02\x00\x07")
    assert h.take() == b"\x70\x02\x00\x07"
    assert h.headers()["rel_seq"] == b"1"  # the first copy, not the re-send
    h.feed(first)  # the id is free again: a new message
    assert "dup" not in h.headers()


@pytest.mark.parametrize("level, expect", [(4, b"\x70\x02\x00\x09"), (5, b"\x70\x03\x00\x09\x92")])
def test_pubrel_for_an_unknown_packet_id(level, expect):
    h = connected(level)
    h.feed(b"\x62\x02\x00\x09")
    assert h.take() == expect and "rel_topic" not in h.headers()
    assert h.session.state == "connected"


def test_unsolicited_pubrec_gets_pubrel_and_puback_pubcomp_are_captured():
    h = connected(5)
    h.feed(b"\x50\x02\x00\x01" + b"\x50\x03\x00\x02\x80" + b"\x40\x02\x00\x03" + b"\x70\x02\x00\x04")
    assert h.take() == b"\x62\x03\x00\x01\x92"
    assert [f[0] for f in h.frames()[1:]] == [0x50, 0x50, 0x40, 0x70]


def test_pingreq_is_answered_and_not_captured():
    h = connected(4)
    h.feed(b"\xc0\x00")
    assert h.take() == b"\xd0\x00" and len(h.records) == 1


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_3_8_4_6_subscribe_is_granted_per_filter_and_unsubscribe_answered(level):
    h = connected(level)
    h.feed(encode(Subscribe(3, [Subscription("a/#", 1), Subscription("b", 2)]), level))
    h.feed(encode(Unsubscribe(4, ["a/#", "c"]), level))
    suback = b"\x90\x05\x00\x03\x00\x01\x02" if level == 5 else b"\x90\x04\x00\x03\x01\x02"
    unsuback = b"\xb0\x05\x00\x04\x00\x00\x11" if level == 5 else b"\xb0\x02\x00\x04"
    assert h.take() == suback + unsuback
    assert h.session.state == "connected"
    assert [f[0] for f in h.frames()[1:]] == [0x82, 0xA2]
    assert h.headers(1)["granted"] == b"0102"
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("dev")] == ["b"]


# ------------------------------------------------------------------ violations
VIOLATIONS = [
    # (rule, frame bytes after a CONNECT, MQTT 5 reason)
    ("MQTT-3.3.1-4", bytes.fromhex("360F0005746F706963007061796C6F6164"), 0x81),
    ("MQTT-3.3.1-2", bytes.fromhex("380F0005746F706963007061796C6F6164"), 0x81),
    ("MQTT-3.3.2-2", bytes.fromhex("300F00052B6F706963007061796C6F6164"), 0x81),
    ("MQTT-3.3.2-2", bytes.fromhex("300F0005236F706963007061796C6F6164"), 0x81),
    ("MQTT-1.5.4-1", bytes.fromhex("300F0005746FEDA080007061796C6F6164"), 0x81),  # surrogate
    ("MQTT-1.5.4-1", bytes.fromhex("300F0005746FC0AF70007061796C6F6164"), 0x81),  # overlong
    ("MQTT-1.5.4-2", bytes.fromhex("300F0005746F700000007061796C6F6164"), 0x81),  # U+0000
    ("MQTT-2.2.1-3", bytes.fromhex("32110005746F7069630000007061796C6F6164"), 0x82),
    ("MQTT-2.1.3-1", b"\xc1\x00", 0x81),
    ("MQTT-3.6.1-1", b"\x63\x03\x00\x01\x00", 0x81),
    ("LG-remaining-length", b"\x30\xff\xff\xff\xff\x7f", 0x81),
    ("MQTT-3.3.4-6", bytes.fromhex("32130005746F7069631234020B017061796C6F6164"), 0x82),
    ("LG-property-duplicate", bytes.fromhex("32150005746F706963123404010101017061796C6F6164"),
     0x82),
    ("LG-property-not-allowed", bytes.fromhex("320D0005746F706963123402170070"), 0x81),
    ("LG-packet-direction", b"\x20\x02\x00\x00", 0x82),
    ("LG-packet-direction", b"\xd0\x00", 0x82),
    ("LG-packet-type-reserved", b"\x00\x00", 0x82),
    ("LG-truncated", b"\x32\x03\x00\x01a", 0x81),  # QoS 1 without a Packet Identifier
    ("MQTT-3.3.2-8", bytes.fromhex("30120005746F706963032300007061796C6F6164"), 0x94),
    ("MQTT-4.12.0-7", b"\xf0\x00", 0x82),
    ("MQTT-4.12.0-7", b"\xf1\x00", 0x82),
]


@pytest.mark.parametrize("rule, frame, reason", VIOLATIONS,
                         ids=[f"{r}-{f[:2].hex()}" for r, f, _ in VIOLATIONS])
def test_violation_disconnects_with_its_reason_and_is_recorded(rule, frame, reason):
    h = connected(5)
    h.feed(frame + publish(5, topic="never/seen"))
    assert h.take() == bytes((0xE0, 1, reason))
    assert h.closed.startswith(f"[{rule}]")
    got_rule, code, error = reject_headers(h)
    assert (got_rule, code) == (rule, reason) and error.startswith(f"[{rule}] ")
    assert h.records[-1][0] == frame[:len(h.records[-1][0])]
    assert all(b"never/seen" not in f for f in h.frames())  # nothing after the fault
    h.feed(publish(5))
    assert len(h.records) == 2  # closed: later bytes are ignored


V311 = [
    ("MQTT-3.3.1-4", bytes.fromhex("360E0005746F7069637061796C6F6164")),
    ("MQTT-3.3.1-2", bytes.fromhex("380E0005746F7069637061796C6F6164")),
    ("MQTT-3.3.2-2", bytes.fromhex("300E00052B6F7069637061796C6F6164")),
    ("MQTT-1.5.4-1", bytes.fromhex("300E0005746FEDA0807061796C6F6164")),
    ("MQTT-1.5.4-2", bytes.fromhex("300E0005746F7000007061796C6F6164")),
    ("MQTT-2.2.1-3", bytes.fromhex("32100005746F70696300007061796C6F6164")),
    ("MQTT-2.1.3-1", b"\xc1\x00"),
    ("LG-remaining-length", b"\x30\xff\xff\xff\xff\x7f"),
    ("LG-packet-direction", b"\x20\x02\x00\x00"),
    ("LG-packet-type-reserved", b"\xf0\x00"),  # AUTH before MQTT 5
]


@pytest.mark.parametrize("rule, frame", V311, ids=[f"{r}-{f[:2].hex()}" for r, f in V311])
def test_violation_in_311_closes_without_a_packet(rule, frame):
    h = connected(4)
    h.feed(frame)
    assert h.take() == b"" and h.closed.startswith(f"[{rule}]"), h.closed
    assert reject_headers(h)[0] == rule


def test_mqtt_3_2_2_15_packet_larger_than_maximum_is_recorded_truncated():
    h = connected(5, Limits(max_packet_bytes=2000))
    big = publish(5, payload=b"z" * 5000)
    h.feed(big[:3000])  # judged from the fixed header; the body is never buffered
    assert h.take() == b"\xe0\x01\x95"
    frame, _ = h.records[-1]
    assert frame == big[:1024]
    rule, code, error = reject_headers(h)
    assert (rule, code) == ("MQTT-3.2.2-15", 0x95)
    assert f"truncated: 1024 of {len(big)} bytes recorded" in error


def stretch(frame: bytes) -> bytes:
    """``frame`` (Remaining Length < 128) with its Remaining Length in two bytes."""
    return bytes((frame[0], frame[1] | 0x80, 0)) + frame[2:]


@pytest.mark.parametrize("level", [3, 4])
def test_non_minimal_remaining_length_is_accepted_in_3_1_and_3_1_1(level):
    # MQTT-1.5.5-1 is MQTT 5's; MQTT 3.1.1 section 2.2.3 sets no minimum.
    h = Harness()
    h.feed(stretch(connect(level, username="u", password=b"pw-123")))
    assert h.take() == CONNACK_OK and h.session.state == "connected"
    frame, _ = h.records[0]
    assert b"pw-123" not in frame and decode_packet(frame, None)[0].password is None
    h.feed(stretch(publish(level, qos=1, packet_id=5)))
    assert h.take() == b"\x40\x02\x00\x05" and h.frames()[-1] == stretch(publish(level, qos=1,
                                                                                   packet_id=5))
    assert "reject" not in h.headers()


def test_mqtt_1_5_5_1_non_minimal_remaining_length_is_refused_in_5():
    h = connected(5)
    h.feed(stretch(publish(5, qos=1)))
    assert h.take() == b"\xe0\x01\x81" and reject_headers(h)[0] == "MQTT-1.5.5-1"


def test_topic_alias_is_resolved_into_the_capture_headers():
    h = connected(5, Limits(topic_alias_maximum=4))
    h.feed(publish(5, topic="long/topic/name", qos=1, packet_id=1,
                   properties=Properties(topic_alias=2)))
    h.feed(publish(5, topic="", qos=1, packet_id=2, properties=Properties(topic_alias=2)))
    h.feed(publish(5, topic="plain", qos=0))
    assert h.take() == b"\x40\x02\x00\x01\x40\x02\x00\x02"
    assert h.headers(1)["alias_topic"] == b"long/topic/name"
    assert h.headers(2)["alias_topic"] == b"long/topic/name"
    assert h.records[2][0] == publish(5, topic="", qos=1, packet_id=2,
                                      properties=Properties(topic_alias=2))  # frame stays raw
    assert "alias_topic" not in h.headers(3)


def test_mqtt_3_3_2_9_topic_alias_above_maximum():
    h = connected(5, Limits(topic_alias_maximum=10))
    h.feed(bytes.fromhex("30120005746F7069630323000B7061796C6F6164"))
    assert h.take() == b"\xe0\x01\x94" and reject_headers(h)[0] == "MQTT-3.3.2-9"


def test_lg_topic_alias_unmapped():
    h = connected(5)
    h.feed(publish(5, topic="", properties=Properties(topic_alias=3)))
    assert h.take() == b"\xe0\x01\x82" and reject_headers(h)[0] == "LG-topic-alias-unmapped"


def test_topic_alias_maximum_0_refuses_every_alias():
    h = connected(5, Limits(topic_alias_maximum=0))
    h.feed(publish(5, topic="t", properties=Properties(topic_alias=1)))
    assert h.take() == b"\xe0\x01\x94"


NOT_UTF8 = Properties(payload_format_indicator=1)


@pytest.mark.parametrize("qos, ack", [(1, 0x40), (2, 0x50)])
def test_lg_payload_format_invalid_is_refused_with_0x99_and_captured_marked(qos, ack):
    # MQTT 5.0 section 3.3.2.3.2: a receiver that validates the payload MAY
    # refuse it with 0x99 Payload format invalid in PUBACK / PUBREC.
    h = connected(5, Limits(receive_maximum=1))
    bad = publish(5, qos=qos, packet_id=7, payload=b"ok \xff\xfe", properties=NOT_UTF8)
    h.feed(bad)
    assert h.take() == bytes((ack, 3, 0, 7, 0x99))
    assert h.records[-1][0] == bad
    rule, code, error = reject_headers(h)
    assert (rule, code) == ("LG-payload-format-invalid", 0x99) and "5 bytes" in error
    assert h.session.state == "connected" and h.closed is None
    assert 7 not in h.session.client.qos2  # PUBREC >= 0x80 ends the QoS 2 exchange
    # the refusal's ack released the Receive Maximum unit: the next one is accepted
    h.feed(publish(5, qos=qos, packet_id=8, payload="é".encode(), properties=NOT_UTF8))
    assert h.take() == bytes((ack, 2, 0, 8)) and "reject" not in h.headers()


@pytest.mark.parametrize("qos", [1, 2])
def test_lg_payload_format_invalid_refusal_waits_for_no_forwarding(qos):
    # The job never forwards a refused frame, so with ack_after = "forward"
    # its PUBACK/PUBREC must wait only for durability, not a forwarded mark.
    h = connected(5)
    acts = h.session.receive_data(publish(5, qos=qos, payload=b"\xff", properties=NOT_UTF8), 0.0)
    (cap,) = [a for a in acts if isinstance(a, Capture)]
    assert cap.reply[-1] == 0x99 and cap.forward is None and cap.qos2 is None


def test_lg_payload_format_invalid_qos0_is_captured_marked_and_the_connection_stays():
    h = connected(5)
    h.feed(publish(5, payload=b"\xc0\xaf", properties=NOT_UTF8) + publish(5, payload=b"next"))
    assert h.take() == b"" and h.session.state == "connected"
    assert reject_headers(h, -2)[:2] == ("LG-payload-format-invalid", 0x99)
    assert "reject" not in h.headers(-1)


def test_lg_payload_format_invalid_will_is_refused_with_connack_0x99():
    # MQTT 5.0 section 3.1.3.2.3: the Server MAY validate the Will's format
    # and refuse the CONNECT with 0x99 (its Will would be kept out otherwise).
    will = Will("dev/status", b"\xff\xfe", 1, False, NOT_UTF8)
    h = Harness()
    h.feed(connect(5, will=will))
    assert h.take() == b"\x20\x03\x00\x99\x00" and not h.requests
    assert reject_headers(h)[:2] == ("LG-payload-format-invalid", 0x99)
    assert h.closed.startswith("[LG-payload-format-invalid] Will Payload of 2 bytes")
    ok = Harness()
    ok.feed(connect(5, will=Will("dev/status", "bye ü".encode(), 1, False, NOT_UTF8)))
    assert ok.session.state == "connected"


@pytest.mark.parametrize("level, props", [(5, Properties(payload_format_indicator=0)),
                                          (5, Properties()), (4, Properties()),
                                          (3, Properties())])
def test_payload_not_utf8_is_accepted_without_payload_format_indicator_1(level, props):
    h = connected(level)
    h.feed(publish(level, qos=1, payload=b"\xff", properties=props))
    assert h.take() == b"\x40\x02\x00\x01" and "reject" not in h.headers()


def test_mqtt_3_3_4_7_receive_maximum_exceeded():
    limits = Limits(receive_maximum=2)
    s = Session("c1", "r", limits, 0.0)
    h = Harness(limits)
    h.session = s
    s_actions = s.receive_data(connect(5), 0.0)
    h.perform(s_actions)
    h.take()
    # Capture replies without releasing quota: the fake server "has not
    # written" the PUBACKs yet.
    acts = s.receive_data(publish(5, qos=1, packet_id=1) + publish(5, qos=2, packet_id=2), 0.0)
    assert not any(isinstance(a, Close) for a in acts)
    acts = s.receive_data(publish(5, qos=1, packet_id=3), 0.0)
    assert isinstance(acts[-1], Close) and acts[-1].reason.startswith("[MQTT-3.3.4-7]")
    assert acts[-2].data == b"\xe0\x01\x93"


def test_receive_maximum_counts_only_until_the_ack_is_written():
    h = connected(5, Limits(receive_maximum=1))
    for pid in range(1, 50):
        h.feed(publish(5, qos=1 + pid % 2, packet_id=pid))
        if pid % 2:
            h.feed(b"\x62\x02" + pid.to_bytes(2, "big"))
    assert h.session.state == "connected"


def test_lg_edge_qos2_quota_v5_refuses_with_pubrec_0x97():
    h = connected(5, Limits(max_inflight_qos2=2))
    h.feed(publish(5, qos=2, packet_id=1) + publish(5, qos=2, packet_id=2)
           + publish(5, qos=2, packet_id=3))
    assert h.take() == b"\x50\x02\x00\x01\x50\x02\x00\x02\x50\x03\x00\x03\x97"
    assert reject_headers(h)[:2] == ("LG-edge-qos2-quota", 0x97)
    assert h.session.state == "connected"
    h.feed(b"\x62\x02\x00\x01" + publish(5, qos=2, packet_id=3))
    assert h.take() == b"\x70\x02\x00\x01\x50\x02\x00\x03"


def test_lg_edge_qos2_quota_311_closes():
    h = connected(4, Limits(max_inflight_qos2=1))
    h.feed(publish(4, qos=2, packet_id=1) + publish(4, qos=2, packet_id=2))
    assert h.take() == b"\x50\x02\x00\x01" and h.closed.startswith("[LG-edge-qos2-quota]")


def test_mqtt_3_2_2_14_retain_when_not_available():
    h = connected(5, Limits(retain_available=False))
    h.feed(publish(5, retain=True))
    assert h.take() == b"\xe0\x01\x9a" and reject_headers(h)[0] == "MQTT-3.2.2-14"


# ------------------------------------------------------------------ endings, will
def will_connect(level: int, **wfields) -> bytes:
    will = Will("dev/status", b"offline", wfields.pop("qos", 1), wfields.pop("retain", True),
                wfields.pop("properties", Properties()))
    return connect(level, will=will, **wfields)


@pytest.mark.parametrize("level", [3, 4, 5])
def test_will_is_published_when_the_connection_is_lost(level):
    h = Harness()
    h.feed(will_connect(level))
    h.perform(h.session.connection_lost(5.0))
    (w,) = h.wills
    p, _ = decode_packet(w.frame, level)
    assert isinstance(p, Publish)
    assert (p.topic, p.payload, p.qos, p.retain, p.packet_id) == ("dev/status", b"offline", 1,
                                                                  True, 1)
    hd = dict(w.headers)
    assert hd["origin"] == b"will" and hd["conn_id"] == b"c1" and w.key == b"dev"
    assert w.delay_s == 0


@pytest.mark.parametrize("reason, published", [(0x00, False), (0x04, True), (0x80, True)])
def test_disconnect_reason_decides_the_will(reason, published):
    h = Harness()
    h.feed(will_connect(5))
    h.take()
    h.feed(bytes((0xE0, 1, reason)))
    assert bool(h.wills) is published
    assert h.closed.startswith("client DISCONNECT") and h.take() == b""
    assert h.frames()[-1] == bytes((0xE0, 1, reason))


def test_will_properties_become_publish_properties_and_the_delay_is_capped():
    props = Properties(will_delay_interval=30, message_expiry_interval=60, content_type="text",
                       user_properties=[("k", "v")], payload_format_indicator=1)
    h = Harness()
    h.feed(connect(5, will=Will("w", b"bye", 0, False, props),
                   properties=Properties(session_expiry_interval=10)))
    h.perform(h.session.connection_lost(1.0))
    (w,) = h.wills
    p, _ = decode_packet(w.frame, 5)
    assert p.properties == Properties(message_expiry_interval=60, content_type="text",
                                      user_properties=[("k", "v")], payload_format_indicator=1)
    assert p.packet_id is None and w.delay_s == 10  # min(will delay 30, session expiry 10)


def test_disconnect_setting_session_expiry_0_ends_the_session():
    store = SessionStore()
    h = Harness(store=store)
    h.feed(connect(5, properties=Properties(session_expiry_interval=60)))
    h.feed(publish(5, qos=2, packet_id=1))
    assert "dev" in store.sessions
    h.feed(bytes.fromhex("E00700051100000000"))
    assert h.closed == "client DISCONNECT"
    store.close(h.session.client, 1000.0)
    assert store.sessions == {}


def test_lg_disconnect_session_expiry_after_connect_set_0():
    h = connected(5)
    h.feed(bytes.fromhex("E00700051100000001"))
    assert h.take() == b"\xe0\x01\x82" and reject_headers(h)[0] == "LG-disconnect-session-expiry"


@pytest.mark.parametrize("level, keepalive", [(4, 10), (5, 10)])
def test_keep_alive_timeout_after_one_and_a_half_periods(level, keepalive):
    h = Harness()
    h.feed(will_connect(level, keepalive=keepalive), now=0.0)
    h.take()
    assert h.session.deadline == 15.0
    h.feed(b"\xc0\x00", now=10.0)
    assert h.session.deadline == 25.0
    h.perform(h.session.tick(24.9))
    assert h.closed is None
    h.perform(h.session.tick(25.0))
    assert h.take() == (b"\xd0\x00" + (b"\xe0\x01\x8d" if level == 5 else b""))
    assert "keep alive timeout" in h.closed and len(h.wills) == 1


def test_connect_timeout():
    h = Harness(Limits(connect_timeout_s=2.0))
    h.feed(b"\x10\x10", now=0.5)
    assert h.session.deadline == 2.0
    h.perform(h.session.tick(2.0))
    assert h.closed.startswith("connect timeout") and h.records == []


@pytest.mark.parametrize("level, expect", [(4, b""), (5, b"\xe0\x01\x8b")])
def test_shutdown_and_take_over(level, expect):
    h = Harness()
    h.feed(will_connect(level))
    h.take()
    h.perform(h.session.shutdown())
    assert h.take() == expect and h.closed == "server shutting down [LG-edge-shutdown]"
    assert len(h.wills) == 1
    h2 = Harness()
    h2.feed(connect(level))
    h2.take()
    h2.perform(h2.session.take_over())
    assert h2.take() == (b"\xe0\x01\x8e" if level == 5 else b"")
    assert "session taken over" in h2.closed


# ------------------------------------------------------------------ sessions
def test_persistent_session_keeps_qos2_state_across_connections():
    store = SessionStore()
    h = Harness(store=store)
    h.feed(connect(4, clean_start=False))
    h.feed(publish(4, qos=2, packet_id=11, topic="keep/me"))
    h.perform(h.session.connection_lost(1.0))
    store.close(h.session.client, 1000.0)
    h2 = Harness(store=store, conn_id="c2")
    h2.feed(connect(4, clean_start=False))
    assert h2.take() == b"\x20\x02\x01\x00"  # Session Present
    h2.feed(b"\x62\x02\x00\x0b")
    assert h2.take() == b"\x70\x02\x00\x0b" and h2.headers()["rel_topic"] == b"keep/me"


def test_clean_session_discards_state_and_3_1_has_no_session_present_flag():
    store = SessionStore()
    h = Harness(store=store)
    h.feed(connect(3, clean_start=False))
    h.feed(publish(3, qos=2, packet_id=1))
    store.close(h.session.client, 1000.0)
    h2 = Harness(store=store)
    h2.feed(connect(3, clean_start=False))
    assert h2.take() == CONNACK_OK  # byte 1 is reserved in MQTT 3.1
    assert h2.present is True and 1 in h2.session.client.qos2
    store.close(h2.session.client, 1000.0)
    h3 = Harness(store=store)
    h3.feed(connect(4, clean_start=True))
    assert h3.take() == CONNACK_OK and not h3.session.client.qos2


def test_session_expiry_v5():
    store = SessionStore()
    h = Harness(store=store)
    h.feed(connect(5, clean_start=False, properties=Properties(session_expiry_interval=60)))
    assert h.requests[0].expiry_s == 60
    h.feed(publish(5, qos=2, packet_id=1))
    store.close(h.session.client, 1000.0)
    assert store.open("dev", False, 60, 1059.0)[1] is True
    store.close(store.sessions["dev"], 1059.0)
    assert store.open("dev", False, 60, 1119.5)[1] is False
    assert Harness().feed(connect(4, clean_start=False)).requests[0].expiry_s == NEVER_EXPIRES


# ------------------------------------------------------------------ fuzz
@settings(max_examples=300, deadline=None)
@given(level=st.sampled_from([3, 4, 5]), junk=st.binary(max_size=200),
       cut=st.integers(min_value=1, max_value=50))
def test_fuzz_only_actions_come_out(level, junk, cut):
    h = connected(level)
    stream = publish(level, qos=1, packet_id=1) + junk
    for i in range(0, len(stream), cut):
        h.feed(stream[i:i + cut])  # no exception may escape receive_data
    assert h.session.state in ("connected", "closed")
    if h.session.state == "closed":
        assert "reject" in h.headers() or h.closed.startswith("client DISCONNECT")


def test_reject_record_of_a_complete_frame_is_the_frame():
    frame = b"\xc1\x00"
    assert reject_record(memoryview(frame + b"more"), MqttError("X", "y")) == (frame, "")
