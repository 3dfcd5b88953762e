import threading
import time

import pyarrow as pa
import pytest

from bridge.capture import LogReader, OffsetOutOfRangeError
from bridge.capture.layout import durable_path
from schemas.capture import CAPTURE_RECORD_DDL, TIMESTAMP_TYPE_LOG_APPEND
from schemas.ddl import to_arrow
from tests.capture.util import append_range, open_log


def _rows(batches):
    return [row for b in batches for row in b.to_pylist()]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("log")
    with open_log(path, segment_bytes=16_384) as log:
        append_range(log, 0, 3000)
        log.append("big", b"", b"\x30" + b"B" * 100_000, [("origin", b"will")])  # larger than a segment
        append_range(log, 3000, 3100)
    return path


def test_arrow_batches_have_the_capture_schema_and_match_records(log_dir):
    reader = LogReader(log_dir)
    schema = to_arrow(CAPTURE_RECORD_DDL)
    for p in range(reader.partitions):
        end = reader.durable_offsets()[p]
        batches = list(reader.arrow_batches(p, 0, end, batch_records=333, batch_bytes=20_000))
        assert all(b.schema.equals(schema) for b in batches)
        rows = _rows(batches)
        recs = list(reader.records(p, 0, end))
        assert len(rows) == len(recs) == end
        for row, r in zip(rows, recs):
            assert (row["key"], row["value"], row["offset"], row["partition"]) == (r.key, r.value, r.offset, p)
            assert row["topic"] == "mqtt-frames" and row["timestampType"] == TIMESTAMP_TYPE_LOG_APPEND
            assert [(h["key"], h["value"]) for h in row["headers"]] == r.headers
            assert row["timestamp"].timestamp() == pytest.approx(r.timestamp_us / 1e6, abs=1e-6)


@pytest.mark.parametrize("start,end", [(0, 1), (5, 6), (17, 400), (399, 401), (0, 0)])
def test_any_range_reads_exactly_its_offsets(log_dir, start, end):
    reader = LogReader(log_dir)
    for p in range(reader.partitions):
        e = min(end, reader.durable_offsets()[p])
        s = min(start, e)
        got = [r["offset"] for r in _rows(reader.arrow_batches(p, s, e, batch_records=50))]
        assert got == list(range(s, e))


def test_reading_beyond_the_durable_end_is_out_of_range(log_dir):
    reader = LogReader(log_dir)
    end = reader.durable_offsets()[0]
    with pytest.raises(OffsetOutOfRangeError, match=rf"^capture log partition 0: offsets \[{end - 1}, {end + 5}\) are "
                                                    rf"out of range \(the partition holds \[0, {end}\); the partition's "
                                                    rf"durable records end before offset {end}\)$"):
        list(reader.records(0, end - 1, end + 5))
    with pytest.raises(OffsetOutOfRangeError):
        list(reader.arrow_batches(0, end - 1, end + 5))


def test_stats(log_dir):
    stats = LogReader(log_dir).stats()
    assert sum(s.records for s in stats) == 3101
    assert all(s.first_offset == 0 and s.segments >= 1 and s.bytes > 0 for s in stats)


def test_durable_offsets_without_the_durable_file(tmp_path):
    with open_log(tmp_path) as log:
        append_range(log, 0, 100)
        log.flush()
        expect = log.durable_offsets()
    durable_path(tmp_path).unlink()
    assert LogReader(tmp_path).durable_offsets() == expect


def test_read_while_the_writer_appends(tmp_path):
    log = open_log(tmp_path, segment_bytes=8192)
    written = []

    def writer():
        for i in range(0, 10_000, 50):
            written.extend(append_range(log, i, i + 50))

    t = threading.Thread(target=writer)
    t.start()
    reader = LogReader(tmp_path)
    seen = [0] * reader.partitions
    passes = 0

    def read_new():
        durable = reader.durable_offsets()
        for p in range(reader.partitions):
            n = sum(b.num_rows for b in reader.arrow_batches(p, seen[p], durable[p]))
            assert n == durable[p] - seen[p]
            seen[p] = durable[p]

    try:
        deadline = time.monotonic() + 60
        while t.is_alive() and time.monotonic() < deadline:
            read_new()  # what became durable since the last pass
            passes += 1
    finally:
        t.join(30)
        log.close()
    read_new()
    assert sum(seen) == len(written) == 10_000 and passes >= 1


def test_empty_partition_yields_nothing(tmp_path):
    open_log(tmp_path).close()
    reader = LogReader(tmp_path)
    assert list(reader.arrow_batches(0, 0, 0)) == []
    assert reader.durable_offsets() == [0, 0, 0, 0]


def test_record_batch_is_not_built_row_by_row():
    # The schema's header list is what Spark's Arrow conversion expects.
    t = to_arrow(CAPTURE_RECORD_DDL).field("headers").type
    assert t == pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
