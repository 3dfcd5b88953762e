"""Torn tails are truncated with a warning; corrupt middle records are errors naming partition and offset."""

import logging
import re

import pytest

from bridge.capture import CorruptRecordError, LogFormatError, LogReader
from bridge.capture.layout import partition_dir
from bridge.capture.record import encode_headers, encode_record
from bridge.capture.segment import HEADER_SIZE, list_segments, segment_path
from tests.capture.util import append_range, frame, open_log


def _one_partition_log(path, n=20, **kw):
    with open_log(path, partitions=1, **kw) as log:
        acks = append_range(log, 0, n)
    return acks


def _last_segment(path, p=0):
    pdir = partition_dir(path, p)
    return segment_path(pdir, list_segments(pdir)[-1])


def _positions(path, p=0):
    """Byte position of each record in the partition's last segment."""
    data = _last_segment(path, p).read_bytes()
    pos, out = HEADER_SIZE, []
    while pos < len(data):
        out.append(pos)
        pos += int.from_bytes(data[pos + 8:pos + 12], "little")
    return out


def _next_record_bytes(offset):
    blob, n = encode_headers([("origin", b"client")])
    return encode_record(offset, 1000, 1, b"k", frame(offset), blob, n)


@pytest.mark.parametrize("cut", [1, 4, 11, 12, 51, 52, 60, -1])
def test_torn_tail_is_truncated_with_a_warning(tmp_path, caplog, cut):
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    size = seg.stat().st_size
    torn = _next_record_bytes(20)
    with seg.open("ab") as fh:
        fh.write(torn[:cut] if cut > 0 else torn[:-1])  # a write the crash interrupted
    caplog.set_level(logging.WARNING, "bridge.capture")
    with open_log(tmp_path, partitions=1) as log:
        assert log.next_offsets() == [20]
        a = log.append("c", b"k", b"after")
        a.wait(10)
        assert a.offset == 20
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert re.match(rf"^capture partition 0: torn tail in {seg.name} at byte {size} \(offset 20, [a-z ]+\): "
                    rf"truncating \d+ bytes that were never durable$", warning[0]), warning[0]
    reader = LogReader(tmp_path)
    recs = list(reader.records(0, 0, 21))
    assert [r.offset for r in recs] == list(range(21)) and recs[-1].value == b"after"


def test_zeroed_tail_after_power_loss_is_truncated(tmp_path, caplog):
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    with seg.open("ab") as fh:
        fh.write(b"\0" * 8192)  # file size grew, data blocks never written
    caplog.set_level(logging.WARNING, "bridge.capture")
    with open_log(tmp_path, partitions=1) as log:
        assert log.next_offsets() == [20]
    assert any("torn tail" in r.getMessage() and "bad magic" in r.getMessage() for r in caplog.records)


def test_corrupt_middle_record_on_open_names_partition_and_offset(tmp_path):
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    pos = _positions(tmp_path)[7]
    data = bytearray(seg.read_bytes())
    data[pos + 60] ^= 0xFF  # a byte inside record 7's payload
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=rf"^capture log partition 0 offset 7: corrupt record \(CRC mismatch\) "
                                                 rf"in {re.escape(str(seg))} at byte {pos}; records after it are not read$") as err:
        open_log(tmp_path, partitions=1)
    assert (err.value.partition, err.value.offset, err.value.position) == (0, 7, pos)
    assert seg.read_bytes() == bytes(data), "nothing is truncated when intact records follow"


def test_corrupt_length_in_the_middle_is_not_mistaken_for_a_torn_tail(tmp_path):
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    pos = _positions(tmp_path)[3]
    data = bytearray(seg.read_bytes())
    data[pos + 10] ^= 0x40  # the size field: the record now seems to run past the end
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"^capture log partition 0 offset 3: corrupt record \(implausible size\)"):
        open_log(tmp_path, partitions=1)


def test_corrupt_record_in_a_sealed_segment_is_reported_on_read(tmp_path):
    with open_log(tmp_path, partitions=1, segment_bytes=4000) as log:
        append_range(log, 0, 300)
    pdir = partition_dir(tmp_path, 0)
    bases = list_segments(pdir)
    assert len(bases) > 3
    seg = segment_path(pdir, bases[1])
    data = bytearray(seg.read_bytes())
    # second record of the second segment
    first_size = int.from_bytes(data[HEADER_SIZE + 8:HEADER_SIZE + 12], "little")
    pos = HEADER_SIZE + first_size
    data[pos + 70] ^= 0x01
    seg.write_bytes(bytes(data))
    bad = bases[1] + 1
    open_log(tmp_path, partitions=1).close()  # only the active segment is scanned on open
    reader = LogReader(tmp_path)
    msg = rf"^capture log partition 0 offset {bad}: corrupt record \(CRC mismatch\) in {re.escape(str(seg))} at byte {pos}"
    with pytest.raises(CorruptRecordError, match=msg):
        list(reader.records(0, 0, 300))
    with pytest.raises(CorruptRecordError, match=msg):
        list(reader.arrow_batches(0, 0, 300))
    with pytest.raises(CorruptRecordError, match=msg):
        list(reader.arrow_batches(0, bad, bad + 1))
    # ranges before it, and from the next segment on, read fine
    assert sum(b.num_rows for b in reader.arrow_batches(0, 0, bad)) == bad
    assert sum(b.num_rows for b in reader.arrow_batches(0, bases[2], 300)) == 300 - bases[2]
    # a later record of the same segment is found by walking from the segment's
    # start (or an index entry): the walk cannot step over damage, and says so
    with pytest.raises(CorruptRecordError, match=msg):
        list(reader.arrow_batches(0, bad + 1, bad + 2))


def test_torn_segment_header_is_recreated(tmp_path, caplog):
    _one_partition_log(tmp_path)
    pdir = partition_dir(tmp_path, 0)
    (pdir / f"{20:020d}.log").write_bytes(b"LAKEG")  # crash while rolling
    caplog.set_level(logging.WARNING, "bridge.capture")
    with open_log(tmp_path, partitions=1) as log:
        assert log.next_offsets() == [20]
        log.append("c", b"k", b"v").wait(10)
    assert any("torn file header" in r.getMessage() for r in caplog.records)
    assert [r.offset for r in LogReader(tmp_path).records(0, 18, 21)] == [18, 19, 20]


def test_unknown_format_version_is_refused(tmp_path):
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    data[8] = 9  # version
    seg.write_bytes(bytes(data))
    with pytest.raises(LogFormatError, match=r"(file header CRC mismatch|format version 9)"):
        open_log(tmp_path, partitions=1)


def test_recovered_records_are_readable_and_index_is_rebuilt(tmp_path):
    _one_partition_log(tmp_path, n=500)
    pdir = partition_dir(tmp_path, 0)
    base = list_segments(pdir)[-1]
    (pdir / f"{base:020d}.idx").write_bytes(b"garbage")
    with open_log(tmp_path, partitions=1):
        pass
    reader = LogReader(tmp_path)
    assert [r.offset for r in reader.records(0, 400, 403)] == [400, 401, 402]


def test_damaged_last_record_that_was_reported_durable_is_an_error_not_a_torn_tail(tmp_path):
    # All 20 appends were acknowledged as durable (the log closed cleanly, its
    # durable file says 20): damage to the last one is corruption, and
    # truncating it would silently drop an acknowledged record.
    _one_partition_log(tmp_path)
    seg = _last_segment(tmp_path)
    pos = _positions(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    data[pos + 60] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"^capture log partition 0 offset 19: corrupt record \(CRC mismatch; "
                                                 r"records up to offset 19 were reported durable\)"):
        open_log(tmp_path, partitions=1)
    assert seg.read_bytes() == bytes(data), "nothing is truncated"


def test_cut_segment_header_holding_durable_records_is_an_error(tmp_path):
    _one_partition_log(tmp_path, segment_bytes=1024)  # several segments
    seg = _last_segment(tmp_path)
    assert seg.name != f"{0:020d}.log"
    seg.write_bytes(seg.read_bytes()[:5])
    with pytest.raises(CorruptRecordError, match=r"file header is cut short at 5 bytes, but records up to "
                                                 r"offset 19 were reported durable"):
        open_log(tmp_path, partitions=1)
