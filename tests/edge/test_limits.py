"""Incomplete frames (issue 21 item 9): a frame that has started must finish
within edge.frame_timeout_s, and the bytes of incomplete frames across all
connections stay within edge.max_buffered_bytes. Real sockets."""

from __future__ import annotations

import logging

import pytest

from tests.edge.conftest import RawClient, wait_for
from tests.edge.util import publish

CONNACK_OK = b"\x20\x02\x00\x00"


def _partial(payload_bytes: int, sent: int, packet_id: int = 1, level: int = 4) -> tuple[bytes, bytes]:
    """A QoS 1 PUBLISH of ``payload_bytes`` cut after ``sent`` bytes: (head, rest)."""
    frame = publish(level, topic="big", payload=b"x" * payload_bytes, qos=1, packet_id=packet_id)
    return frame[:sent], frame[sent:]


def _closed_by_edge(c: RawClient) -> bool:
    try:
        return c.closed()
    except TimeoutError:
        return False


@pytest.mark.parametrize("level", [4, 5])
def test_lg_edge_frame_timeout_closes_a_stalled_frame(run_edge, caplog, level):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.frame_timeout_s=0.5")
    idle = RawClient(e.port, timeout=10)
    assert idle.connect(4, client_id="idle", keepalive=0) == CONNACK_OK
    stalled = RawClient(e.port, timeout=10)
    ack = stalled.connect(level, client_id="stalled", keepalive=0)
    assert ack[0] == 0x20 and ack[3] == 0x00, ack.hex()  # CONNACK, Success / Accepted
    head, _rest = _partial(900_000, 1000, level=level)
    stalled.send(head)
    # closed without a byte: not even MQTT 5's DISCONNECT follows a partial frame
    assert _closed_by_edge(stalled), "the stalled frame's connection stayed open (or got a packet)"
    wait_for(lambda: "close " in caplog.text and "client=stalled" in caplog.text, 10,
             "the close line")
    close = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("close ") and "client=stalled" in r.getMessage()]
    assert "[LG-edge-frame-timeout]" in close[0] and "bytes buffered" in close[0]
    # A connection with no frame pending is not affected, and can still publish.
    idle.publish(4, topic="t", payload=b"p", qos=1, packet_id=7)
    assert idle.packet() == b"\x40\x02\x00\x07"
    assert e.server.buffered_total == 0


def test_lg_edge_buffer_budget_closes_the_oldest_incomplete_frame(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.max_buffered_bytes=300000")
    old, new = RawClient(e.port, timeout=10), RawClient(e.port, timeout=10)
    assert old.connect(4, client_id="old", keepalive=0) == CONNACK_OK
    assert new.connect(4, client_id="new", keepalive=0) == CONNACK_OK
    head, _rest = _partial(200_000, 180_000)
    old.send(head)
    wait_for(lambda: sum(c.session.buffered for c in list(e.server.conns)) >= 180_000, 10,
             "the first incomplete frame to be buffered")
    head2, rest2 = _partial(200_000, 180_000, packet_id=2)
    new.send(head2)
    assert _closed_by_edge(old), "the oldest incomplete frame's connection stayed open"
    # The newer one keeps its connection and completes its frame.
    new.send(rest2)
    assert new.packet() == b"\x40\x02\x00\x02"
    wait_for(lambda: "client=old" in caplog.text and "close " in caplog.text, 10, "close line")
    assert "[LG-edge-buffer-budget]" in caplog.text
    wait_for(lambda: e.server.buffered_total == 0, 10, "the budget to be released")
