"""Stopping the job under spark-submit (issue 21, item 14).

Under spark-submit the JVM is the parent process: SIGTERM to spark-submit (a
scheduler stopping the job) and SIGINT to its process group (Ctrl-C) reach
the JVM, which used to shut down under the running batch and exit 143 or
130. Now the batch finishes, "query stopped" is logged and the exit code is
0, as with ``lakegate process``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.job.progress import committed_offsets, read_status
from bridge.tables.deltars import DeltaRsEngine
from tests.conftest import RABBITMQ
from tests.job.test_process_cmd import ROOT, GatedProxy, _env, _sets, _write
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.broker, pytest.mark.slow]


@pytest.mark.parametrize("how", ["sigterm-to-spark-submit", "sigint-to-process-group"])
def test_signal_to_spark_submit_lets_the_batch_finish_and_exits_0(how, rabbitmq, tmp_path):
    proxy = GatedProxy(RABBITMQ)  # holds forwarding: batch 0 is running when the signal comes
    sets = _sets(tmp_path, f"amqp.url=amqp://guest:guest@127.0.0.1:{proxy.port}", "job.trigger_interval_s=0.5")
    cfg = load_config(None, [sets[i + 1] for i in range(0, len(sets), 2)], env={})
    _write(cfg, [(f"c{i % 3}", f"dev/{i % 4}/status", b"v%d" % i, i % 2 == 0) for i in range(30)])
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**_env(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.Popen([str(submit), "--master", "local[2]", "jobs/process_packets.py", *sets],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    try:
        def forwarding() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"spark-submit exited {proc.returncode}: {''.join(out)[-3000:]}")
            return proxy.accepted > 0

        wait_for(forwarding, timeout=300, what="batch 0 to start forwarding")
        assert committed_offsets(tmp_path / "checkpoints" / "lakegate") == (None, None)  # batch 0 is running
        if how == "sigterm-to-spark-submit":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        wait_for(lambda: proc.poll() is not None or any("stopping: the current batch finishes" in x for x in out),
                 timeout=60, what="the job to take the signal")
        proxy.gate.set()  # the peer answers: batch 0 can finish now
        code = proc.wait(180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        proxy.close()
    text = "".join(out)
    assert code == 0, text[-3000:]
    lines = text.splitlines()
    assert any(x.endswith("INFO bridge.job.progress: query stopped") for x in lines), text[-3000:]
    assert "job failed" not in text, text[-3000:]
    batch, end = committed_offsets(tmp_path / "checkpoints" / "lakegate")
    assert batch == 0, f"batch 0 was broken off: {text[-3000:]}"
    msgs = DeltaRsEngine(cfg.tables_dir).arrow("messages")
    assert msgs.num_rows == sum(end.values()) == 30
    assert read_status(tmp_path)["forwarded"] == 30
