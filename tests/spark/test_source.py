"""The lakegate Spark data source over the capture log."""

import json
import threading
import time

import pytest

from bridge.capture import LogReader, commit_offsets, read_commits
from bridge.capture.retention import apply_retention
from bridge.spark.source import SourceOptionError, _share, parse_options
from schemas.capture import CAPTURE_RECORD_DDL
from tests.capture.util import append_range, frame, headers, key, open_log

# ---------------------------------------------------------------- no Spark


def test_share_is_proportional_exact_and_bounded():
    assert _share(100, [10, 20, 30]) == [10, 20, 30]  # all fits
    s = _share(10, [100, 0, 300, 1])
    assert sum(s) == 10 and s[1] == 0 and s[2] > s[0] and all(x <= lag for x, lag in zip(s, [100, 0, 300, 1]))
    assert sum(_share(1, [5, 5, 5])) == 1  # always progress


def test_options_are_checked_and_typed(tmp_path):
    open_log(tmp_path).close()
    opts = parse_options({"path": str(tmp_path), "startingoffsets": '{"0": 5, "3": -2}', "maxrecordspertrigger": "7",
                          "failondataloss": "false", "consumer": "job-1"})
    assert opts["startingOffsets"] == {0: 5, 3: -2} and opts["maxRecordsPerTrigger"] == 7
    assert opts["failOnDataLoss"] is False and opts["consumer"] == "job-1" and opts["partitions"] == 4


@pytest.mark.parametrize("options,message", [
    ({"bogus": "1"}, r"^lakegate source: option bogus: unknown option; known options: path, startingOffsets, "),
    ({"maxrecordspertrigger": "lots"}, r"^lakegate source: option maxRecordsPerTrigger: expected a positive integer, got 'lots'$"),
    ({"maxrecordspertrigger": "0"}, r"^lakegate source: option maxRecordsPerTrigger: expected a positive integer"),
    ({"startingoffsets": "first"}, r"^lakegate source: option startingOffsets: expected earliest or latest or a JSON object"),
    ({"startingoffsets": '{"0": "x"}'}, r"^lakegate source: option startingOffsets: partition 0: offset must be an integer >= -2"),
    ({"startingoffsets": '{"9": 0}'}, r"^lakegate source: option startingOffsets: partition 9 does not exist; the log has partitions 0-3$"),
    ({"endingoffsets": "earliest"}, r"^lakegate source: option endingOffsets: expected latest or a JSON object"),
    ({"failondataloss": "maybe"}, r"^lakegate source: option failOnDataLoss: expected true or false, got 'maybe'$"),
    ({"consumer": "a/b"}, r"^lakegate source: option consumer: use letters, digits"),
])
def test_bad_options_name_the_option(tmp_path, options, message):
    open_log(tmp_path).close()
    with pytest.raises(SourceOptionError, match=message):
        parse_options({"path": str(tmp_path), **options})


def test_path_must_hold_a_capture_log(tmp_path):
    with pytest.raises(SourceOptionError, match=rf"^lakegate source: option path: no capture log at {tmp_path}"):
        parse_options({"path": str(tmp_path)})
    with pytest.raises(SourceOptionError, match=r"^lakegate source: option path: required"):
        parse_options({})


def test_schema_is_the_kafka_source_schema():
    """Spark's Kafka source rows (docs: Structured Streaming + Kafka Integration Guide)."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                                   StructType, TimestampType)

    from schemas.spark import to_spark

    kafka = StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
        StructField("partition", IntegerType()), StructField("offset", LongType()),
        StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                     StructField("value", BinaryType())]))),
    ])
    assert to_spark(CAPTURE_RECORD_DDL) == kafka


# ------------------------------------------------------------------- Spark

spark_only = pytest.mark.spark


@pytest.fixture(scope="module")
def lakegate(spark):
    from bridge.spark.source import register

    register(spark)
    return spark


@pytest.fixture
def filled(tmp_path):
    path = tmp_path / "capture"
    with open_log(path, segment_bytes=8192) as log:
        acks = append_range(log, 0, 1000)
    return path, {(a.partition, a.offset): i for i, a in enumerate(acks)}


@spark_only
def test_batch_read_returns_every_record_as_written(lakegate, filled):
    path, written = filled
    df = lakegate.read.format("lakegate").load(str(path))
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>")
    rows = df.collect()
    assert len(rows) == 1000
    for r in rows:
        i = written[(r.partition, r.offset)]
        assert (bytes(r.key), bytes(r.value), r.topic, r.timestampType) == (key(i), frame(i), "mqtt-frames", 1)
        hdrs = [(h.key, bytes(h.value)) for h in r.headers]
        assert hdrs == headers(i) + [("seq", str(i).encode())]


@spark_only
def test_batch_read_equals_the_records_the_log_decodes_one_by_one(lakegate, filled):
    """The Spark source (Arrow batches built in bulk) against the log's
    per-record decoder, as whole DataFrames (chispa): same rows, same types."""
    import datetime as dt

    from chispa import assert_df_equality

    from schemas.spark import to_spark

    path, _ = filled
    reader = LogReader(path)
    ends = reader.durable_offsets()
    expected = [(r.key, r.value, "mqtt-frames", r.partition, r.offset,
                 dt.datetime.fromtimestamp(r.timestamp_us / 1e6), 1, [(k, v) for k, v in r.headers])
                for p in range(reader.partitions) for r in reader.records(p, 0, ends[p])]
    assert len(expected) == 1000
    want = lakegate.createDataFrame(expected, to_spark(CAPTURE_RECORD_DDL))
    got = lakegate.read.format("lakegate").load(str(path))
    assert_df_equality(got, want, ignore_row_order=True)


@spark_only
def test_batch_read_between_offsets(lakegate, filled):
    path, _ = filled
    df = (lakegate.read.format("lakegate").option("startingOffsets", json.dumps({"0": 10, "1": 0}))
          .option("endingOffsets", json.dumps({"0": 15, "1": 3, "2": 0, "3": -1})).load(str(path)))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    last3 = LogReader(path).durable_offsets()[3]
    assert got == [(0, o) for o in range(10, 15)] + [(1, 0), (1, 1), (1, 2)] + [(3, o) for o in range(last3)]


@spark_only
def test_unknown_option_fails_at_query_start_naming_it(lakegate, filled):
    path, _ = filled
    with pytest.raises(Exception, match=r"lakegate source: option startingoffset: unknown option"):
        lakegate.read.format("lakegate").option("startingOffset", "earliest").load(str(path)).collect()
    with pytest.raises(Exception, match=r"lakegate source: option maxRecordsPerTrigger: expected a positive integer"):
        lakegate.readStream.format("lakegate").option("maxRecordsPerTrigger", "ten").load(str(path))
    with pytest.raises(Exception, match=r"lakegate source: option endingOffsets: applies only to spark\.read"):
        q = (lakegate.readStream.format("lakegate").option("endingOffsets", "latest").load(str(path))
             .writeStream.format("noop").trigger(availableNow=True).start())
        q.awaitTermination(60)


@spark_only
def test_max_records_per_trigger_limits_each_micro_batch(lakegate, filled, tmp_path):
    path, _ = filled
    q = (lakegate.readStream.format("lakegate").option("maxRecordsPerTrigger", "400").load(str(path))
         .writeStream.format("memory").queryName("admission").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(120)
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert sizes == [400, 400, 200]
        assert lakegate.sql("select count(distinct partition, offset) n from admission").first().n == 1000
    finally:
        q.stop()
    # commit(end) told the log what the consumer processed. Spark commits a
    # batch's offsets when it plans the next one, so the last batch of a run
    # is committed by the next run: the commit covers the first two batches.
    commit = read_commits(path)["spark"]
    assert sum(commit.values()) == 800
    assert all(commit[p] <= o for p, o in enumerate(LogReader(path).durable_offsets()))


@spark_only
def test_retention_after_commit_and_fail_on_data_loss(lakegate, filled, tmp_path):
    path, _ = filled
    q = (lakegate.readStream.format("lakegate").option("consumer", "ret").option("maxRecordsPerTrigger", "300")
         .load(str(path))
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    end = read_commits(path)["ret"]  # the first three of four batches
    assert sum(end.values()) == 900
    report = apply_retention(path, 4, retention_age_s=0, retention_bytes=0, now=time.time() + 10)
    assert report.deleted and all(seg_end <= end[p] for p, _base, seg_end, _n in report.deleted)
    earliest = LogReader(path).earliest_offsets()
    p = max(range(4), key=lambda i: earliest[i])
    with pytest.raises(Exception, match=rf"capture log partition {p}: offsets \[0, \d+\) are out of range"):
        lakegate.read.format("lakegate").option("startingOffsets", json.dumps({str(p): 0})).load(str(path)).collect()
    n = (lakegate.read.format("lakegate").option("startingOffsets", json.dumps({str(p): 0}))
         .option("failOnDataLoss", "false").load(str(path)).count())
    durable = LogReader(path).durable_offsets()
    assert n == sum(durable) - sum(earliest)


@spark_only
@pytest.mark.slow
def test_restarted_stream_reads_every_record_exactly_once_while_writer_appends(lakegate, tmp_path):
    path = tmp_path / "capture"
    log = open_log(path, segment_bytes=64 * 1024)
    written: dict[tuple[int, int], int] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        try:
            i = 0
            while not stop.is_set() and i < 100_000:
                for a, j in zip(append_range(log, i, i + 20), range(i, i + 20)):
                    written[(a.partition, a.offset)] = j
                i += 20
                stop.wait(0.02)  # pacing: about 1,000 records/s for as long as the queries run
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def start(**trigger):
        return (lakegate.readStream.format("lakegate").option("maxRecordsPerTrigger", "2500").load(str(path))
                .select("partition", "offset", "value")
                .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
                .option("path", str(tmp_path / "out")).trigger(**trigger).start())

    t = threading.Thread(target=writer)
    t.start()
    try:
        # 1: a running stream, stopped after a few micro-batches (possibly mid-batch)
        q = start(processingTime="0 seconds")
        deadline = time.monotonic() + 90
        while sum(1 for p in q.recentProgress if p["numInputRows"]) < 2 and time.monotonic() < deadline:
            q.awaitTermination(0.2)  # polls progress with a deadline
        q.stop()
        phases = [len(written)]
        # 2: restarted from its checkpoint while the writer keeps appending
        q = start(availableNow=True)
        assert q.awaitTermination(120)
        phases.append(len(written))
    finally:
        stop.set()
        t.join(30)
        log.close()
    assert not errors and not t.is_alive()
    assert 0 < phases[0] < phases[1] <= len(written), "the writer appended while the queries ran"
    # 3: once more, after the writer stopped, to read everything it wrote
    q = start(availableNow=True)
    assert q.awaitTermination(120)

    rows = lakegate.read.parquet(str(tmp_path / "out")).collect()
    seen = [(r.partition, r.offset) for r in rows]
    assert len(seen) == len(set(seen)), "a record was read twice"
    durable = LogReader(path).durable_offsets()
    assert set(seen) == {(p, o) for p in range(4) for o in range(durable[p])}, "a record was skipped"
    assert set(seen) == set(written)
    for r in rows:
        assert bytes(r.value) == frame(written[(r.partition, r.offset)])
    commit = read_commits(path)["spark"]
    assert all(0 < commit[p] <= durable[p] for p in range(4))


def test_commit_offsets_is_atomic_json(tmp_path):
    open_log(tmp_path).close()
    commit_offsets(tmp_path, "spark", {"0": 5, 1: 6})
    doc = json.loads((tmp_path / "consumers" / "spark.json").read_text())
    assert doc["consumer"] == "spark" and doc["offsets"] == {"0": 5, "1": 6}
    assert not [p for p in (tmp_path / "consumers").iterdir() if p.name.endswith(".tmp")]


@spark_only
def test_the_capture_pages_spark_example_runs(lakegate, tmp_path):
    from bridge.config import load_config
    from tests.docs.examples import doc_examples

    config = load_config(None, [f"data_dir={tmp_path}"], env={})
    with open_log(config.capture_dir) as log:
        i = 0
        while log.next_offsets()[0] < 1100 and i < 100_000:
            append_range(log, i, i + 100)
            i += 100
    ns = {"spark": lakegate, "config": config}
    (code,) = doc_examples("docs/capture.md", "The Spark source")
    exec(compile(code, "docs/capture.md", "exec"), ns)
    assert ns["frames"].isStreaming
    assert ns["replay"].count() == sum(LogReader(config.capture_dir).durable_offsets()) - 1000
