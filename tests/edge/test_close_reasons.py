"""Every close the edge decides on carries its real reason and rule id
(issue 38, item 7).

A flood of silent connections used to log 20,000 lines of
``reason=connection lost``: the connect timeout closed without setting the
session's ``close_reason``, and the server's close line fell back to
"connection lost". The sans-IO checks drive each ending of a
:class:`~bridge.edge.session.Session` and require its ``close_reason`` to be
the reason of its ``Close`` action, with the rule's id; the socket checks
read the server's close line. "connection lost" is left to what the client
did (it hung up without DISCONNECT).
"""

from __future__ import annotations

import logging
import socket

import pytest

from bridge.edge import rules as edge_rules
from bridge.edge.session import Limits
from bridge.mqtt.rules import SECOND_CONNECT
from tests.edge.conftest import RawClient, wait_for
from tests.edge.util import Harness, connect


# ------------------------------------------------------------------ sans-IO
def _timeout_silent():
    h = Harness(Limits(connect_timeout_s=2.0))
    h.perform(h.session.tick(2.0))
    return h


def _timeout_partial():
    h = Harness(Limits(connect_timeout_s=2.0))
    h.feed(b"\x10\x10", now=0.5)
    h.perform(h.session.tick(2.0))
    return h


def _timeout_while_checked():  # the CONNECT is in, its password check is not done
    h = Harness(Limits(connect_timeout_s=2.0), auto_accept=False)
    h.feed(connect(5, username="u", password=b"p"), now=0.1)
    assert h.requests and h.closed is None
    h.perform(h.session.tick(2.0))
    return h


def _shutdown(level):
    def run():
        h = Harness()
        if level is not None:
            h.feed(connect(level))
        h.perform(h.session.shutdown())
        return h
    return run


def _take_over(accepted):
    def run():
        h = Harness(auto_accept=accepted)
        h.feed(connect(5))
        h.perform(h.session.take_over())
        return h
    return run


def _busy():
    h = Harness(busy=True)
    h.feed(connect(5))
    return h


def _refused(rule, code):
    def run():
        h = Harness(auto_accept=False)
        h.feed(connect(4, username="u", password=b"p"))
        h.perform(h.session.refuse(rule, code, "refused for the test"))
        return h
    return run


def _keep_alive():
    h = Harness()
    h.feed(connect(5, keepalive=10), now=0.0)
    h.perform(h.session.tick(15.0))
    return h


def _second_connect():
    h = Harness()
    h.feed(connect(5))
    h.feed(connect(5))
    return h


ENDINGS = {
    "connect-timeout-silent": (_timeout_silent, edge_rules.CONNECT_TIMEOUT),
    "connect-timeout-partial": (_timeout_partial, edge_rules.CONNECT_TIMEOUT),
    "connect-timeout-checking": (_timeout_while_checked, edge_rules.CONNECT_TIMEOUT),
    "shutdown-before-connect": (_shutdown(None), edge_rules.SERVER_SHUTDOWN),
    "shutdown-3.1.1": (_shutdown(4), edge_rules.SERVER_SHUTDOWN),
    "shutdown-5": (_shutdown(5), edge_rules.SERVER_SHUTDOWN),
    "take-over-connected": (_take_over(True), edge_rules.SESSION_TAKEN_OVER),
    "take-over-connecting": (_take_over(False), edge_rules.SESSION_TAKEN_OVER),
    "busy": (_busy, edge_rules.EDGE_BUSY),
    "auth-failed": (_refused(edge_rules.AUTH_FAILED, 0x86), edge_rules.AUTH_FAILED),
    "auth-busy": (_refused(edge_rules.AUTH_BUSY, 0x89), edge_rules.AUTH_BUSY),
    "keep-alive": (_keep_alive, edge_rules.KEEP_ALIVE_TIMEOUT),
    "protocol-error": (_second_connect, SECOND_CONNECT),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_session_ending_sets_close_reason_with_its_rule_id(ending):
    make, rule = ENDINGS[ending]
    h = make()
    assert h.closed is not None, "the session did not close"
    assert h.session.close_reason == h.closed
    assert f"[{rule}]" in h.closed, h.closed
    # the end of the connection afterwards keeps the reason
    h.session.connection_lost(100.0)
    assert h.session.close_reason == h.closed


def test_lg_edge_connect_timeout_reason_names_the_setting_and_the_bytes():
    h = _timeout_partial()
    assert h.closed == ("connect timeout [LG-edge-connect-timeout] (no CONNECT accepted within "
                        "edge.connect_timeout_s = 2 s, 2 bytes buffered)")
    assert h.sent == b"" and h.records == []  # no CONNACK: no CONNECT was accepted


def test_new_rules_are_in_the_edge_table():
    for rule in (edge_rules.CONNECT_TIMEOUT, edge_rules.SERVER_SHUTDOWN,
                 edge_rules.CAPTURE_FAILED, edge_rules.ANONYMOUS_BEYOND_LOOPBACK):
        assert rule in edge_rules.EDGE_RULES
    assert "edge.connect_timeout_s" in edge_rules.EDGE_RULES[edge_rules.CONNECT_TIMEOUT].text


# ------------------------------------------------------------------ the close line
def _close_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bridge.edge" and r.getMessage().startswith("close ")]


def _close_line(caplog, conn_count: int = 1) -> list[str]:
    return wait_for(lambda: (lambda ls: ls if len(ls) >= conn_count else None)(_close_lines(caplog)),
                    10.0, f"{conn_count} close lines")


def test_lg_edge_connect_timeout_is_the_close_line_reason(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.connect_timeout_s=0.3")
    c = RawClient(e.port)
    try:
        assert c.closed()  # the edge closes it: nothing was sent
    finally:
        c.close()
    [line] = _close_line(caplog)
    assert "reason=connect timeout [LG-edge-connect-timeout] (no CONNECT accepted within " \
           "edge.connect_timeout_s = 0.3 s, 0 bytes buffered)" in line, line
    assert "connection lost" not in line


def test_lg_edge_frame_timeout_and_busy_are_close_line_reasons(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.frame_timeout_s=0.4", "edge.max_connections=1")
    first = RawClient(e.port)
    try:
        first.send(b"\x10\x20\x00")  # a CONNECT that never completes
        busy = RawClient(e.port)
        assert busy.connect(5, client_id="late")[3] == 0x89
        busy.close()
        assert first.closed()
    finally:
        first.close()
    lines = _close_line(caplog, 2)
    assert any("client=late" in x and "reason=[LG-edge-busy]" in x for x in lines), lines
    assert any("reason=[LG-edge-frame-timeout]" in x for x in lines), lines


def test_lg_edge_shutdown_is_the_close_line_reason_before_and_after_connect(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge()
    silent = socket.create_connection(("127.0.0.1", e.port), timeout=5)
    c = RawClient(e.port)
    try:
        assert c.connect(5, client_id="up")[3] == 0
        wait_for(lambda: len(e.server.conns) == 2, 5.0, "both connections")
        e.stop()
    finally:
        silent.close()
        c.close()
    lines = _close_line(caplog, 2)
    assert len(lines) == 2 and all("reason=server shutting down [LG-edge-shutdown]" in x
                                   for x in lines), lines


def test_mqtt_3_1_4_3_take_over_is_the_close_line_reason(run_edge, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge()
    old, new = RawClient(e.port), RawClient(e.port)
    try:
        assert old.connect(5, client_id="same")[3] == 0
        assert new.connect(5, client_id="same")[3] == 0
        assert old.packet() == b"\xe0\x01\x8e"
    finally:
        old.close()
        new.close()
    lines = _close_line(caplog, 2)  # the old connection's, and the new one's (it hung up)
    assert sum("reason=session taken over [MQTT-3.1.4-3]" in x for x in lines) == 1, lines


def test_lg_edge_capture_failed_is_the_close_line_reason(run_edge, caplog):
    # the capture log stops taking appends under a connected client (closed here,
    # as a failed disk would): its next PUBLISH cannot be made durable, the edge
    # stops and aborts the connection
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge()
    c = RawClient(e.port)
    try:
        assert c.connect(5, client_id="pub")[3] == 0
        e.server.log.close()
        c.publish(5, topic="t", payload=b"x", qos=1, packet_id=1)
        assert c.packet() == b""  # aborted, no PUBACK
    finally:
        c.close()
    [line] = _close_line(caplog)
    assert "client=pub" in line and "reason=capture log failed [LG-edge-capture-failed]" in line, line


def test_lg_edge_shutdown_keeps_a_close_reason_already_decided():
    # a resource limit (or a failed capture log) decided the close first; the
    # shutdown that comes before the connection is gone does not rename it
    h = Harness()
    h.feed(connect(5))
    h.take()
    h.session.close_reason = f"[{edge_rules.FRAME_TIMEOUT}] for the test"
    h.perform(h.session.shutdown())
    assert h.closed == h.session.close_reason == f"[{edge_rules.FRAME_TIMEOUT}] for the test"
