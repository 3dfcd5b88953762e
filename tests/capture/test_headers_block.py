"""capture.record.Headers: encoded once, extended cheaply, always the same
bytes as encoding the plain list."""

from __future__ import annotations

import pytest

from bridge.capture.record import Headers, encode_headers

BASE = [("conn_id", b"c1"), ("proto", b"4"), ("origin", b"client")]


@pytest.mark.parametrize("extra", [[("ack_ref", b"0:12")], [("granted", b"0102")],
                                   [("dup", b"1"), ("alias_topic", b"a/b")], []])
def test_headers_encode_as_the_plain_list(extra):
    h = Headers(BASE)
    assert encode_headers(h) == encode_headers(list(BASE))
    more = h.plus(extra)
    assert list(more) == BASE + extra
    assert encode_headers(more) == encode_headers(BASE + extra)


def test_unknown_keys_are_refused_on_the_fast_path_too():
    with pytest.raises(ValueError, match="unknown capture header key 'nope'"):
        encode_headers(Headers(BASE).plus([("nope", b"x")]))


def test_append_many_is_append_one_by_one(tmp_path):
    from bridge.capture import CaptureLog, LogReader

    with CaptureLog.open(tmp_path / "a", partitions=2) as log:
        acks = log.append_many("conn-1", b"dev", [(b"\x40\x02\x00\x01", Headers(BASE)),
                                                  (b"\x40\x02\x00\x02", BASE + [("ack_ref", b"0:3")])])
        one = log.append("conn-1", b"dev", b"\x40\x02\x00\x03", BASE)
        log.flush()
    assert [a.offset for a in acks + [one]] == [0, 1, 2] and len({a.partition for a in acks}) == 1
    assert [a.seq for a in acks + [one]] == [0, 1, 2]
    reader = LogReader(tmp_path / "a")
    recs = list(reader.records(one.partition, 0, 3))
    assert [r.value for r in recs] == [b"\x40\x02\x00\x01", b"\x40\x02\x00\x02", b"\x40\x02\x00\x03"]
    assert dict(recs[1].stored_headers)["ack_ref"] == b"0:3"


@pytest.mark.parametrize("extra", [[("ack_ref", b"0:12")], [("dup", b"1"), ("alias_topic", b"a/b")], []])
def test_kafka_headers_are_the_pairs_checked_and_sized_once(extra):
    """The capture log on Kafka sends a connection's Headers as Kafka record
    headers: the same pairs (values bytes), sized as kafka_headers_size says
    for the plain list, through plus() too."""
    from bridge.capture.record import kafka_headers_size

    h = Headers(BASE).plus(extra)
    pairs, size = h.kafka()
    assert pairs == BASE + extra and all(type(v) is bytes for _k, v in pairs)
    assert size == kafka_headers_size(BASE + extra) == sum(10 + len(k) + len(v) for k, v in BASE + extra)
    assert h.kafka() is h.kafka()  # computed once


def test_kafka_headers_refuse_unknown_keys_and_seq():
    with pytest.raises(ValueError, match="unknown capture header key 'nope'"):
        Headers(BASE).plus([("nope", b"x")]).kafka()
    with pytest.raises(ValueError, match="'seq' is assigned by the capture log"):
        Headers([("seq", b"1")]).kafka()
