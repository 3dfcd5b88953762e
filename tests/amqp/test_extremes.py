"""Every extreme value of every MQTT 5 PUBLISH property, through the job and
forwarding to the real RabbitMQ: nothing may stall the stream.

A PUBLISH with a Message Expiry Interval of 2^32-1 s once stopped the job for
good (the header's ttl is a uint of milliseconds). Here each property takes
the minimum and maximum of its wire type and the values the mapping treats
specially (the ttl boundary, empty and long strings, repeated and reserved
User Property keys, the largest Subscription Identifier), in a fixed
catalogue (one PUBLISH per value) plus hypothesis-drawn combinations; the
job runs once over them (``trigger(availableNow=True)``) and must end
without error, with every message in ``messages``, nothing in
``quarantine``, and every message either delivered to the consumer or
counted expired.

Two layers: the pure one (frame -> parser -> forward row -> both encoders,
which must agree) runs hundreds of drawn combinations; the job with RabbitMQ
runs once over the catalogue and 15 drawn combinations, since each run is a
Spark job.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from proton import Message

from bridge.amqp.mapping import map_row
from bridge.amqp.wire import encode_row, wire_bytes
from bridge.mqtt import Properties, Publish, encode
from bridge.parse import parse_frames

U16 = 2**16 - 1
U32 = 2**32 - 1
VARINT_MAX = 268_435_455
T = "/topic/{routing_key}"

#: property -> the values each PUBLISH of the catalogue gets (one at a time).
EXTREMES: dict[str, list[Any]] = {
    "payload_format_indicator": [0, 1],
    # 0 expires at once; 4,294,967 s is the longest ttl, one more needs absolute-expiry-time
    "message_expiry_interval": [0, 1, 3600, 4_294_967, 4_294_968, U32],
    "content_type": ["", "a", "application/json; charset=utf-8", "ü" * 100, "c" * 1000],
    "response_topic": ["r", "r/" + "y" * 250, "ü/€/" + "z" * 500],
    "correlation_data": [b"", b"\x00", b"\xff" * 4096],
    "user_properties": [
        [("", "")],
        [("k", "v")] * 3,                                  # a repeated key
        [("lakegate-id", "mine")],                         # lakegate's own key
        [(f"k{i}", "v" * 40) for i in range(300)],         # many
        [("K" * 2000, "V" * 5000)],                        # long
        [("ü€", "日本")],
    ],
    "subscription_identifiers": [[1], [VARINT_MAX], [1, 2, VARINT_MAX]],  # only a server sends them (tap)
    "topic_alias": [1, U16],
    "packet_id": [1, U16],
    "qos": [0, 1, 2],
    "payload": [b"", b"\x00\xff" * 2048],
}
PROPERTY_NAMES = ("payload_format_indicator", "message_expiry_interval", "content_type", "response_topic",
                  "correlation_data", "user_properties", "subscription_identifiers", "topic_alias")


def catalogue() -> list[dict[str, Any]]:
    """One PUBLISH description per (field, extreme value)."""
    return [{name: v} for name, values in EXTREMES.items() for v in values]


@st.composite
def publish_specs(draw) -> dict[str, Any]:
    """A PUBLISH description combining extremes of several properties at once."""
    spec = {}
    for name in (*PROPERTY_NAMES, "packet_id", "qos", "payload"):
        if draw(st.booleans()):
            spec[name] = draw(st.sampled_from(EXTREMES[name]))
    return spec


def build(spec: dict[str, Any], topic: str) -> tuple[Publish, str]:
    """(the PUBLISH, its origin) for a description."""
    qos = spec.get("qos", 1)
    pfi = spec.get("payload_format_indicator")
    payload = spec.get("payload", b"\xff\x00binary")
    if pfi == 1:
        payload = "text ü".encode()  # a Payload Format Indicator of 1 says UTF-8 [LG-payload-format-invalid]
    props = {k: spec[k] for k in PROPERTY_NAMES if k in spec}
    origin = "tap" if props.get("subscription_identifiers") else "client"
    pub = Publish(qos=qos, topic=topic, packet_id=spec.get("packet_id", 1) if qos else None, payload=payload,
                  properties=Properties(**props))
    return pub, origin


def forward_row(parsed: dict[str, Any], offset: int, receive_time: dt.datetime) -> dict[str, Any]:
    """The FORWARD_DDL row ``bridge.job.batch.select_forward`` makes of a parsed PUBLISH."""
    names = ("topic", "packet_id", "qos", "retain", "dup", "payload", "payload_format_indicator",
             "message_expiry_interval", "response_topic", "correlation_data", "user_properties", "content_type")
    r = {n: parsed[n] for n in names}
    r.update(kind="publish", stream="mqtt-frames", partition=0, offset=offset, seq=offset, conn_id="c1",
             client_id="dev", receive_time=receive_time)
    return r


# ------------------------------------------------------------------ pure layer
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(publish_specs(), min_size=1, max_size=8), st.sampled_from(["seed", "enmasse"]))
def test_every_extreme_parses_valid_and_both_encoders_agree(specs, profile):
    now = time.time()
    received = dt.datetime.fromtimestamp(now - 1, dt.timezone.utc)
    pubs = [build(s, f"x/{i}") for i, s in enumerate(specs)]
    frames = [encode(p, 5) for p, _ in pubs]
    parsed = parse_frames(frames, 5, from_client=[o == "client" for _, o in pubs]).to_pylist()
    for i, ((pub, _), p) in enumerate(zip(pubs, parsed)):
        assert p["valid"], (p["rule"], p["error"])
        r = forward_row(p, i, received)
        ref, fast = map_row(r, profile, T, now), encode_row(r, profile, T, now)
        if ref.expired:
            assert fast.expired and pub.properties.message_expiry_interval in (0, 1)
            continue
        a, b = Message(), Message()
        a.decode(wire_bytes(ref, now))
        b.decode(wire_bytes(fast, now))
        for f in ("ttl", "expiry_time", "id", "address", "subject", "reply_to", "correlation_id",
                  "annotations", "properties", "durable"):
            assert getattr(a, f) == getattr(b, f), f
        assert bytes(a.body) == bytes(b.body) == pub.payload


def test_every_catalogue_entry_parses_valid():
    specs = catalogue()
    pubs = [build(s, f"x/{i}") for i, s in enumerate(specs)]
    parsed = parse_frames([encode(p, 5) for p, _ in pubs], 5, from_client=[o == "client" for _, o in pubs])
    assert parsed["valid"].to_pylist() == [True] * len(specs)


# ------------------------------------------------------------------ the job
def run_job_once(spark, data_dir: Path, rabbitmq: str) -> tuple[Any, list]:
    """Run the pipeline over everything captured, once; (config, batch stats)."""
    from bridge.config import load_config
    from bridge.job.pipeline import release, start_query

    cfg = load_config(None, [f"data_dir={data_dir}", f"amqp.url={rabbitmq}", "capture.partitions=2",
                             "amqp.max_retries=2", "amqp.retry_backoff_s=0.05", "amqp.disposition_timeout_s=20"],
                      env={})
    query = start_query(spark, cfg, once=True)
    try:
        finished = query.awaitTermination(240)
        assert finished, "the job did not finish within 240 s"
        assert query.exception() is None, str(query.exception())[:2000]
    finally:
        release(spark)  # the shared session keeps no listener of this test's checkpoint
    return cfg


def capture(data_dir: Path, specs: list[dict[str, Any]], prefix: str) -> list[tuple[str, dict, str, float]]:
    """Write the PUBLISHes into a capture log as the edge (or the tap) would;
    (topic, spec, origin, about when it was received)."""
    from bridge.capture import CaptureLog
    from bridge.config import load_config
    from tests.job.frames import headers

    cfg = load_config(None, [f"data_dir={data_dir}", "capture.partitions=2"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    out, acks = [], []
    for i, spec in enumerate(specs):
        topic = f"{prefix}/{i}"
        pub, origin = build(spec, topic)
        conn = f"c{i % 3}"
        acks.append(log.append(conn, conn.encode(), encode(pub, 5), headers(conn, 5, origin=origin)))
        out.append((topic, spec, origin, time.time()))
    for a in acks:
        a.wait(10)
    log.close()
    return out


SURELY_LIVE = 3600  # a Message Expiry Interval that cannot run out during the test


def check_job(spark, rabbitmq, consumer, specs):
    data_dir = Path(tempfile.mkdtemp(prefix="lg-extremes-"))
    try:
        sent = capture(data_dir, specs, consumer.topic("extremes"))
        received = {t: at for t, _, _, at in sent}
        cfg = run_job_once(spark, data_dir, rabbitmq)
        from bridge.tables.deltars import DeltaRsEngine

        engine = DeltaRsEngine(cfg.tables_dir)
        quarantine = engine.arrow("quarantine").to_pylist()
        assert [(q["rule"], q["error"]) for q in quarantine] == []
        assert engine.arrow("messages").num_rows == len(specs)
        for topic, spec, _, _ in sent:
            mei = spec.get("message_expiry_interval")
            if mei is not None and mei < SURELY_LIVE:
                continue  # may expire before it is sent (counted, not forwarded)
            [m] = consumer.wait(topic, 1, timeout=60)
            if mei == U32:  # far beyond what ttl holds: absolute-expiry-time carries it
                assert m.ttl == 0 and m.expiry_time == pytest.approx(received[topic] + U32, abs=2.0)
            elif mei is not None:  # the ttl holds what is left (RabbitMQ counts it down itself)
                assert 0 < m.ttl <= mei
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.slow
@settings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],  # no shrinking: each run is a job
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=st.lists(publish_specs(), min_size=15, max_size=15))
def test_every_extreme_of_every_publish_property_goes_through_the_job_and_forwarding(spark, rabbitmq, consumer, drawn):
    """The whole catalogue plus drawn combinations, in one job run (each run
    is a Spark job: the combinations get their many examples above)."""
    check_job(spark, rabbitmq, consumer, catalogue() + drawn)
