"""The job's commands as a user runs them: ``lakegate process`` (``--once``,
Ctrl-C), ``lakegate status``, ``jobs/process_packets.py``, and ``lakegate
run``'s start-up when the session cannot be built."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.job.progress import committed_offsets, read_status
from bridge.ports import free_loopback_port
from bridge.tables.deltars import DeltaRsEngine
from tests.conftest import RABBITMQ, child_env
from tests.job.frames import append_publish, append_raw
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: a PUBLISH with both QoS bits set [MQTT-3.3.1-4]: quarantined
MALFORMED = bytes([0x36, 0x06, 0, 1]) + b"x" + bytes([0, 1, 0])


def _env() -> dict[str, str]:
    return child_env()


def _lakegate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=timeout)


def _sets(data_dir, *more: str) -> list[str]:
    out = []
    for s in (f"data_dir={data_dir}", "capture.partitions=2", "spark.master=local[2]", *more):
        out += ["--set", s]
    return out


def _write(cfg, records) -> None:
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    try:
        acks = []
        for conn, topic, payload, retain in records:
            if topic is None:
                acks.append(append_raw(log, conn, MALFORMED))
            else:
                acks.append(append_publish(log, conn, topic, payload, retain=retain))
        for a in acks:
            a.wait(10)
    finally:
        log.close()


# ---------------------------------------------------------------- status


def test_status_without_a_job(tmp_path):
    out = _lakegate("status", "--set", f"data_dir={tmp_path}", timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == [
        "no batch reported yet (is the job running? lakegate process / lakegate run)",
        f"checkpoint: {tmp_path}/checkpoints/lakegate, committed batch: none",
        "lag now: unknown (no capture log)",
    ]


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.broker
@pytest.mark.slow
def test_process_once_then_status_shows_the_batch_and_the_lag_now(rabbitmq, tmp_path):
    sets = _sets(tmp_path, f"amqp.url={rabbitmq}")
    cfg = load_config(None, [sets[i + 1] for i in range(0, len(sets), 2)], env={})
    _write(cfg, [("c0", "st/a", b"1", True), ("c0", "st/b", b"2", True), ("c0", "st/c", b"3", True),
                 ("c0", "st/b", b"", True)]  # retained: +st/a +st/c, st/b set then cleared
           + [("c1", "t/x", b"m%d" % i, False) for i in range(5)]
           + [("c2", None, None, False)])  # quarantined
    # with the SQL endpoint on (a port of its own: child_env turns it off)
    proc = _lakegate("process", "--once", *sets, "--set", f"sql.connect_port={free_loopback_port()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = r"batch 0: 10 rows, \d+ rows/s, \d+ ms; retained \+2/-1; quarantined 1; forwarded 9; lag 0"
    logged = [x.split("bridge.job.progress: ", 1)[1] for x in proc.stderr.splitlines() if "bridge.job.progress: batch " in x]
    assert len(logged) == 1 and re.fullmatch(want, logged[0]), logged
    # the SQL endpoint's catalog objects come after the query started, and a short --once run waits for them
    lines = proc.stderr.splitlines()
    started = [i for i, x in enumerate(lines) if "bridge.job.pipeline: job started:" in x]
    served = [i for i, x in enumerate(lines) if "sql: Spark Connect endpoint on" in x]
    assert len(started) == 1 and len(served) == 1 and started[0] < served[0], proc.stderr[-3000:]

    st = read_status(tmp_path)
    assert st["batch_id"] == 0 and st["input_rows"] == 10 and st["messages"] == 9
    assert st["totals"] == {"batches": 1, "input_rows": 10, "messages": 9, "quarantined": 1, "forwarded": 9,
                            "forward_expired": 0, "retained_upserts": 2, "retained_deletes": 1,
                            "forward_unforwardable": 0}
    assert st["quarantined_by_rule"] == st["totals_quarantined_by_rule"] and sum(st["quarantined_by_rule"].values()) == 1
    log_end = {str(p): n for p, n in enumerate(_durable(cfg))}
    assert st["end_offsets"] == log_end and st["lag"] == 0

    out = _lakegate("status", *sets, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second, third = out.stdout.splitlines()
    assert re.fullmatch(r"last batch \(\d+s ago\): " + want, first), first
    assert second == f"checkpoint: {tmp_path}/checkpoints/lakegate, committed batch: 0"
    assert third == f"lag now: 0 records (log end {log_end}, committed {log_end})"

    _write(cfg, [("c3", "t/y", b"later", False)] * 3)  # captured, not processed yet
    out = _lakegate("status", "--format", "json", *sets, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["committed_batch"] == 0 and got["committed_offsets"] == log_end
    assert got["lag"] == 3 and sum(got["log_end_offsets"].values()) == 13
    assert got["last_batch"]["batch_id"] == 0 and got["last_batch"]["lag"] == 0
    text = _lakegate("status", *sets, timeout=60).stdout.splitlines()
    assert text[2].startswith("lag now: 3 records (log end ")


def _durable(cfg) -> list[int]:
    from bridge.capture import LogReader

    return LogReader(cfg.capture_dir).durable_offsets()


# ---------------------------------------------------------------- Ctrl-C


class GatedProxy:
    """A TCP proxy to RabbitMQ that holds what clients send until ``gate`` is set:
    a forwarding batch is in progress, deterministically, until the test says so."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.gate = threading.Event()
        self.accepted = 0
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            up = socket.create_connection(self.upstream)
            self._socks += [client, up]
            threading.Thread(target=self._pump, args=(client, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gated: bool) -> None:
        if gated:
            self.gate.wait()
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.gate.set()
        self.server.close()
        for s in self._socks:
            s.close()


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.broker
@pytest.mark.slow
def test_ctrl_c_lets_the_running_batch_finish(rabbitmq, tmp_path):
    """SIGINT arrives while batch 0 is forwarding (its tables are written):
    the batch finishes (forwarded, checkpoint committed), no other starts,
    exit 0; the tables hold exactly the committed batches."""
    proxy = GatedProxy(RABBITMQ)
    sets = _sets(tmp_path, f"amqp.url=amqp://guest:guest@127.0.0.1:{proxy.port}", "job.trigger_interval_s=0.5")
    cfg = load_config(None, [sets[i + 1] for i in range(0, len(sets), 2)], env={})
    _write(cfg, [(f"c{i % 3}", f"dev/{i % 4}/status", b"v%d" % i, i % 2 == 0) for i in range(40)])
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "process", *sets], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    try:
        def forwarding() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"lakegate process exited {proc.returncode}: {''.join(err)[-3000:]}")
            return proxy.accepted > 0

        wait_for(forwarding, timeout=240, what="batch 0 to start forwarding")
        assert committed_offsets(tmp_path / "checkpoints" / "lakegate") == (None, None)  # batch 0 is running
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: proc.poll() is not None or any("stopping:" in x for x in err), timeout=60,
                 what="the process to take the signal")
        proxy.gate.set()  # the peer answers: batch 0 can finish now
        code = proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proxy.close()
    text = "".join(err)
    assert code == 0, text[-3000:]
    assert "job failed" not in text and "terminated with error" not in text, text[-3000:]
    batch, end = committed_offsets(tmp_path / "checkpoints" / "lakegate")
    assert batch == 0, f"batch 0 was broken off: {text[-3000:]}"
    started = max(int(p.name) for p in (tmp_path / "checkpoints" / "lakegate" / "offsets").glob("[0-9]*"))
    assert started == batch  # no later batch was started and left half done
    msgs = DeltaRsEngine(cfg.tables_dir).arrow("messages")
    coords = sorted(zip(msgs["partition"].to_pylist(), msgs["offset"].to_pylist()))
    assert coords == sorted((int(p), o) for p, n in end.items() for o in range(n))  # exactly the committed batch
    st = read_status(tmp_path)
    assert st["batch_id"] == 0 and st["forwarded"] == 40


# ---------------------------------------------------------------- spark-submit entry point


def _bad_config(tmp_path) -> Path:
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\ntrigger_interval_s = "fast"\n')
    return bad


@pytest.mark.subprocess
def test_job_script_bad_config_is_exit_2_with_one_line(tmp_path):
    bad = _bad_config(tmp_path)
    out = subprocess.run([sys.executable, "jobs/process_packets.py", "--config", str(bad)], capture_output=True,
                         text=True, env=_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("lakegate: config error: job.trigger_interval_s: ")
    assert f"(from {bad})" in lines[0]
    # the same line as the lakegate command gives
    cli = _lakegate("process", "--config", str(bad), timeout=120)
    assert (cli.returncode, cli.stderr) == (2, out.stderr)


@pytest.mark.subprocess
@pytest.mark.spark
@pytest.mark.slow
def test_job_script_bad_config_under_spark_submit_is_exit_2(tmp_path):
    bad = _bad_config(tmp_path)
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**_env(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = subprocess.run([str(submit), "--master", "local[1]", "jobs/process_packets.py", "--config", str(bad)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    # spark-submit's PythonRunner merges the driver's stderr into its stdout
    mine = [x for x in (out.stdout + out.stderr).splitlines() if x.startswith("lakegate:")]
    assert len(mine) == 1 and "job.trigger_interval_s" in mine[0] and str(bad) in mine[0], out.stderr[-3000:]


# ---------------------------------------------------------------- lakegate run start-up


def test_run_that_cannot_build_its_session_leaves_no_pid_file_and_stops_the_edge(tmp_path, monkeypatch):
    from bridge.commands.runner import RUN_PID_FILE, Runner, running_run
    from bridge.spark import session

    cfg = load_config(None, [f"data_dir={tmp_path}", "edge.port=0", "amqp.url="], env={})
    seen: list[bool] = []

    def no_session(*a, **kw):
        seen.append((tmp_path / RUN_PID_FILE).exists())  # the edge is up and run.pid written by now
        raise RuntimeError("no session (test)")

    monkeypatch.setattr(session, "build_session", no_session)
    errors: list[BaseException] = []

    def main() -> None:  # not the main thread: Runner leaves pytest's signal handlers alone
        try:
            Runner(cfg).run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)

    t = threading.Thread(target=main)
    t.start()
    t.join(120)
    assert not t.is_alive()
    assert seen == [True]
    assert [str(e) for e in errors] == ["no session (test)"]
    assert not (tmp_path / RUN_PID_FILE).exists() and running_run(cfg) is None
    CaptureLog.open(cfg.capture_dir).close()  # the edge closed its capture log (writer lock released)
