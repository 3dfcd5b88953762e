"""Two jobs on one checkpoint (a second job on the same data_dir): one of
them stops with one line, and nothing is written twice (docs/job.md, "Two
jobs on one checkpoint").

Both share the checkpoint, so the query id and the tables' application
transaction id: Spark creates each batch's offset and commit files only if
they do not exist (the loser of that race stops:
``CONCURRENT_STREAM_LOG_UPDATE``), and when both commit one batch to a table
at the same moment Delta refuses the second commit, which the job's engine
names in one line (``ConcurrentJobError``, bridge/tables/writer.py).
"""

from __future__ import annotations

import collections
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.spark.delta import make_engine
from bridge.tables.writer import ConcurrentJobError, once
from tests.conftest import child_env
from tests.job.frames import append_publish
from tests.tables.rows import publish, table
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_batch_another_writer_committed_meanwhile_is_one_line_and_written_once(tmp_path, monkeypatch):
    cfg = load_config(None, [f"data_dir={tmp_path}"], env={})
    first, second = make_engine(cfg), make_engine(cfg)
    first.ensure()
    rows = table([publish("a", seq=1)])
    assert second.committed_version("messages", "lakegate:q") is None  # the second read the table first...
    assert first.append("messages", rows, "lakegate:q", 0) is True  # ...then the first committed the batch
    monkeypatch.setattr(DeltaTable, "update_incremental", lambda self: None)  # the second's view: from before
    with pytest.raises(ConcurrentJobError) as err:
        once(second, "messages", "lakegate:q", 0, lambda: second.append("messages", rows, "lakegate:q", 0))
    monkeypatch.undo()
    assert str(err.value) == (
        "messages: another writer committed batch 0 of lakegate:q at the same moment (Delta: Failed to commit "
        "transaction: Concurrent transaction failed.): a second job runs on this checkpoint (the same data_dir and "
        "job.query_name); run one job per checkpoint. This one stops; nothing was written twice")
    assert DeltaTable(str(cfg.tables_dir / "messages")).to_pyarrow_table().num_rows == 1


def test_a_failed_write_of_a_batch_nobody_committed_is_raised_as_it_was(tmp_path, monkeypatch):
    import bridge.tables.deltars as deltars

    cfg = load_config(None, [f"data_dir={tmp_path}"], env={})
    engine = make_engine(cfg)
    engine.ensure()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(deltars, "write_deltalake", full)
    rows = table([publish("a", seq=1)])
    with pytest.raises(OSError, match="No space left on device") as err:
        once(engine, "messages", "lakegate:q", 0, lambda: engine.append("messages", rows, "lakegate:q", 0))
    assert err.value.__cause__ is None  # the error itself, as the engine raised it


@pytest.mark.spark
def test_the_job_stops_on_it_with_that_line(spark, tmp_path, monkeypatch, caplog):
    """What the job's log says when the other writer wins a table commit (the
    other writer made here: the commit lands just before this one's)."""
    from deltalake.exceptions import CommitFailedError

    from bridge.job.pipeline import release, run_job
    from bridge.tables.deltars import DeltaRsEngine

    cfg = load_config(None, [f"data_dir={tmp_path}", "amqp.url=", "capture.partitions=1"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    _write(log, 0, 5)
    log.close()
    append = DeltaRsEngine.append

    def the_other_job_first(self, table, rows, app_id, version):
        if table == "messages":
            append(DeltaRsEngine(self.tables_dir), table, rows, app_id, version)
            raise CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")
        return append(self, table, rows, app_id, version)

    monkeypatch.setattr(DeltaRsEngine, "append", the_other_job_first)
    try:
        with caplog.at_level(logging.ERROR, logger="bridge.job.pipeline"):
            assert run_job(spark, cfg, once=True) == 1
    finally:
        release(spark)  # the shared session keeps no listener of this checkpoint
    failed = [r.getMessage() for r in caplog.records if r.name == "bridge.job.pipeline"]
    assert failed == [
        "job failed: ConcurrentJobError: messages: another writer committed batch 0 of "
        f"{_app_id(tmp_path)} at the same moment (Delta: Failed to commit transaction: Concurrent transaction "
        "failed.): a second job runs on this checkpoint (the same data_dir and job.query_name); run one job per "
        "checkpoint. This one stops; nothing was written twice"], failed
    assert DeltaTable(str(cfg.tables_dir / "messages")).to_pyarrow_table().num_rows == 5  # the other job's, once


def _app_id(data_dir: Path) -> str:
    import json

    return "lakegate:" + json.loads((data_dir / "checkpoints" / "lakegate" / "metadata").read_text())["id"]


def _write(log: CaptureLog, start: int, n: int) -> int:
    acks = [append_publish(log, f"c{i % 3}", f"dev/{i % 7}", b"v%d" % i, packet_id=1 + i % 500)
            for i in range(start, start + n)]
    for a in acks:
        a.wait(10)
    return start + n


def _job(data_dir: Path, out: Path, *more: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "bridge", "process", "--set", f"data_dir={data_dir}", "--set", "amqp.url=",
            "--set", "spark.master=local[1]", "--set", "job.trigger_interval_s=0.5", *more]
    return subprocess.Popen(args, stdout=out.open("w"), stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                            start_new_session=True)


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_a_second_job_on_the_same_data_dir_stops_one_of_them_in_one_line_and_nothing_twice(tmp_path):
    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    jobs: dict[str, subprocess.Popen] = {}
    try:
        n = _write(log, 0, 200)
        jobs["first"] = _job(tmp_path, tmp_path / "first.out")
        commits = tmp_path / "checkpoints" / "lakegate" / "commits"
        wait_for(lambda: (commits / "0").exists() or jobs["first"].poll() is not None, timeout=300,
                 what="the first job's batch 0", poll=0.5)
        assert jobs["first"].poll() is None, (tmp_path / "first.out").read_text()[-3000:]
        jobs["second"] = _job(tmp_path, tmp_path / "second.out")
        deadline = time.monotonic() + 400
        while all(j.poll() is None for j in jobs.values()) and time.monotonic() < deadline:
            n = _write(log, n, 20)  # new records all along: both jobs want the next batch
            time.sleep(0.3)
        ended = [name for name, j in jobs.items() if j.poll() is not None]
        assert len(ended) == 1, f"jobs ended: {ended}"
        (loser,) = ended
        (survivor,) = set(jobs) - {loser}
        out = (tmp_path / f"{loser}.out").read_text()
        failed = [ln for ln in out.splitlines() if "job failed:" in ln]
        print(f"the {loser} job stopped (exit {jobs[loser].returncode}): {failed}")
        assert jobs[loser].returncode == 1, out[-3000:]
        assert len(failed) == 1, out[-3000:]
        assert "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected for" \
               in failed[0] or "ConcurrentJobError: " in failed[0], failed[0]
        assert "Traceback" not in out and "\tat " not in out, out[-3000:]
        jobs[survivor].send_signal(signal.SIGTERM)
        assert jobs[survivor].wait(120) == 0, (tmp_path / f"{survivor}.out").read_text()[-3000:]
    finally:
        for j in jobs.values():
            if j.poll() is None:
                j.kill()
                j.wait(30)
        log.close()
    last = subprocess.run([sys.executable, "-m", "bridge", "process", "--once", "--set", f"data_dir={tmp_path}",
                           "--set", "amqp.url=", "--set", "spark.master=local[1]"],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=600)
    assert last.returncode == 0, last.stderr[-3000:]
    t = DeltaTable(str(tmp_path / "tables" / "messages")).to_pyarrow_table(columns=["partition", "offset"])
    rows = collections.Counter(zip(t["partition"].to_pylist(), t["offset"].to_pylist()))
    assert not {k: c for k, c in rows.items() if c > 1}, "rows written twice"
    assert len(rows) == n, f"{len(rows)} of {n} records in messages"
