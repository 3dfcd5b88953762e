"""The load generator of ``bench subscribe`` without a socket: its hand-written
hot paths agree with the codec, and a subscriber counts, acknowledges and
timestamps what it is fed, in one chunk or byte by byte."""

from __future__ import annotations

import struct

import pytest

from bridge.bench.subload import FanOut, _Subscriber, parse_publish, publish_template
from bridge.mqtt import PubAck, Publish, decode_packet, encode


class _Transport:
    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data) -> None:
        self.written += data


def _run(qos: int, **kw) -> FanOut:
    return FanOut("127.0.0.1", 1, label="t", subscribers=1, qos=qos, seconds=1, **kw)


def _subscriber(run: FanOut) -> tuple[_Subscriber, _Transport]:
    sub = _Subscriber(run, 0)
    sub.transport = _Transport()
    sub.streaming = True
    return sub, sub.transport


def _frame(run: FanOut, seq: int, stamp: int = 1000, *, topic: str | None = None,
           dup: bool = False, retain: bool = False) -> bytes:
    payload = struct.pack(">QQ", seq, stamp) + b"p" * (run.payload_bytes - 16)
    return encode(Publish(qos=run.qos, dup=dup, retain=retain, topic=topic or run.topic,
                          packet_id=seq % 65535 + 1 if run.qos else None, payload=payload), 4)


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("payload_bytes", [16, 64, 300])
def test_template_and_hot_path_parse_agree_with_codec(qos, payload_bytes):
    frame, pid_at, payload_at = publish_template("bench/x/data", qos, payload_bytes)
    p, used = decode_packet(frame, 4, from_client=False)
    assert used == len(frame) and p.topic == "bench/x/data" and p.qos == qos
    blob = bytearray(frame)
    if qos:
        blob[pid_at:pid_at + 2] = (513).to_bytes(2, "big")
    struct.pack_into(">QQ", blob, payload_at, 77, 123456789)
    p, _ = decode_packet(bytes(blob), 4, from_client=False)
    header_len = 2 if frame[1] < 0x80 else 3  # Remaining Length < 16384 here
    got = parse_publish(bytes(blob), 0, len(blob), header_len)
    assert got == (qos, (513).to_bytes(2, "big") if qos else None, 77, 123456789)
    assert p.payload[:16] == struct.pack(">QQ", 77, 123456789)
    if qos:
        assert p.packet_id == 513 and encode(PubAck(packet_id=513), 4) == b"\x40\x02" + got[1]


def test_template_refuses_a_payload_without_room_for_the_stamp():
    with pytest.raises(ValueError, match="at least 16"):
        publish_template("a", 0, 15)


@pytest.mark.parametrize("chunking", ["one chunk", "byte by byte", "uneven"])
def test_subscriber_counts_acks_and_times_every_message(chunking):
    run = _run(1, record_latency=True, rate=1000.0, warmup_s=0.002)  # warm-up: seqs 0 and 1
    sub, transport = _subscriber(run)
    stream = b"".join(_frame(run, seq, stamp=seq) for seq in range(40))
    if chunking == "one chunk":
        chunks = [stream]
    elif chunking == "byte by byte":
        chunks = [stream[i:i + 1] for i in range(len(stream))]
    else:
        chunks = [stream[:7], stream[7:700], stream[700:1500], stream[1500:]]
    for c in chunks:
        sub.data_received(c)
    assert run.counts == [40] and run.total == 40 and sub.duplicates == 0 and sub.gaps == 0
    assert run.error is None
    assert bytes(transport.written) == b"".join(encode(PubAck(packet_id=s % 65535 + 1), 4)
                                                for s in range(40))
    assert len(run.latencies) == 38  # two warm-up messages left out
    assert all(lat > 0 for lat in run.latencies)


def test_subscriber_counts_a_duplicate_once_and_a_gap():
    run = _run(0)
    sub, transport = _subscriber(run)
    seqs = [*range(10), 5, *range(10, 20), 25]  # 5 again (duplicate), 20..24 missing
    sub.data_received(b"".join(_frame(run, s) for s in seqs))
    assert run.total == 21 and sub.duplicates == 1 and sub.gaps == 5
    assert transport.written == b""  # QoS 0: nothing to acknowledge


def test_subscriber_reports_a_publish_that_does_not_match_the_subscription():
    run = _run(0)
    sub, _ = _subscriber(run)
    sub.data_received(_frame(run, 0, topic="other/topic"))
    assert run.error is not None and "other/topic" in run.error
    assert run.total == 0


@pytest.mark.parametrize("qos", [0, 1])
def test_subscriber_reports_a_publish_with_retain_set_in_a_bulk_chunk(qos):
    """MQTT-3.3.1-9: RETAIN 0 on delivery to a new-message subscription. The
    fast path compares every frame's fixed header, so one stray flag in a
    chunk of in-sequence frames is caught."""
    run = _run(qos)
    sub, _ = _subscriber(run)
    sub.data_received(_frame(run, 0))
    sub.data_received(b"".join(_frame(run, s, retain=s == 5) for s in range(1, 20)))
    assert run.error is not None and "retain=True" in run.error


def test_subscriber_bulk_path_falls_back_on_a_resent_frame():
    """A DUP=1 frame differs from the template in byte 1: the chunk is read
    frame by frame and the re-sent message is a duplicate, not a delivery."""
    run = _run(1)
    sub, transport = _subscriber(run)
    sub.data_received(b"".join(_frame(run, s) for s in range(10)))
    sub.data_received(b"".join([_frame(run, 9, dup=True), *(_frame(run, s) for s in range(10, 20))]))
    assert run.total == 20 and sub.duplicates == 1
    assert len(transport.written) == 4 * 21  # the duplicate is acknowledged too


def test_publisher_windows_bound_what_is_written():
    run = _run(1, publish_window=30, window=50)

    class _Pub:
        transport = _Transport()

    run.pub = _Pub()
    run.pump()
    frames = len(run.pub.transport.written) // run.size
    assert frames == run.sent == 30  # the PUBACK window
    run.acked(30)
    assert run.sent == 50  # now the slowest subscriber's window
    run.delivered(0, 20)
    assert run.sent == 60 and len(run.pub.transport.written) == 60 * run.size
