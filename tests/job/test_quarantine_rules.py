"""Frames the edge rejected, through the job: the quarantine row carries the
rule the client was disconnected or refused for, not the parser's reading of
the (truncated) recorded bytes, which goes to ``parser_rule``."""

from __future__ import annotations

import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.edge.session import Limits
from bridge.tables.deltars import DeltaRsEngine
from tests.edge.util import Harness, connect, publish
from tests.job.frames import run_once

pytestmark = pytest.mark.spark


def test_mqtt_3_2_2_15_mqtt_1_5_4_2_mqtt_3_1_4_2_edge_rejections_are_quarantined_under_the_edges_rule(
        spark, tmp_path):
    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=1", "amqp.url="], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    big = Harness(Limits(max_packet_bytes=2000), conn_id="big", log=log)
    big.feed(connect(5))
    big.feed(publish(5, payload=b"z" * 5000)[:3000])  # over the Maximum Packet Size: recorded cut to 1024 bytes
    refused = Harness(conn_id="refused", auto_accept=False, log=log)
    refused.feed(connect(5, username="u", password=b"nope"))
    refused.perform(refused.session.refuse("MQTT-3.1.4-2", 0x86, "bad user name or password"))
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + b"\x00\x03a\x00b"  # a Client Identifier with U+0000
    bad = Harness(conn_id="bad", log=log)
    bad.feed(bytes([0x10, len(body)]) + body)  # recorded without its payload: the parser sees it cut short
    assert big.closed and refused.closed and bad.closed
    log.close()

    run_once(spark, cfg)

    q = sorted(DeltaRsEngine(cfg.tables_dir).arrow("quarantine").to_pylist(), key=lambda r: r["conn_id"])
    assert [(r["conn_id"], r["packet_type"], r["rule"], r["error_code"], r["parser_rule"]) for r in q] == [
        ("bad", 1, "MQTT-1.5.4-2", 0x81, "LG-truncated"),     # CONNECT kept without its payload
        ("big", 3, "MQTT-3.2.2-15", 0x95, "LG-truncated"),    # PUBLISH kept to 1024 bytes
        ("refused", 1, "MQTT-3.1.4-2", 0x86, None)]           # well-formed, refused: the parser finds nothing
    assert q[1]["error"].startswith("[MQTT-3.2.2-15] ") and q[1]["parser_error"].startswith("[LG-truncated] ")
    assert b"nope" not in q[2]["frame"]


def test_a_subscribers_run_of_pubacks_in_one_record_is_skipped_not_quarantined(spark, tmp_path):
    """The edge captures a run of a subscriber's 4-byte PUBACKs as one record
    (``ack_refs``): valid acknowledgements with no row in any table. The job
    skips it; without that the parser would quarantine the run as trailing
    bytes after the first frame."""
    from bridge.edge.message import Message
    from bridge.edge.router import Router
    from bridge.mqtt import Subscribe, Subscription, encode

    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=1", "amqp.url="], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    router = Router()
    sub = Harness(conn_id="sub", log=log, router=router)
    sub.feed(connect(4, client_id="sub"))
    sub.feed(encode(Subscribe(1, [Subscription("a/#", 1)]), 4))
    pub = Harness(conn_id="pub", log=log, router=router)
    pub.feed(connect(4, client_id="pub"))
    for i in (1, 2, 3):
        frame = publish(4, "a/b", b"m%d" % i, 1, packet_id=i)
        pub.feed(frame)
        router.route(Message.from_frame(frame, 4, origin="pub", ref=(0, len(pub.records)),
                                        ready=True))
    sub.take()
    sub.perform(sub.session.deliver(0.0))
    assert len(sub.take()) > 0
    sub.feed(b"\x40\x02\x00\x01\x40\x02\x00\x02\x40\x02\x00\x03")
    assert dict(sub.records[-1][1])["ack_refs"].count(b" ") == 2
    log.close()

    run_once(spark, cfg)
    engine = DeltaRsEngine(cfg.tables_dir)
    assert engine.arrow("quarantine").num_rows == 0
    assert sorted(r["payload"] for r in engine.arrow("messages").to_pylist()) == [b"m1", b"m2", b"m3"]
