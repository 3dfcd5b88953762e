"""Exactly-once table writes: the job is killed after the tables committed a
batch and before Spark's checkpoint committed it; the restarted job re-runs
the batch, the tables skip it (app transaction), and nothing is duplicated or
missing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.tables.deltars import DeltaRsEngine
from tests.job.frames import append_publish, append_raw
from tests.conftest import child_env

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _process(data_dir, failpoints=None):
    env = child_env()
    if failpoints:
        env["LAKEGATE_FAILPOINTS"] = failpoints
    args = [sys.executable, "-m", "bridge", "process", "--once", "--set", f"data_dir={data_dir}",
            "--set", "amqp.url=", "--set", "spark.master=local[2]", "--set", "job.max_records_per_trigger=40"]
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def _write(cfg, start, n):
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    acks = []
    for i in range(start, start + n):
        conn = f"c{i % 3}"
        if i % 10 == 9:  # a malformed frame: both QoS bits set [MQTT-3.3.1-4]
            acks.append(append_raw(log, conn, bytes([0x36, 0x06, 0, 1]) + b"x" + bytes([0, 1, 0])))
        else:
            acks.append(append_publish(log, conn, f"dev/{i % 7}/status", b"v%d" % i, retain=True, packet_id=1 + i % 500))
    for a in acks:
        a.wait(10)
    log.close()


def test_kill_after_tables_commit_before_checkpoint_commit_no_duplicate_no_gap(tmp_path):
    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2"], env={})
    _write(cfg, 0, 60)
    first = _process(tmp_path, failpoints="after-tables-commit@0")
    assert first.returncode == -9, first.stderr[-2000:]  # SIGKILLed at the failpoint
    engine = DeltaRsEngine(cfg.tables_dir)
    committed = engine.arrow("messages").num_rows
    assert committed > 0  # batch 0 reached the tables...
    commits = list((tmp_path / "checkpoints" / "lakegate" / "commits").glob("[0-9]*"))
    assert commits == []  # ...but not Spark's checkpoint

    _write(cfg, 60, 30)  # the edge keeps capturing meanwhile
    second = _process(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "already has batch 0" in second.stderr  # the replayed batch was recognised and skipped

    msgs = engine.arrow("messages")
    coords = list(zip(msgs["partition"].to_pylist(), msgs["offset"].to_pylist()))
    assert len(coords) == len(set(coords)), "duplicate rows"
    assert len(coords) == 90 - 9  # every valid publish once
    quarantine = engine.arrow("quarantine")
    assert quarantine.num_rows == 9 and set(quarantine["rule"].to_pylist()) == {"MQTT-3.3.1-4"}
    # retained: the latest publish per topic by capture order
    latest = {}
    for row in msgs.to_pylist():
        if row["seq"] > latest.get(row["topic"], (-1, None))[0]:
            latest[row["topic"]] = (row["seq"], row["payload"])
    retained = {r["topic"]: r["payload"] for r in engine.arrow("retained").to_pylist()}
    assert retained == {t: p for t, (s, p) in latest.items()}
