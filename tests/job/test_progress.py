"""Progress: the line, the status file, one listener per checkpoint across
query restarts, and the supervisor's backoff."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import Counter
from types import SimpleNamespace

import pytest

from bridge.job.batch import BatchStats
from bridge.job.progress import LINES_KEPT, STATUS_FILE, ProgressListener, format_line, read_status
from bridge.tables.writer import TableStats
from tests.waiting import wait_for

ROW = {"batch_id": 12, "input_rows": 1500, "rows_per_s": 3199.6, "duration_ms": 470, "retained_upserts": 12,
       "retained_deletes": 3, "quarantined": 2, "forwarded": 1480, "lag": 7}


def test_format_line_shows_every_field():
    assert format_line(ROW) == ("batch 12: 1500 rows, 3200 rows/s, 470 ms; retained +12/-3; "
                                "quarantined 2; forwarded 1480; lag 7")


def test_format_line_shows_expired_forwards_only_when_there_are_some():
    assert "; forwarded 1480 (expired 4); lag 7" in format_line({**ROW, "forward_expired": 4})
    assert "expired" not in format_line({**ROW, "forward_expired": 0})


# ---------------------------------------------------------------- listener


def _progress(batch, rows, *, qid="q-1", end=None, rate=250.0, ms=40):
    src = SimpleNamespace(endOffset=json.dumps(end if end is not None else {"0": 10 * (batch + 1)}))
    return SimpleNamespace(id=qid, batchId=batch, numInputRows=rows, processedRowsPerSecond=rate,
                           batchDuration=ms, sources=[src])


def _stats(batch, messages, *, quarantined=0, upserts=0, deletes=0, forwarded=0, expired=0):
    return BatchStats(batch_id=batch, tables=TableStats(messages=messages, quarantined=quarantined,
                                                        retained_upserts=upserts, retained_deletes=deletes,
                                                        skipped_tables=()),
                      forwarded=forwarded, forward_expired=expired)


@pytest.fixture
def listener(tmp_path):
    checkpoint = tmp_path / "checkpoints" / "lakegate"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"q-1"}\n')
    return ProgressListener(tmp_path, log_end=lambda: {"0": 25, "1": 4}, checkpoint=checkpoint)


def test_status_file_has_the_batch_the_line_and_totals(listener, tmp_path):
    listener.record(_stats(0, 9, quarantined=1, upserts=3, deletes=1, forwarded=8, expired=1))
    listener.report(_progress(0, 10, end={"0": 20, "1": 4}, rate=123.4, ms=81))
    st = read_status(tmp_path)
    assert {k: st[k] for k in ("batch_id", "input_rows", "rows_per_s", "duration_ms", "retained_upserts",
                               "retained_deletes", "quarantined", "messages", "forwarded", "forward_expired",
                               "lag", "end_offsets", "query_id")} == {
        "batch_id": 0, "input_rows": 10, "rows_per_s": 123.4, "duration_ms": 81, "retained_upserts": 3,
        "retained_deletes": 1, "quarantined": 1, "messages": 9, "forwarded": 8, "forward_expired": 1,
        "lag": 5, "end_offsets": {"0": 20, "1": 4}, "query_id": "q-1"}  # lag: (25 - 20) + (4 - 4)
    assert st["totals"] == {"batches": 1, "input_rows": 10, "messages": 9, "quarantined": 1, "forwarded": 8,
                            "forward_expired": 1, "retained_upserts": 3, "retained_deletes": 1,
                            "forward_unforwardable": 0}
    assert list(listener.lines) == [format_line(st)]
    assert not (tmp_path / (STATUS_FILE + ".tmp")).exists()


def test_each_batch_once_and_totals_add_up_across_a_restart(listener, tmp_path):
    listener.record(_stats(0, 5, forwarded=5))
    listener.report(_progress(0, 5))
    # the query fails in batch 1 and restarts from its checkpoint: batch 1 runs again
    listener.record(_stats(1, 7, forwarded=7))
    listener.report(_progress(1, 7))
    listener.report(_progress(1, 7))  # catch-up and the listener bus both deliver it
    listener.report(_progress(0, 5))  # a late event of the run that failed
    listener.record(_stats(2, 3, forwarded=3))
    listener.report(_progress(2, 3))
    assert [int(re.match(r"batch (\d+):", x).group(1)) for x in listener.lines] == [0, 1, 2]
    st = read_status(tmp_path)
    assert st["batch_id"] == 2
    assert st["totals"]["batches"] == 3
    assert st["totals"]["input_rows"] == st["totals"]["messages"] == st["totals"]["forwarded"] == 15


def test_other_queries_on_the_session_are_not_reported(listener, tmp_path):
    listener.report(_progress(0, 5, qid="some-other-query"))
    assert read_status(tmp_path) is None and not listener.lines


def test_a_checkpoint_made_anew_starts_again_at_batch_0(listener, tmp_path):
    listener.report(_progress(3, 5))
    (tmp_path / "checkpoints" / "lakegate" / "metadata").write_text('{"id":"q-2"}\n')
    listener.report(_progress(0, 2, qid="q-2"))
    listener.report(_progress(4, 2, qid="q-1"))  # the old query's id is not this checkpoint's any more
    assert [x.split(":")[0] for x in listener.lines] == ["batch 3", "batch 0"]
    assert read_status(tmp_path)["query_id"] == "q-2"


def test_memory_is_bounded(listener):
    for b in range(LINES_KEPT + 50):
        listener.record(_stats(b, 1))
        listener.report(_progress(b, 1))
    assert len(listener.lines) == LINES_KEPT
    assert listener.lines[-1].startswith(f"batch {LINES_KEPT + 49}:")
    assert listener._stats == {}  # reported batches' statistics are dropped
    for b in range(1000, 1300):  # statistics of batches whose progress never arrives
        listener.record(_stats(b, 1))
    assert len(listener._stats) <= 101


# ---------------------------------------------------------------- failures (outages visible)

FORWARD_FAILED = ("py4j.protocol.Py4JJavaError: An error occurred\n"
                  "bridge.amqp.sender.ForwardError: AMQP connection to amqp://127.0.0.1:5672 failed: "
                  "amqp:connection:framing-error: Connection refused (6 attempts)\n\tat org.apache.spark...")


def _terminated(exception, qid="q-1"):
    return SimpleNamespace(id=qid, runId="r-1", exception=exception)


def test_failed_query_is_in_the_status_file_with_cause_and_since_until_a_batch_completes(listener, tmp_path):
    from bridge.job.progress import current_failure, format_failure

    listener.record(_stats(0, 5, forwarded=5))
    listener.report(_progress(0, 5))
    done_at = read_status(tmp_path)["time"]
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))
    st = read_status(tmp_path)
    assert st["batch_id"] == 0 and st["time"] == done_at  # the last completed batch stays
    first = st["failure"]
    assert first["cause"] == ("ForwardError: AMQP connection to amqp://127.0.0.1:5672 failed: "
                              "amqp:connection:framing-error: Connection refused (6 attempts)")
    assert first["failures"] == 1 and done_at <= first["since"] == first["time"]
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))  # restarted, failed again: since stays
    again = read_status(tmp_path)["failure"]
    assert again["since"] == first["since"] and again["failures"] == 2 and again["time"] >= first["time"]
    now = current_failure(tmp_path)
    assert now == {"since": first["since"], "cause": first["cause"], "time": again["time"], "failures": 2}
    line = format_failure(now, now=first["since"] + 42)
    assert re.fullmatch(r"FAILING since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} \(42s, last reported \d+s ago\) "
                        r"\(2 failed batch runs\): ForwardError: AMQP connection to .* \(6 attempts\)", line), line
    assert "last reported" not in format_failure(now, now=again["time"] + 0.5)  # a report just now
    restarted = ProgressListener(tmp_path, log_end=listener.log_end, checkpoint=listener.checkpoint)
    restarted.onQueryTerminated(_terminated(FORWARD_FAILED))  # the job started again, failed again
    assert read_status(tmp_path)["failure"]["since"] == first["since"]
    assert read_status(tmp_path)["failure"]["failures"] == 3
    listener.record(_stats(1, 5, forwarded=5))
    listener.report(_progress(1, 5))  # recovered
    assert "failure" not in read_status(tmp_path) and current_failure(tmp_path) is None
    assert listener.lines[-1].startswith("batch 1:")


def test_one_driver_line_per_failed_batch_run_under_the_supervisor(listener, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="bridge.job.progress")
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))
    listener.supervised = True  # lakegate run: the supervisor logs "job: micro-batch failed (...)"
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))
    levels = [r.levelno for r in caplog.records if r.getMessage().startswith("query terminated with error: ")]
    assert levels == [logging.ERROR, logging.DEBUG]
    assert read_status(tmp_path)["failure"]["failures"] == 2  # recorded either way


def test_a_stop_request_is_not_a_failure(listener, tmp_path):
    listener.onQueryTerminated(_terminated("StopRequested: stop requested: batch 4 runs again"))
    listener.onQueryTerminated(_terminated(None))
    assert read_status(tmp_path) is None


def test_executor_trouble_shows_before_the_query_fails_and_sets_since(listener, tmp_path):
    from bridge.amqp.trouble import TroubleFile
    from bridge.job.progress import current_failure

    listener.record(_stats(0, 5, forwarded=5))
    listener.report(_progress(0, 5))
    done_at = read_status(tmp_path)["time"]
    stale = tmp_path / "forward-trouble" / "gone-1.json"  # a worker that died before the last batch
    stale.parent.mkdir()
    stale.write_text(json.dumps({"cause": "old", "since": done_at - 100, "time": done_at - 50}))
    assert current_failure(tmp_path) is None
    since = done_at  # the first failed attempt, right after the last batch
    TroubleFile(tmp_path).write("connection to amqp://127.0.0.1:5672 failed: Connection refused", since)
    now = current_failure(tmp_path)
    assert now["since"] == since and now["failures"] == 0
    assert now["cause"] == "forwarding: connection to amqp://127.0.0.1:5672 failed: Connection refused"
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))  # the batch gave up: since is the first attempt's
    assert read_status(tmp_path)["failure"]["since"] == since
    assert current_failure(tmp_path)["cause"].startswith("ForwardError: ")
    listener.record(_stats(1, 5, forwarded=5))
    listener.report(_progress(1, 5))
    assert current_failure(tmp_path) is None and not list((tmp_path / "forward-trouble").glob("*.json"))


def test_status_command_shows_the_failure_first(listener, tmp_path, capsys):
    from argparse import Namespace

    from bridge.commands import status
    from bridge.config import load_config

    listener.record(_stats(0, 5, forwarded=5))
    listener.report(_progress(0, 5))
    listener.onQueryTerminated(_terminated(FORWARD_FAILED))
    config = load_config(None, [f"data_dir={tmp_path}"], env={})
    status.run(Namespace(format="text"), config)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("FAILING since ") and out[0].endswith(
        "(1 failed batch run): ForwardError: AMQP connection to amqp://127.0.0.1:5672 failed: "
        "amqp:connection:framing-error: Connection refused (6 attempts)"), out
    assert out[1].startswith("last batch (")
    status.run(Namespace(format="json"), config)
    got = json.loads(capsys.readouterr().out)
    assert got["failure"]["failures"] == 1 and got["last_batch"]["batch_id"] == 0 and "failure" not in got["last_batch"]


# ---------------------------------------------------------------- supervisor backoff


class _FailingQuery:
    """A query that fails at once; ``progressed``: it completed a batch first."""

    def __init__(self, progressed: bool) -> None:
        self.progressed = progressed
        self.isActive = True
        self.status = {"isTriggerActive": False}

    @property
    def lastProgress(self):
        return {"batchId": 3} if self.progressed else None

    def awaitTermination(self, timeout=None):
        from pyspark.errors import StreamingQueryException

        self.isActive = False
        raise StreamingQueryException(message="RuntimeError: peer down (test)")

    def stop(self):
        self.isActive = False


class _RecordingStop(threading.Event):
    """The runner's stop event: records each backoff wait instead of waiting."""

    def __init__(self, waits: int) -> None:
        super().__init__()
        self.delays: list[float] = []
        self.waits = waits

    def wait(self, timeout=None):
        self.delays.append(timeout)
        if len(self.delays) >= self.waits:
            self.set()
        return self.is_set()


def _edge():
    return SimpleNamespace(alive=True, failed=None, error=None, stop=lambda *a: None)


def test_backoff_starts_over_after_a_restarted_query_completed_a_batch(monkeypatch):
    from bridge.config import Config
    from bridge.job import pipeline
    from bridge.commands.runner import BACKOFF_S, Runner

    plan = [False] * 6 + [True] + [False] * 2  # 6 outages in a row, a batch completes, 2 more outages
    runs = iter(plan)
    monkeypatch.setattr(pipeline, "start_query", lambda spark, config, **kw: _FailingQuery(next(runs)))
    runner = Runner(Config())
    runner._stop = _RecordingStop(len(plan))
    assert runner._supervise(None, _edge()) == 0
    assert BACKOFF_S == (1.0, 2.0, 5.0, 10.0, 30.0)
    assert runner._stop.delays == [1.0, 2.0, 5.0, 10.0, 30.0, 30.0, 1.0, 2.0, 5.0]


def test_stop_after_batch_returns_when_the_batch_it_waits_for_refuses_to_start():
    # A stop was requested while the trigger was starting a batch: the batch
    # raises StopRequested and the query ends with it; waiting must not raise.
    from pyspark.errors import StreamingQueryException

    from bridge.job.pipeline import stop_after_batch

    class Starting(_FailingQuery):
        def __init__(self):
            super().__init__(progressed=True)
            self.status = {"isTriggerActive": True}

        def awaitTermination(self, timeout=None):
            self.isActive = False
            raise StreamingQueryException(message="StopRequested: stop requested: batch 4 runs again (test)")

    q = Starting()
    stop_after_batch(q, timeout=5)
    assert not q.isActive


# ---------------------------------------------------------------- real Spark: restarts


@pytest.mark.spark
def test_restarted_query_has_one_listener_and_reports_each_batch_once(spark, tmp_path, monkeypatch, caplog):
    """The first batch fails in forwarding; ``lakegate run``'s supervisor
    restarts the query. Every batch is then logged once, with its real
    numbers, and the status file's totals count each batch once."""
    from bridge.amqp import sink
    from bridge.capture import CaptureLog
    from bridge.config import load_config
    from bridge.commands import runner as runner_mod
    from bridge.job import pipeline
    from bridge.commands.runner import Runner
    from tests.job.frames import append_publish

    caplog.set_level(logging.INFO, logger="bridge.job.progress")
    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2", "amqp.url=amqp://127.0.0.1:1",
                             "tables.engine=delta-rs", "job.trigger_interval_s=0.2"], env={})
    calls: list[int] = []

    def forward(frames, batch_id, *, config, aligned=False, **driver):  # rows, table: the driver path's
        calls.append(batch_id)
        if len(calls) == 1:
            raise RuntimeError("AMQP peer down (test)")
        return {"accepted": driver["rows"] if frames is None else frames.count()}

    monkeypatch.setattr(sink, "forward_batch", forward)
    monkeypatch.setattr(runner_mod, "BACKOFF_S", (0.1,))
    jvm_listeners = len(spark.streams._jsqm.listListeners())  # noqa: SLF001 - no public API lists them

    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    runner = Runner(cfg)
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(runner._supervise(spark, _edge())), daemon=True)
    try:
        for a in [append_publish(log, f"c{i % 3}", f"dev/{i % 4}", b"v%d" % i, retain=i % 2 == 0) for i in range(30)]:
            a.wait(10)
        thread.start()
        wait_for(lambda: (read_status(tmp_path) or {}).get("batch_id") == 0, timeout=180, what="batch 0 after the restart")
        for a in [append_publish(log, "c9", "dev/x", b"w%d" % i) for i in range(20)]:
            a.wait(10)
        wait_for(lambda: (read_status(tmp_path) or {}).get("totals", {}).get("input_rows") == 50, timeout=120,
                 what="the second 20 records to be reported")
        ours = [lst for s, lst in pipeline._listeners if s is spark]
        assert len(ours) == 1, "one progress listener for the checkpoint, however often the query restarts"
        assert len(spark.streams._jsqm.listListeners()) == jvm_listeners + 1  # noqa: SLF001
    finally:
        runner.request_stop()
        thread.join(120)
        log.close()
        pipeline.release(spark)
    assert done == [0]
    assert calls[0] == 0 and calls.count(0) == 2, calls  # batch 0 failed once, then ran again
    assert len(spark.streams._jsqm.listListeners()) == jvm_listeners  # noqa: SLF001 - release removed it
    lines = [r.getMessage() for r in caplog.records if r.name == "bridge.job.progress" and r.getMessage().startswith("batch ")]
    per_batch = Counter(int(re.match(r"batch (\d+):", x).group(1)) for x in lines)
    assert per_batch and set(per_batch.values()) == {1}, lines
    assert all(re.search(r"forwarded [1-9]", x) for x in lines), lines  # no zeros from a stale listener
    st = read_status(tmp_path)
    assert st["totals"]["input_rows"] == st["totals"]["messages"] == st["totals"]["forwarded"] == 50
    assert st["totals"]["batches"] == len(per_batch)


def test_query_stopped_is_logged_once_whether_or_not_the_bus_delivers_the_end_in_time(listener, caplog):
    """Under spark-submit the driver exits right after the query stops; the
    listener bus's end event can come too late, and "query stopped" was lost.
    ended() waits for it, else says it itself; never twice."""
    caplog.set_level(logging.INFO, logger="bridge.job.progress")
    # this test's lines only: a real query of an earlier test in this
    # process can have its end delivered late by Spark's listener bus (seen
    # under load), on a thread of its own, to a listener of its own
    threads = {threading.get_ident()}

    def stopped_lines() -> int:
        return sum(r.getMessage() == "query stopped" and r.thread in threads for r in caplog.records)

    listener.onQueryTerminated(_terminated(None))  # the bus was first
    listener.ended("r-1", timeout=0.01)
    assert stopped_lines() == 1
    caplog.clear()
    listener.ended("r-2", timeout=0.01)  # the bus is late: ended() says it
    listener.onQueryTerminated(SimpleNamespace(id="q-1", runId="r-2", exception=None))
    assert stopped_lines() == 1
    caplog.clear()
    late = threading.Timer(0.2, listener.onQueryTerminated, [SimpleNamespace(id="q-1", runId="r-3", exception=None)])
    late.start()
    threads.add(late.ident)
    listener.ended("r-3", timeout=10)  # waits for the bus's line
    late.join()
    assert stopped_lines() == 1


def test_quarantined_rows_by_rule_add_up_and_observers_see_each_batch(listener, tmp_path):
    import dataclasses

    from bridge.job import progress

    seen = []
    progress.BATCH_OBSERVERS.append(seen.append)
    try:
        for batch, by_rule in enumerate([{"MQTT-3.3.1-4": 2}, {"MQTT-3.3.1-4": 1, "MQTT-3.3.2-2": 3}]):
            st = _stats(batch, 1, quarantined=sum(by_rule.values()))
            st.tables = dataclasses.replace(st.tables, quarantined_by_rule=tuple(sorted(by_rule.items())))
            listener.record(st)
            listener.report(_progress(batch, 1 + sum(by_rule.values())))
    finally:
        progress.BATCH_OBSERVERS.remove(seen.append)
    st = read_status(tmp_path)
    assert st["quarantined_by_rule"] == {"MQTT-3.3.1-4": 1, "MQTT-3.3.2-2": 3}
    assert st["totals_quarantined_by_rule"] == {"MQTT-3.3.1-4": 3, "MQTT-3.3.2-2": 3}
    assert [d["batch_id"] for d in seen] == [0, 1]
    assert progress.latest_status(tmp_path)["batch_id"] == 1
