"""``edge.ack_after = "forward"``: PUBACK/PUBREC only once the AMQP sink has
forwarded the record, PUBCOMP once it forwarded the PUBREL. The sink is
stood in for by writing the forwarded-offset marks directly
(``bridge.amqp.forwarded.ForwardedOffsets.record``, the sink's own call)."""

from __future__ import annotations

import socket

import pytest

from bridge.amqp.forwarded import ForwardedOffsets
from tests.edge.conftest import RawClient, wait_records
from tests.edge.util import publish

#: every test that starts an edge runs on both capture logs (tests/edge/conftest.py)
CAPTURE_BACKENDS = ("local", "kafka")

SILENCE_S = 0.3


def _silent(c: RawClient) -> bool:
    """True when nothing arrives within SILENCE_S (a bounded negative check)."""
    c.sock.settimeout(SILENCE_S)
    try:
        data = c.sock.recv(64)
    except socket.timeout:
        return True
    finally:
        c.sock.settimeout(5)
    c.buf += data
    return False


@pytest.fixture
def fwd_edge(run_edge):
    return run_edge("edge.ack_after=forward")


def _marks(edge) -> ForwardedOffsets:
    return ForwardedOffsets(edge.config.data_path, edge.config.capture_stream)  # on Kafka: the topic


def test_puback_waits_for_the_forwarded_mark(fwd_edge):
    c = RawClient(fwd_edge.port)
    assert c.connect(4, client_id="f1") == b"\x20\x02\x00\x00"
    c.publish(4, topic="t", qos=1, packet_id=1).publish(4, topic="t", qos=1, packet_id=2)
    recs = wait_records(fwd_edge.config,
                        lambda r: r.key == b"f1" and r.value[0] == 0x32, 2)
    assert _silent(c)  # durable, but not forwarded yet
    _marks(fwd_edge).record(recs[0].partition, recs[0].offset)
    assert c.packet() == b"\x40\x02\x00\x01"
    assert _silent(c)  # the second one is not forwarded yet
    _marks(fwd_edge).record(recs[1].partition, recs[1].offset)
    assert c.packet() == b"\x40\x02\x00\x02"


def test_qos2_pubrec_and_pubcomp_wait_for_publish_and_pubrel(fwd_edge):
    c = RawClient(fwd_edge.port)
    c.connect(5, client_id="f2")
    c.publish(5, topic="q", qos=2, packet_id=9)
    (pub,) = wait_records(fwd_edge.config,
                          lambda r: r.key == b"f2" and r.value[0] == 0x34, 1)
    assert _silent(c)
    marks = _marks(fwd_edge)
    marks.record(pub.partition, pub.offset)
    assert c.packet() == b"\x50\x02\x00\x09"
    c.send(b"\x62\x02\x00\x09")
    (rel,) = wait_records(fwd_edge.config, lambda r: r.key == b"f2" and r.value[0] == 0x62,
                          1)
    assert _silent(c)
    marks.record(rel.partition, rel.offset)
    assert c.packet() == b"\x70\x02\x00\x09"


def test_qos0_and_pingresp_do_not_wait(fwd_edge):
    c = RawClient(fwd_edge.port)
    c.connect(4, client_id="f3")
    c.send(publish(4, qos=0) + b"\xc0\x00")
    assert c.packet() == b"\xd0\x00"
