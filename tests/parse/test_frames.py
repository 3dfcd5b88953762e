"""parse_frames: inputs, output schema, columns per packet type, batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import bridge.parse.frames as frames_mod
from bridge.mqtt import (
    Connect, Disconnect, PingReq, Properties, PubAck, PubComp, PubRec, PubRel, Publish,
    Subscribe, Subscription, Will, encode,
)
from bridge.parse import PARSED_SCHEMA, PARSED_VIEW_SCHEMA, parse_frames
from schemas.ddl import to_arrow
from schemas.frames import PARSED_FRAME_DDL
from tests.parse.reference import compare, reference_row


def pub(level=5, **kw) -> bytes:
    kw.setdefault("topic", "site/1/temp")
    kw.setdefault("payload", b"21.5")
    return encode(Publish(**kw), level)


def rows(frames, levels=5, alias=None, **kw):
    return parse_frames(frames, levels, alias, **kw).to_pylist()


def test_schema_is_parsed_frame_ddl():
    assert PARSED_SCHEMA == to_arrow(PARSED_FRAME_DDL)
    assert parse_frames([pub()], 5).schema == to_arrow(PARSED_FRAME_DDL)


def test_empty_batch():
    for empty in ([], pa.array([], pa.binary()), pd.Series([], dtype=object)):
        table = parse_frames(empty, [])
        assert table.num_rows == 0 and table.schema == PARSED_SCHEMA


def test_all_invalid_batch():
    bad = [b"", b"\x36\x00", b"\x30\x01\x00", b"\x00\x00", pub() + b"\x00"]
    out = rows(bad)
    assert [r["valid"] for r in out] == [False] * 5
    assert [r["rule"] for r in out] == ["LG-truncated", "MQTT-3.3.1-4", "MQTT-3.3.2-1",
                                        "LG-packet-type-reserved", "LG-trailing-bytes"]
    assert all(r["topic"] is None and r["payload"] is None for r in out)


@pytest.mark.parametrize("kind", ["binary", "large_binary", "chunked", "pandas", "list", "numpy"])
def test_accepted_input_types(kind):
    frames = [pub(qos=1, packet_id=1), None, pub(4)]
    levels = [5, 5, 4]
    data = {
        "binary": pa.array(frames, pa.binary()),
        "large_binary": pa.array(frames, pa.large_binary()),
        "chunked": pa.chunked_array([pa.array(frames[:1], pa.binary()),
                                     pa.array(frames[1:], pa.binary())]),
        "pandas": pd.Series(frames, dtype=object),
        "list": frames,
        "numpy": np.array(frames, dtype=object),
    }[kind]
    lv = pd.Series(levels) if kind == "pandas" else levels
    out = rows(data, lv)
    assert [r["valid"] for r in out] == [True, False, True]
    assert out[1]["rule"] == "LG-truncated"  # a null record is an empty one
    assert out[0]["topic"] == out[2]["topic"] == "site/1/temp"


def test_sliced_arrow_input_keeps_positions():
    arr = pa.array([b"junk", pub(), pub(topic="b/c")], pa.binary()).slice(1)
    assert [r["topic"] for r in rows(arr)] == ["site/1/temp", "b/c"]


def test_mixed_protocol_levels_in_one_batch():
    frames = [pub(3), pub(4), pub(5, properties=Properties(content_type="text/plain")),
              pub(4)[:0] + b"\x30" + pub(5)[1:]]
    out = rows(frames, [3, 4, 5, 4])
    assert [r["valid"] for r in out[:3]] == [True, True, True]
    assert out[2]["content_type"] == "text/plain"
    assert out[0]["user_properties"] == [] and out[0]["subscription_identifiers"] == []
    # a MQTT 5 frame read as 3.1.1: its property length byte becomes payload
    assert out[3]["valid"] and out[3]["payload"] == b"\x0021.5"


def test_alias_resolution():
    frames = [pub(topic="", properties=Properties(topic_alias=4)),       # uses the alias
              pub(topic="set/it", properties=Properties(topic_alias=4)),  # sets the alias
              pub()]
    out = rows(frames, 5, ["dev/4/state", "dev/4/state", None])
    assert [r["topic"] for r in out] == ["dev/4/state", "set/it", "site/1/temp"]
    assert [r["topic_alias"] for r in out] == [4, 4, None]


def test_user_properties_keep_order_and_duplicates():
    user = [("b", "2"), ("a", "1"), ("b", "2"), ("é", "€")]
    out = rows([pub(properties=Properties(user_properties=user)), pub()])
    assert out[0]["user_properties"] == [{"key": k, "value": v} for k, v in user]
    assert out[1]["user_properties"] == []


def test_every_publish_property_has_its_column():
    props = Properties(payload_format_indicator=1, message_expiry_interval=4_000_000_000,
                       topic_alias=9, response_topic="r/1", correlation_data=b"\x00\xff",
                       user_properties=[("k", "v")], subscription_identifiers=[1, 268435455],
                       content_type="application/json")
    r = rows([pub(properties=props, payload=b"{}")], from_client=False)[0]
    assert r["valid"], r["error"]
    assert (r["payload_format_indicator"], r["message_expiry_interval"], r["topic_alias"],
            r["response_topic"], r["correlation_data"], r["content_type"]) == (
        1, 4_000_000_000, 9, "r/1", b"\x00\xff", "application/json")
    assert r["subscription_identifiers"] == [1, 268435455]


def test_publish_fixed_header_and_payload_columns():
    r = rows([pub(qos=2, packet_id=513, dup=True, retain=True, payload=b"x" * 300)])[0]
    assert (r["packet_type"], r["dup"], r["qos"], r["retain"], r["packet_id"]) == (3, True, 2, True, 513)
    assert r["payload"] == b"x" * 300 and r["payload_size"] == 300
    assert r["remaining_length"] == len(pub(qos=2, packet_id=513, payload=b"x" * 300)) - 3


@pytest.mark.parametrize("level", [3, 4, 5])
def test_acks_packet_id_and_reason_code(level):
    acks = [PubAck(packet_id=1), PubRec(packet_id=2), PubRel(packet_id=3), PubComp(packet_id=4)]
    if level == 5:
        acks += [PubAck(packet_id=5, reason_code=0x10),
                 PubRel(packet_id=6, reason_code=0x92,
                        properties=Properties(reason_string="gone", user_properties=[("a", "b")]))]
    out = rows([encode(a, level) for a in acks], level)
    assert [(r["packet_type"], r["packet_id"], r["reason_code"]) for r in out] == [
        (a.packet_type, a.packet_id, a.reason_code) for a in acks]
    assert all(r["valid"] and r["topic"] is None and r["qos"] is None for r in out)


def test_connect_columns_from_the_scalar_codec():
    will = Will(topic="dev/1/gone", payload=b"bye", qos=1, retain=True,
                properties=Properties(will_delay_interval=30, content_type="t",
                                      user_properties=[("a", "b")]))
    c5 = Connect.for_level(5, client_id="dev-1", keepalive=30, clean_start=False, will=will)
    c3 = Connect.for_level(3, client_id="old", keepalive=10)
    out = rows([encode(c5, 5), encode(c3, 3)], [None, 3])
    assert out[0]["valid"] and out[0]["client_id"] == "dev-1"
    assert (out[0]["connect_protocol_level"], out[0]["clean_start"], out[0]["keepalive"]) == (5, False, 30)
    assert (out[0]["will_topic"], out[0]["will_payload"], out[0]["will_qos"], out[0]["will_retain"]) == (
        "dev/1/gone", b"bye", 1, True)
    assert out[0]["will_properties"]["will_delay_interval"] == 30
    assert out[0]["will_properties"]["user_properties"] == [{"key": "a", "value": "b"}]
    assert out[1]["connect_protocol_level"] == 3 and out[1]["will_topic"] is None


def test_rare_types_match_the_codec():
    frames = [encode(Subscribe(packet_id=7, subscriptions=[Subscription("a/#")]), 5),
              encode(Disconnect(reason_code=4), 5), encode(PingReq(), 5),
              b"\x82\x02\x00\x00", b"\xe0\x01\x99", b"\x10\x00"]
    out = rows(frames, 5)
    for f, r in zip(frames, out):
        assert compare(r, reference_row(f, 5)) == []
    assert out[0]["packet_id"] == 7 and out[1]["reason_code"] == 4


def test_error_text_starts_with_the_rule():
    r = rows([b"\x30\x03\x00\x01+"])[0]
    assert r["error"] == "[MQTT-3.3.2-2] PUBLISH Topic Name contains a wildcard character"


def test_large_batches_are_parsed_in_slices(monkeypatch):
    frames = [pub(topic=f"t/{i}", qos=i % 2, packet_id=(i % 2) or None,
                  properties=Properties(user_properties=[("i", str(i))]))
              for i in range(50)] + [b"\x36\x00"]
    whole = parse_frames(frames, 5)
    monkeypatch.setattr(frames_mod, "SLICE_ROWS", 7)
    sliced = parse_frames(frames, 5)
    assert sliced.num_rows == 51 and sliced.to_pylist() == whole.to_pylist()
    monkeypatch.setattr(frames_mod, "SLICE_BYTES", 1)  # one frame per slice
    assert parse_frames(frames, 5).to_pylist() == whole.to_pylist()


def _payload_frames():
    """PUBLISH frames with empty, inline (<= 12 bytes) and long payloads,
    around invalid frames, a null record and other packet types."""
    sizes = [0, 1, 4, 11, 12, 13, 40, 300, 5000]
    frames = [pub(topic=f"s/{n}", payload=bytes(range(256)) * (n // 256) + bytes(n % 256),
                  qos=n % 2, packet_id=(n % 2) or None) for n in sizes]
    return frames + [b"\x36\x00", None, encode(PubAck(packet_id=3), 5),
                     pub(payload=b"z" * 20) + b"\x00"] + frames[::-1]


def test_payload_views_give_the_same_values_without_copying(monkeypatch):
    frames = pa.array(_payload_frames(), pa.large_binary())
    copied = parse_frames(frames, 5)
    for slice_rows in (1 << 15, 4):  # one slice; many slices, each with its own buffer
        monkeypatch.setattr(frames_mod, "SLICE_ROWS", slice_rows)
        views = parse_frames(frames, 5, payload_views=True)
        assert views.schema == PARSED_VIEW_SCHEMA
        assert views.schema.field("payload").type == pa.binary_view()
        assert views.to_pylist() == copied.to_pylist()
        assert views.column("payload").cast(pa.binary()).equals(copied.column("payload"))
        # no copy: the long payloads' views point into the frames' own buffer
        base, size = frames.buffers()[2].address, frames.buffers()[2].size
        for chunk in views.column("payload").chunks:
            data_buffers = chunk.buffers()[2:]
            assert data_buffers
            assert all(0 <= b.address - base < size for b in data_buffers)
    assert PARSED_VIEW_SCHEMA.remove(PARSED_VIEW_SCHEMA.get_field_index("payload")) == \
        PARSED_SCHEMA.remove(PARSED_SCHEMA.get_field_index("payload"))


def test_payload_views_to_pandas_and_empty_batch():
    frames = _payload_frames()
    views = parse_frames(frames, 5, payload_views=True).to_pandas()
    copied = parse_frames(frames, 5).to_pandas()
    assert views["payload"].tolist() == copied["payload"].tolist()
    assert isinstance(views["payload"].iloc[7], bytes) and len(views["payload"].iloc[8]) == 5000
    assert parse_frames([], [], payload_views=True).schema == PARSED_VIEW_SCHEMA


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        parse_frames([pub()], [5, 5])
    with pytest.raises(TypeError):
        parse_frames(pa.array([1, 2]), 5)


def test_payload_format_check_non_ascii_text():
    """Non-ASCII but well-formed text passes the Payload Format Indicator
    check (it takes the Arrow block check, then numpy); binary fails, also
    when its first bad byte is past the 64-byte window."""
    pfi = Properties(payload_format_indicator=1)
    text = pub(properties=pfi, payload=("21.5 \u00b0C " * 20).encode())
    late = pub(properties=pfi, payload=b"a" * 80 + b"\xc3\x28")
    binary = pub(properties=pfi, payload=bytes(range(256)))
    frames = [text, late, binary, text] * 700
    out = parse_frames(frames, 5).column("rule").to_pylist()
    assert out == [None, "LG-payload-format-invalid", "LG-payload-format-invalid", None] * 700


def test_payload_format_check_across_blocks():
    """Bad payloads spread over several validation blocks are all found."""
    good = pub(properties=Properties(payload_format_indicator=1), payload="ok é".encode())
    bad = pub(properties=Properties(payload_format_indicator=1), payload=b"\xff" * 20)
    frames = [bad if i % 397 == 5 or i in (0, 1, 2999) else good for i in range(3000)]
    out = parse_frames(frames, 5).column("rule").to_pylist()
    expected = ["LG-payload-format-invalid" if f is bad else None for f in frames]
    assert out == expected
