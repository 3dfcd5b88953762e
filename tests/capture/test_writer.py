import asyncio
import concurrent.futures
import errno
import os
import threading
import time

import pytest

from bridge.capture import (
    BackPressureTimeout,
    CaptureLog,
    CaptureWriteError,
    LogClosedError,
    LogLockedError,
    LogMismatchError,
    LogReader,
    partition_for,
)
from bridge.capture import partition as partition_mod
from bridge.capture.layout import partition_dir
from bridge.capture.segment import list_segments, read_index, segment_path
from bridge.config import CaptureConfig
from tests.capture.util import FsyncGate, append_range, conn, frame, headers, key, open_log


def test_append_assigns_dense_offsets_per_partition_and_keeps_connection_order(tmp_path):
    with open_log(tmp_path) as log:
        acks = append_range(log, 0, 300)
        log.flush()
        assert all(a.durable() for a in acks)
    per_part: dict[int, list[int]] = {}
    for i, a in enumerate(acks):
        assert a.partition == partition_for(conn(i), 4)
        per_part.setdefault(a.partition, []).append(a.offset)
    for offsets in per_part.values():
        assert offsets == list(range(len(offsets)))
    assert [a.seq for a in acks] == list(range(300))
    reader = LogReader(tmp_path)
    for p in range(4):
        recs = list(reader.records(p, 0, reader.durable_offsets()[p]))
        by_conn: dict[bytes, list[int]] = {}
        for r in recs:
            by_conn.setdefault(r.header("conn_id"), []).append(r.seq)
        for seqs in by_conn.values():
            assert seqs == sorted(seqs)  # arrival order within a connection
    i = 123
    r = next(reader.records(acks[i].partition, acks[i].offset, acks[i].offset + 1))
    assert (r.key, r.value, list(r.stored_headers)) == (key(i), frame(i), headers(i))
    assert r.header("seq") == b"123"


def test_ack_wait_callback_and_asyncio(tmp_path):
    with open_log(tmp_path) as log:
        ack = log.append("c", b"k", b"v")
        seen = threading.Event()
        ack.add_done_callback(lambda a: seen.set() if a is ack else None)
        ack.wait(timeout=10)
        assert ack.durable() and seen.wait(10)

        async def main():
            a = log.append("c", b"k", b"v2")
            await asyncio.wait_for(a.wait_async(), 10)
            return a

        a2 = asyncio.run(main())
        assert a2.durable() and a2.offset == ack.offset + 1
        assert "durable" in repr(a2)


def test_group_commit_by_record_count_without_flush(tmp_path):
    with open_log(tmp_path, fsync_interval_ms=60_000, fsync_records=10) as log:
        acks = append_range(log, 0, 10)
        acks[-1].wait(timeout=10)  # sealed by the 10th append, long before the interval
        assert all(a.durable() for a in acks)
        assert log.stats["commits"] == 1


def test_group_commit_by_interval_without_flush(tmp_path):
    with open_log(tmp_path, fsync_interval_ms=20, fsync_records=1_000_000) as log:
        ack = log.append("c", b"k", b"v")
        ack.wait(timeout=10)
        assert log.durable_offsets()[ack.partition] == ack.offset + 1


def test_group_commit_at_once_after_a_quiet_moment_then_at_most_one_per_interval(tmp_path):
    with open_log(tmp_path, fsync_interval_ms=60_000, fsync_records=1_000_000) as log:
        first = log.append("c", b"k", b"v")
        first.wait(timeout=10)  # no commit in the last interval: committed at once
        second = log.append("c", b"k", b"w")
        with pytest.raises(concurrent.futures.TimeoutError):
            second.wait(timeout=0.5)  # the interval since the first commit is not over
        log.flush()
        assert second.durable() and log.stats["commits"] == 2


def test_seq_and_offsets_continue_after_reopen(tmp_path):
    with open_log(tmp_path) as log:
        append_range(log, 0, 50)
        offsets = log.next_offsets()
    with open_log(tmp_path) as log:
        assert log.next_seq == 50
        assert log.next_offsets() == offsets
        a = log.append(conn(0), key(0), frame(0), headers(0))
        assert (a.seq, a.offset) == (50, offsets[a.partition])


def test_second_writer_is_refused(tmp_path):
    with open_log(tmp_path):
        with pytest.raises(LogLockedError, match=rf"^capture log {tmp_path} is in use by another writer "
                                                 rf"\(pid {os.getpid()}\); only one lakegate edge may write a capture log$"):
            open_log(tmp_path)
    open_log(tmp_path).close()  # released on close


def test_changing_the_partition_count_is_refused(tmp_path):
    open_log(tmp_path).close()
    with pytest.raises(LogMismatchError, match=r"^capture\.partitions is 8 but the capture log at .* was created with 4 "
                                               r"partitions; the partition count of an existing log cannot change"):
        open_log(tmp_path, partitions=8)
    open_log(tmp_path).close()  # the refused open released the lock


def test_changing_the_stream_name_is_refused(tmp_path):
    open_log(tmp_path).close()
    with pytest.raises(LogMismatchError, match=r"^capture\.stream is 'other' but the capture log"):
        open_log(tmp_path, stream="other")


def test_open_takes_capture_config(tmp_path):
    cfg = CaptureConfig(partitions=2, stream="s1", fsync_interval_ms=0)
    with CaptureLog.open(tmp_path, cfg) as log:
        assert log.partitions == 2 and log.stream == "s1"
        log.append("c", b"", b"x").wait(10)
    r = LogReader(tmp_path)
    assert (r.partitions, r.stream) == (2, "s1")


def test_segments_roll_and_are_indexed(tmp_path):
    with open_log(tmp_path, segment_bytes=20_000, partitions=1) as log:
        append_range(log, 0, 2000)
    pdir = partition_dir(tmp_path, 0)
    bases = list_segments(pdir)
    assert len(bases) > 5 and bases[0] == 0
    for b in bases[:-1]:
        size = segment_path(pdir, b).stat().st_size
        assert size <= 20_000
        assert read_index(pdir, 0, b, size), "every full segment has index entries"
    reader = LogReader(tmp_path)
    got = [r.offset for r in reader.records(0, 0, 2000)]
    assert got == list(range(2000))
    # reading from the middle of a segment uses the index and finds the exact offset
    assert [r.offset for r in reader.records(0, 1234, 1240)] == list(range(1234, 1240))


def test_appends_after_close_raise(tmp_path):
    log = open_log(tmp_path)
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError, match="is closed"):
        log.append("c", b"k", b"v")


def test_close_makes_everything_durable(tmp_path):
    log = open_log(tmp_path, fsync_interval_ms=60_000, fsync_records=1_000_000)
    acks = append_range(log, 0, 20)
    log.close()
    assert all(a.durable() for a in acks)
    assert sum(LogReader(tmp_path).durable_offsets()) == 20


def test_back_pressure_blocks_appends_and_bounds_memory(tmp_path, monkeypatch):
    log = open_log(tmp_path, fsync_interval_ms=0, max_pending_bytes=4096)
    gate = FsyncGate()
    monkeypatch.setattr(partition_mod.os, "fdatasync", gate)
    try:
        first = log.append("c", b"k", b"x" * 1000)
        assert gate.entered.wait(10)  # the flusher is stuck in fsync
        appended = [first]
        with pytest.raises(BackPressureTimeout, match=r"^capture log: \d+ bytes are waiting for the disk "
                                                      r"\(max_pending_bytes 4096\); append of \d+ bytes timed out$"):
            for _ in range(10):
                appended.append(log.append("c", b"k", b"x" * 1000, timeout=0.05))
        assert 2 <= len(appended) <= 4
        assert log._pending_bytes <= 4096
        assert not log.has_room(1100)
        blocked = threading.Thread(target=lambda: appended.append(log.append("c", b"k", b"x" * 1000)))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive(), "an append must wait while the disk is behind"
        gate.open.set()
        blocked.join(10)
        assert not blocked.is_alive()
        log.flush(timeout=10)
        assert all(a.durable() for a in appended)
    finally:
        gate.open.set()
        log.close()


def test_failed_write_fails_pending_and_later_appends(tmp_path, monkeypatch):
    log = open_log(tmp_path, partitions=1)
    append_range(log, 0, 5)
    log.flush()

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(partition_mod, "write_all", disk_full)
    acks = append_range(log, 5, 8)
    for a in acks:
        with pytest.raises(CaptureWriteError, match=r"^capture log write failed: No space left on device; "
                                                    r"\d+ appended records are not durable$"):
            a.wait(10)
        assert not a.durable()
    assert log.durable_offsets() == [5]
    with pytest.raises(CaptureWriteError, match="failed earlier and must be reopened"):
        log.append("c", b"k", b"v")
    log.close()
    monkeypatch.undo()
    with open_log(tmp_path, partitions=1) as log2:
        assert log2.next_offsets() == [5]  # nothing of the failed appends is in the log


def test_failed_fsync_is_never_reported_durable(tmp_path, monkeypatch):
    log = open_log(tmp_path, partitions=1)

    def io_error(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(partition_mod.os, "fdatasync", io_error)
    ack = log.append("c", b"k", b"v")
    with pytest.raises(CaptureWriteError, match="Input/output error"):
        ack.wait(10)
    assert log.failed is not None and log.durable_offsets() == [0]
    monkeypatch.undo()
    log.close()


def test_reader_sees_only_durable_records(tmp_path, monkeypatch):
    log = open_log(tmp_path, partitions=1, fsync_interval_ms=0)
    gate = FsyncGate()
    log.append("c", b"k", b"v0").wait(10)
    monkeypatch.setattr(partition_mod.os, "fdatasync", gate)
    try:
        ack = log.append("c", b"k", b"v1")
        assert gate.entered.wait(10)  # written, not yet fsynced
        assert LogReader(tmp_path).durable_offsets() == [1]
        gate.open.set()
        ack.wait(10)
        assert LogReader(tmp_path).durable_offsets() == [2]
    finally:
        gate.open.set()
        log.close()


def test_concurrent_appenders_keep_offsets_dense(tmp_path):
    with open_log(tmp_path) as log:
        out: list = []

        def work(t):
            out.extend(log.append(f"t{t}:{i % 3}", b"k", b"%d" % i) for i in range(500))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        log.flush()
        assert len({a.seq for a in out}) == 2000
        for p in range(4):
            offs = sorted(a.offset for a in out if a.partition == p)
            assert offs == list(range(len(offs)))


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^capture\.fsync_records must be positive, got 0$"):
        CaptureLog.open(tmp_path, fsync_records=0)
    with pytest.raises(TypeError, match="unknown capture log settings: nope"):
        CaptureLog.open(tmp_path, nope=1)


def test_durable_wait_is_bounded_by_the_interval(tmp_path):
    # Not a benchmark: a sanity bound far above the 5 ms policy on any disk.
    with open_log(tmp_path, fsync_interval_ms=5) as log:
        t0 = time.monotonic()
        log.append("c", b"k", b"v").wait(10)
        assert time.monotonic() - t0 < 5
