"""The two engines side by side: the same batches, through the job's own
table step (``bridge.tables.writer.write_tables``), into two table
directories, one per engine, must leave the same tables at every version;
and each engine reads, appends to and merges the other's tables, refusing a
batch the other committed.

The batches hold real MQTT frames (3.1.1 and 5, MQTT 5 properties), a
malformed one and one the edge refused, retained publishes that set,
replace and clear, RETAIN=0 over a retained message, a QoS 2 re-send the
edge marked, late records older than what the table holds, an empty batch,
a replayed batch, and expiries.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from bridge.mqtt import Properties, Publish, encode
from bridge.tables.coverage import coverage_metadata, covered_offsets
from bridge.tables.writer import write_tables
from tests.tables.rows import T0, frame_rows, open_engine, sorted_rows

pytestmark = pytest.mark.spark

APP = "query-d"
TABLES = ("messages", "quarantine", "retained")
FULL = Properties(payload_format_indicator=1, message_expiry_interval=3600, content_type="text/plain",
                  response_topic="reply/1", correlation_data=b"\x00\x01", user_properties=[("k", "1"), ("k", "2")])


def pub(topic, payload, *, seq, level=5, qos=1, retain=True, props=None, at_s=0, marked_duplicate=False,
        partition=0) -> dict:
    """A capture record of a PUBLISH sent at protocol ``level`` (4: MQTT 3.1.1)."""
    at = T0 + dt.timedelta(seconds=at_s)
    frame = encode(Publish(qos=qos, retain=retain, topic=topic, packet_id=seq if qos else None, payload=payload,
                           properties=props or Properties()), level)
    return {"frame": frame, "protocol_level": level, "seq": seq, "offset": seq, "partition": partition,
            "receive_time": at, "receive_date": at.date(), "duplicate": marked_duplicate}


def malformed(seq) -> dict:
    """[MQTT-3.3.1-4] both QoS bits set."""
    return {"frame": bytes([0x36, 0x06, 0, 1]) + b"x" + bytes([0, 1, 0]), "seq": seq, "offset": seq}


def refused(seq) -> dict:
    """A PUBLISH over the edge's Maximum Packet Size, recorded cut short."""
    full = encode(Publish(qos=1, topic="big", packet_id=1, payload=b"x" * 3000, properties=Properties()), 5)
    return {"frame": full[:1024], "seq": seq, "offset": seq, "edge_rule": "MQTT-3.2.2-15", "edge_code": 0x95,
            "edge_error": "[MQTT-3.2.2-15] PUBLISH of 3008 bytes exceeds the Maximum Packet Size 1024"}


BATCHES = {
    # MQTT 5 with every property, MQTT 3.1.1 without; RETAIN=0 is never stored
    # [MQTT-3.3.1-8]; one to expire; a malformed frame and one the edge refused
    0: [pub("site/1/a", b"a0", seq=10, props=FULL), pub("site/1/b", b"b0", seq=20, level=4, qos=0),
        pub("site/1/c", b"live", seq=30, retain=False),
        pub("site/2/d", b"d0", seq=40, props=Properties(message_expiry_interval=7200)),
        pub("site/2/g", b"g0", seq=45, props=Properties(message_expiry_interval=10)),
        malformed(50), refused(60)],
    # replaced by MQTT 3.1.1 (an older record of it in the same batch loses)
    # [MQTT-3.3.1-5]; cleared [MQTT-3.3.1-6/7]; RETAIN=0 over a retained message;
    # a QoS 2 re-send the edge marked as duplicate
    1: [pub("site/1/a", b"a1", seq=80, level=4), pub("site/1/a", b"a-older", seq=70),
        pub("site/1/b", b"", seq=90), pub("site/2/d", b"live", seq=100, retain=False),
        pub("site/3/e", b"e0", seq=110, qos=2, props=Properties(user_properties=[("u", "v")])),
        pub("site/3/e", b"e0", seq=120, qos=2, marked_duplicate=True)],
    2: [],
    # late records from another partition, older than the tombstone of b and
    # than a's row: nothing changes for them; a new topic with an expiry
    3: [pub("site/1/b", b"zombie", seq=85, partition=1), pub("site/1/a", b"late", seq=75, partition=1, level=4),
        pub("site/4/f", b"f0", seq=130, at_s=30, props=Properties(message_expiry_interval=3600, content_type="x"))],
    # after the tables change hands (test_each_engine_...): MQTT 5 and 3.1.1 again
    4: [pub("site/1/a", b"a4", seq=140, at_s=7000, props=FULL), pub("site/4/f", b"", seq=150, level=4), malformed(160)],
}


def coverage(batch: int) -> str:
    return coverage_metadata("mqtt-frames", {0: 10 * batch + 61, 1: 86 if batch >= 3 else 0}, APP, batch)


def step(engine, batch: int):
    return write_tables(engine, frame_rows(BATCHES[batch]), APP, batch, coverage(batch))


def us(seconds: float) -> int:
    return int((T0 + dt.timedelta(seconds=seconds)).timestamp() * 1e6)


@pytest.fixture(scope="module")
def fed(request, tmp_path_factory):
    """Both engines fed the same sequence; what each step answered, per engine."""
    root = tmp_path_factory.mktemp("differential")
    engines = {kind: open_engine(kind, root / kind, request) for kind in ("delta-rs", "delta-spark")}
    answers = {}
    for kind, e in engines.items():
        e.ensure()
        answers[kind] = [
            step(e, 0),
            step(e, 0),                # a replay: refused by every table
            step(e, 1),
            step(e, 2),                # empty: still one commit per table
            e.expire_retained(us(60)),   # site/2/g (10 s)
            e.expire_retained(us(60)),   # nothing left to expire: no commit
            step(e, 3),
        ]
    return engines, answers


def assert_same_at_every_version(a, b) -> None:
    """``a`` and ``b`` (engines over two directories) hold the same rows, all
    columns, at every version of every table, and the same transactions and
    coverage."""
    for t in TABLES:
        assert a.versions(t) == b.versions(t), t
        for v in range(a.versions(t).oldest, a.versions(t).newest + 1):
            assert sorted_rows(a.arrow(t, as_of=v)) == sorted_rows(b.arrow(t, as_of=v)), f"{t} version {v}"
        assert a.committed_version(t, APP) == b.committed_version(t, APP), t
    meta = [[h.get("userMetadata") for h in e.history("retained")] for e in (a, b)]
    assert meta[0] == meta[1]


def deletion_vectors(engine) -> list:
    """deletionVector of every add action, and every protocol, of each table's log."""
    found = []
    for t in TABLES:
        for f in sorted((engine.path(t) / "_delta_log").glob("*.json")):
            for line in f.read_text().splitlines():
                action = json.loads(line)
                if "add" in action and action["add"].get("deletionVector"):
                    found.append((t, f.name, "deletionVector"))
                if "protocol" in action and action["protocol"] != {"minReaderVersion": 1, "minWriterVersion": 2}:
                    found.append((t, f.name, action["protocol"]))
    return found


def test_the_same_batches_leave_the_same_tables_at_every_version(fed):
    engines, answers = fed
    rs, spark = engines["delta-rs"], engines["delta-spark"]
    assert answers["delta-rs"] == answers["delta-spark"]
    first, replay, *_ = answers["delta-rs"]
    assert (first.messages, first.quarantined, first.retained_upserts, first.skipped_tables) == (5, 2, 4, ())
    assert replay.skipped_tables == ("messages", "quarantine", "retained")
    assert answers["delta-rs"][4:6] == [1, 0]
    assert_same_at_every_version(spark, rs)
    # and delta-rs reads delta-spark's directory as its own, every version
    from bridge.tables.deltars import DeltaRsEngine

    assert_same_at_every_version(rs, DeltaRsEngine(spark.tables_dir))
    assert deletion_vectors(spark) == [] and deletion_vectors(rs) == []


def test_the_retained_rule_held_on_both(fed):
    """What the sequence must leave (so that "the same" is not "the same mistake")."""
    for e in fed[0].values():
        got = {r["topic"]: r for r in e.arrow("retained", as_of=5).to_pylist()}
        assert sorted(got) == ["site/1/a", "site/1/b", "site/2/d", "site/2/g", "site/3/e", "site/4/f"]
        assert (got["site/1/a"]["payload"], got["site/1/a"]["seq"], got["site/1/a"]["content_type"]) == (b"a1", 80, None)
        assert got["site/1/b"]["deleted"] and got["site/1/b"]["seq"] == 90        # the zombie did not come back
        assert got["site/2/d"]["payload"] == b"d0"                                 # RETAIN=0 changed nothing
        assert got["site/2/g"]["deleted"] and got["site/2/g"]["payload"] is None   # expired
        assert (got["site/3/e"]["seq"], got["site/3/e"]["qos"]) == (110, 2)        # the marked re-send ignored
        assert got["site/3/e"]["user_properties"] == [{"key": "u", "value": "v"}]
        assert got["site/4/f"]["expires_at"] == T0 + dt.timedelta(seconds=30 + 3600)
        levels = {(r["topic"], r["protocol_level"]) for r in e.arrow("messages").to_pylist()}
        assert {("site/1/a", 5), ("site/1/a", 4), ("site/1/b", 4)} <= levels
        assert sorted(r["rule"] for r in e.arrow("quarantine").to_pylist()) == ["MQTT-3.2.2-15", "MQTT-3.3.1-4"]


def test_each_engine_reads_appends_to_and_merges_the_others_tables(fed, request):
    from bridge.edge.retained.snapshot import load_snapshot

    engines, _ = fed
    rs, spark = engines["delta-rs"], engines["delta-spark"]
    spark_on_rs = open_engine("delta-spark", rs.tables_dir, request)
    rs_on_spark = open_engine("delta-rs", spark.tables_dir, request)
    for t in TABLES:  # read
        assert sorted_rows(spark_on_rs.arrow(t)) == sorted_rows(rs.arrow(t)), t
        assert sorted_rows(rs_on_spark.arrow(t)) == sorted_rows(spark.arrow(t)), t
    assert sorted_rows(spark_on_rs.arrow("retained", as_of=2)) == sorted_rows(rs.arrow("retained", as_of=2))

    # a batch the other engine committed is refused, by every table
    for e in (spark_on_rs, rs_on_spark):
        assert step(e, 3).skipped_tables == ("messages", "quarantine", "retained")
    # a new batch: appended and merged by the other engine, on both directories
    across = [step(spark_on_rs, 4), step(rs_on_spark, 4)]
    assert across[0] == across[1] and across[0].skipped_tables == ()
    assert (across[0].messages, across[0].quarantined, across[0].retained_upserts, across[0].retained_deletes) == (2, 1, 1, 1)
    # ... and refused by the first engine of each directory
    for e in (rs, spark):
        assert step(e, 4).skipped_tables == ("messages", "quarantine", "retained")
        assert e.committed_version("retained", APP) == 4
    assert [spark_on_rs.expire_retained(us(7300)), rs_on_spark.expire_retained(us(7300))] == [1, 1]  # site/2/d

    assert_same_at_every_version(rs, spark)
    assert covered_offsets(rs.history("retained"), "mqtt-frames") == {0: 101, 1: 86}
    assert deletion_vectors(rs) == [] and deletion_vectors(spark) == []
    # the edge serves both directories alike
    snaps = [load_snapshot(e.path("retained"), "mqtt-frames", cache_bytes=1 << 20, warm_s=0) for e in (rs, spark)]
    assert snaps[0].version == snaps[1].version and snaps[0].covered == snaps[1].covered == {0: 101, 1: 86}
    served = []
    for s in snaps:
        live = s.live_rows(s.index.match("#"), now_wall_us=us(0))
        served.append(sorted((m.topic, m.frame(5, m.qos, 1 if m.qos else None, retain=True, now=m.received))
                             for m in s.messages(live, 0.0)))
    assert served[0] == served[1]
    assert [t for t, *_ in served[0]] == ["site/1/a", "site/3/e"]
