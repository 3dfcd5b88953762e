"""Codec layers 1, 2 and 4: round trip over the catalogue, every proper prefix
is IncompleteData, and a hypothesis fuzz where only the codec's own outcomes
(IncompleteData, MqttError subclasses) may escape."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.mqtt import (
    Connect, IncompleteData, MqttError, PacketType, Publish, decode_packet, encode, frame_length,
)
from tests.mqtt.catalogue import CATALOGUE, Entry
from tests.mqtt.helpers import wire


def _level_for(entry: Entry) -> int | None:
    # A CONNECT is decoded before any level is known; it brings its own.
    return None if entry.packet.packet_type == PacketType.CONNECT else entry.level


CASES = [pytest.param(e, id=e.name) for e in CATALOGUE]


def test_catalogue_covers_every_packet_type_and_level():
    seen = {(e.packet.packet_type, e.level) for e in CATALOGUE}
    for ptype in PacketType:
        levels = (5,) if ptype is PacketType.AUTH else (3, 4, 5)
        assert any((ptype, lvl) in seen for lvl in levels), ptype
    assert {e.level for e in CATALOGUE} == {3, 4, 5}


@pytest.mark.parametrize("entry", CASES)
def test_round_trip(entry: Entry):
    frame = encode(entry.packet, entry.level)
    packet, used = decode_packet(frame, _level_for(entry), from_client=entry.from_client)
    assert packet == entry.packet
    assert used == len(frame)
    assert encode(packet, entry.level) == frame
    assert frame_length(frame) == len(frame)


@pytest.mark.parametrize("entry", CASES)
def test_round_trip_with_following_bytes_consumes_one_frame(entry: Entry):
    frame = encode(entry.packet, entry.level)
    packet, used = decode_packet(frame + b"\xc0\x00trailing", _level_for(entry),
                                 from_client=entry.from_client)
    assert (packet, used) == (entry.packet, len(frame))


@pytest.mark.parametrize("entry", CASES)
def test_every_proper_prefix_is_incomplete(entry: Entry):
    frame = encode(entry.packet, entry.level)
    view = memoryview(frame)  # slices of a view: no copy per prefix
    level = _level_for(entry)
    for cut in range(len(frame)):
        with pytest.raises(IncompleteData) as info:
            decode_packet(view[:cut], level, from_client=entry.from_client)
        needed = info.value.needed
        assert needed is None or needed == len(frame)
        assert info.value.have == cut
        assert not isinstance(info.value, MqttError)


def test_incomplete_reports_frame_length_once_header_is_known():
    with pytest.raises(IncompleteData) as info:
        decode_packet(wire("30 0E 0005 746F"), 4)  # PUBLISH RL 14, 4 of 16 bytes
    assert (info.value.needed, info.value.have, info.value.missing) == (16, 6, 10)
    with pytest.raises(IncompleteData) as info:
        decode_packet(wire("30 FF"), 4)  # Remaining Length continues
    assert info.value.needed is None and info.value.missing is None


def test_decode_accepts_bytes_bytearray_and_memoryview():
    frame = encode(Publish(qos=1, topic="t", packet_id=1, payload=b"x"), 4)
    for buf in (frame, bytearray(frame), memoryview(frame), memoryview(bytearray(frame))):
        packet, used = decode_packet(buf, 4)
        assert packet.payload == b"x" and type(packet.payload) is bytes
        assert used == len(frame)


def test_decoded_payload_does_not_alias_the_input_buffer():
    buf = bytearray(encode(Publish(topic="t", payload=b"abc"), 4))
    packet, _ = decode_packet(buf, 4)
    buf[-3:] = b"XYZ"
    assert packet.payload == b"abc"


def test_level_none_requires_from_client():
    with pytest.raises(ValueError):
        decode_packet(b"\x20\x02\x00\x00", None, from_client=False)


@pytest.mark.parametrize("level", [0, 2, 6, "5"])
def test_unknown_levels_are_caller_errors(level):
    with pytest.raises(ValueError):
        decode_packet(b"\xc0\x00", level)
    with pytest.raises(ValueError):
        encode(Publish(topic="t"), level)


def test_encode_rejects_non_packets():
    with pytest.raises(TypeError):
        encode(object(), 5)


@pytest.mark.parametrize("bad", [
    Publish(qos=3, topic="t", packet_id=1),
    Publish(qos=1, topic="t"),
    Publish(qos=0, topic="t", packet_id=1),
    Publish(qos=1, topic="t", packet_id=0),
    Publish(topic="x" * 65536),
    Publish(topic="\ud800"),
], ids=["qos3", "qos1-no-id", "MQTT-2.2.1-2-qos0-with-id", "id-0", "topic-too-long",
        "lone-surrogate"])
def test_encoder_refuses_unrepresentable_publish(bad):
    with pytest.raises(ValueError):
        encode(bad, 5)


def test_encoder_refuses_v5_features_at_v3():
    from bridge.mqtt import Auth, Disconnect, Properties, PubAck, Subscribe, Subscription
    for packet in (
        Publish(topic="t", properties=Properties(content_type="x")),
        PubAck(1, 0x10),
        Disconnect(0x04),
        Auth(0x18, Properties(authentication_method="m")),
        Subscribe(1, [Subscription("t", no_local=True)]),
        Connect.for_level(4, client_id="c", password=b"p"),
    ):
        with pytest.raises(ValueError):
            encode(packet, 4)
    with pytest.raises(ValueError):
        encode(Connect.for_level(5, client_id="c"), 4)  # level mismatch


# -- layer 4: fuzz ----------------------------------------------------------

FRAMES = [(e, encode(e.packet, e.level)) for e in CATALOGUE if len(encode(e.packet, e.level)) < 600]
LEVELS = st.sampled_from([None, 3, 4, 5])


def _decode_any(data: bytes, level, from_client: bool):
    """Decode; only the codec's own outcomes may escape. A decoded packet must
    re-encode and decode to itself."""
    if level is None and not from_client:
        from_client = True
    try:
        packet, used = decode_packet(data, level, from_client=from_client)
    except (IncompleteData, MqttError):
        return
    assert 0 < used <= len(data)
    out_level = packet.protocol_level if isinstance(packet, Connect) else level
    again, used2 = decode_packet(encode(packet, out_level), level, from_client=from_client)
    assert again == packet
    repr(packet)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64), level=LEVELS, from_client=st.booleans())
def test_fuzz_random_bytes(data, level, from_client):
    _decode_any(data, level, from_client)


@st.composite
def mutated_frames(draw):
    entry, frame = draw(st.sampled_from(FRAMES))
    buf = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "length"]))
        if op == "flip" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and buf:
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
        elif op == "insert":
            buf.insert(draw(st.integers(0, len(buf))), draw(st.integers(0, 255)))
        elif op == "delete" and len(buf) > 1:
            del buf[draw(st.integers(0, len(buf) - 1))]
        elif op == "truncate":
            del buf[draw(st.integers(0, len(buf))):]
        elif op == "length" and len(buf) > 1 and buf[1] < 0x80:
            buf[1] = draw(st.integers(0, 0x7F))  # Remaining Length disagreeing with content
    level = entry.level if entry.packet.packet_type != PacketType.CONNECT else None
    return bytes(buf), draw(st.sampled_from([level, level, 3, 4, 5])), entry.from_client


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated_frames())
def test_fuzz_mutated_frames(case):
    data, level, from_client = case
    _decode_any(data, level, from_client)


def test_package_docstring_example_runs():
    import doctest

    import bridge.mqtt

    assert doctest.testmod(bridge.mqtt, report=False).failed == 0
