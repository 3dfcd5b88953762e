"""The pandas UDF in a Spark session: schema from schemas/, same rows as the
plain function, tap frames parsed as server-to-client."""

from __future__ import annotations

import pickle

import pytest

from bridge.mqtt import Connect, Properties, PubRel, Publish, Will, encode
from bridge.parse import parse_frames
from bridge.parse.udf import frames_udf, parse_frames_pandas
from schemas.spark import to_spark
from schemas.frames import PARSED_FRAME_DDL

ROWS = [
    (encode(Publish(qos=1, topic="a/b", packet_id=7, payload=b"hi",
                    properties=Properties(user_properties=[("k", "v"), ("k", "v")],
                                          content_type="text/plain")), 5), 5, None, "client"),
    (encode(Publish(topic="", payload=b"x", properties=Properties(topic_alias=3)), 5), 5,
     "dev/3/state", "client"),
    (b"\x36\x00", 5, None, "client"),
    (encode(Publish(topic="t", payload=b"x", properties=Properties(subscription_identifiers=[4])), 5),
     5, None, "tap"),
    (encode(Publish(topic="t", payload=b"x", properties=Properties(subscription_identifiers=[4])), 5),
     5, None, "client"),
    (encode(PubRel(packet_id=9), 4), 4, None, "client"),
    (encode(Connect.for_level(5, client_id="c1", will=Will(
        topic="w", payload=b"bye", properties=Properties(will_delay_interval=3))), 5),
     None, None, "client"),
    (encode(Publish(topic="old", payload=b"x"), 3), 3, None, "will"),
]


def test_udf_function_is_picklable_by_reference():
    assert pickle.loads(pickle.dumps(parse_frames_pandas)) is parse_frames_pandas


@pytest.mark.spark
def test_udf_in_spark_matches_the_function(spark):
    df = spark.createDataFrame(ROWS, "frame BINARY, protocol_level INT, alias_topic STRING, origin STRING")
    udf = frames_udf()
    out = df.select(udf("frame", "protocol_level", "alias_topic", "origin").alias("p"))
    assert out.schema["p"].dataType == to_spark(PARSED_FRAME_DDL)
    got = [r["p"].asDict(recursive=True) for r in out.collect()]
    want = parse_frames([r[0] for r in ROWS], [r[1] for r in ROWS], [r[2] for r in ROWS],
                        from_client=[r[3] != "tap" for r in ROWS]).to_pylist()
    assert got == want
    assert [g["valid"] for g in got] == [True, True, False, True, False, True, True, True]
    assert got[1]["topic"] == "dev/3/state"
    assert got[4]["rule"] == "MQTT-3.3.4-6"
    assert got[0]["user_properties"] == [{"key": "k", "value": "v"}] * 2
    assert got[6]["client_id"] == "c1" and got[6]["will_properties"]["will_delay_interval"] == 3
