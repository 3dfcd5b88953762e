"""``lakegate run`` with the edge in a supervised process of its own
(``edge.own_process``, the default; issue 38, item 8).

* The edge is a child of the run with its own pid; run.pid names both; the
  run's one metrics endpoint serves the edge's families and checks.
* SIGKILL of the edge (what the out-of-memory killer does): the run logs
  one line and starts it again on the same port; what it acknowledged is
  in the tables, nothing twice.
* SIGKILL of the run: the edge sees its stdin close and stops; no edge
  outlives its run, and the capture log's writer lock is free again.
* ``edge.own_process = false``: the edge is a thread of the run, as before.
* The configuration crosses to the child exactly: values, where each came
  from (``edge.allow_anonymous`` set by the user or default matters), and
  the directories relative paths resolve against.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.config_render import config_from_wire, config_to_wire
from bridge.ports import free_loopback_port
from bridge.tables.deltars import DeltaRsEngine
from tests.job.test_run import Run
from tests.waiting import holds_for, wait_for


def _pid_file(data_dir) -> dict:
    return json.loads((data_dir / "run.pid").read_text())


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(x for x in fh if x.startswith("PPid:")).split()[1])


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[16])


def _publish(port: int, cid: str, topic: str, n: int) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for i in range(n):
            assert c.publish(topic, b"m%d" % i, qos=1).wait_for_publish(10) is None  # PUBACK: captured
    finally:
        c.loop_stop()
        c.disconnect()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited: only its parent's wait is missing
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


# ---------------------------------------------------------------- the configuration's crossing


def test_config_crosses_to_the_child_with_values_sources_and_bases(tmp_path):
    (tmp_path / "lg.toml").write_text('data_dir = "d"\n[edge]\npassword_file = "users.pw"\n')
    cfg = load_config(tmp_path / "lg.toml", ["edge.host=0.0.0.0", "amqp.url=amqp://u:secret@h:5672"],
                      env={"LAKEGATE_EDGE_MAX_TOPIC_LEVELS": "50"})
    back = config_from_wire(config_to_wire(cfg))
    assert back.as_dict() == cfg.as_dict()
    assert back.amqp.url == "amqp://u:secret@h:5672"  # the child needs the real secret, not the mask
    assert back.sources == cfg.sources and back.sources["edge.max_topic_levels"] == \
        "environment LAKEGATE_EDGE_MAX_TOPIC_LEVELS"
    assert "edge.allow_anonymous" not in back.sources  # the default stays a default (bridge.edge.exposure)
    assert back.data_path == cfg.data_path == tmp_path / "d"
    assert back.edge.password_file == str(tmp_path / "users.pw")


def test_live_forwarder_is_woken_by_the_edge_process_pipe(tmp_path):
    from bridge.amqp.live import LiveForwarder

    cfg = load_config(None, [f"data_dir={tmp_path}", "amqp.url=amqp://127.0.0.1:1"], env={})
    live = LiveForwarder(cfg)
    r, w = os.pipe()
    try:
        live.attach_fd(r)
        assert live._attached and not live._wake.is_set()  # noqa: SLF001 - the event the forwarder waits on
        os.write(w, b"\0")  # the edge's process made records durable
        wait_for(live._wake.is_set, timeout=5, what="the wake")  # noqa: SLF001
    finally:
        os.close(w)
        os.close(r)


# ---------------------------------------------------------------- real runs


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_lg_run_edge_process_is_supervised_restarted_after_sigkill_and_ends_with_the_run(tmp_path):
    port = free_loopback_port()
    run = Run(tmp_path, "amqp.url=", f"metrics.port={port}", new_session=True)
    try:
        info = _pid_file(tmp_path)
        edge_pid = info["edge_pid"]
        assert info["pid"] == run.proc.pid != edge_pid and _ppid(edge_pid) == run.proc.pid
        assert info["edge"] == [["127.0.0.1", run.port, False]]
        # job.run_nice: the run's own work yields the CPU to the edge
        wait_for(lambda: any("at niceness +10" in x for x in run.err), timeout=30, what="the niceness line")
        assert _nice(run.proc.pid) == 10 and _nice(edge_pid) == 0

        # the run's endpoint serves the edge's families and checks
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="watcher", protocol=mqtt.MQTTv5)
        c.connect("127.0.0.1", run.port)
        c.loop_start()
        try:
            def scrape() -> str | None:
                b = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                return b if 'lakegate_edge_connections{protocol="5"} 1.0' in b else None

            body = wait_for(scrape, timeout=30, what="the edge's connection gauge on the run's endpoint")
        finally:
            c.loop_stop()
            c.disconnect()
        assert body.count("# TYPE lakegate_capture_disk_bytes ") == 1  # the run's own, not twice
        assert "lakegate_capture_appends_total" in body and "lakegate_job_" in body
        try:
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
        except urllib.error.HTTPError as exc:  # 503 until the job's query runs: the edge's check is what counts
            health = json.loads(exc.read())
        assert health["checks"]["edge"] == {"ok": True, "detail": f"accepting connections (pid {edge_pid})"}

        _publish(run.port, "dev-1", "plant/a", 10)
        os.kill(edge_pid, signal.SIGKILL)
        line = wait_for(lambda: next((x for x in run.err if "edge: its process" in x), None), timeout=30,
                        what="the run's line about the killed edge")
        assert f"(pid {edge_pid}) killed by SIGKILL" in line and "starting it again on the same ports" in line
        new_pid = wait_for(lambda: (p := _pid_file(tmp_path).get("edge_pid")) != edge_pid and p, timeout=60,
                           what="run.pid to name the new edge process")
        assert _ppid(new_pid) == run.proc.pid and _pid_file(tmp_path)["edge"] == info["edge"]
        assert _nice(new_pid) == 0  # started again by the spawner thread, which kept priority 0
        wait_for(lambda: any(f"edge: process {new_pid} " in x for x in run.err), timeout=60,
                 what="the new edge's line")
        _publish(run.port, "dev-2", "plant/b", 10)  # the same port
        engine = DeltaRsEngine(tmp_path / "tables")
        wait_for(lambda: engine.arrow("messages").num_rows >= 20, timeout=120, what="all 20 in the tables")
        holds_for(lambda: engine.arrow("messages").num_rows == 20, 2.0,  # job.trigger_interval_s is 0.5
                  what="nothing written twice by the batches after")
        assert run.proc.poll() is None

        # SIGKILL of the run: the edge stops by itself
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(30)
        wait_for(lambda: _gone(new_pid), timeout=30, what="the edge to stop once its run is gone")
        CaptureLog.open(tmp_path / "capture").close()  # its writer lock is free
    finally:
        if run.proc.poll() is None:
            run.stop()
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)  # the run's JVM, left by the SIGKILL
        except ProcessLookupError:
            pass


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_run_edge_as_a_thread_when_own_process_is_false(tmp_path):
    run = Run(tmp_path, "amqp.url=", "edge.own_process=false")
    try:
        info = _pid_file(tmp_path)
        assert "edge_pid" not in info and info["pid"] == run.proc.pid
        assert not any("edge: process" in x for x in run.err)
        _publish(run.port, "dev-1", "plant/a", 5)
        engine = DeltaRsEngine(tmp_path / "tables")
        wait_for(lambda: engine.arrow("messages").num_rows >= 5, timeout=120, what="the 5 in the tables")
    finally:
        code = run.stop()
    assert code == 0, "".join(run.err)[-2000:]


@pytest.mark.parametrize("exit_code,failed,restart", [
    (75, "capture log failed: ... is Kafka at kafka.bootstrap_servers = '...' up?", True),  # Kafka away
    (75, None, True),              # Kafka away at start: the child's one line, no "stopped" message
    (1, "capture log failed: disk full", False),  # a failure starting again cannot mend
    (-9, None, True),              # SIGKILLed from outside
    (-9, "capture log failed: fsync", False),
    (0, None, False),              # stopped cleanly
])
def test_run_starts_its_edge_again_when_the_capture_log_did_not_answer_exit_75(exit_code, failed, restart):
    """``EdgeProcess.restartable``: a child that exited 75 (EXIT_UNAVAILABLE:
    Kafka did not answer, at start or for longer than the delivery timeout)
    is started again by the run, as one killed by a signal; one whose log
    failed otherwise is not."""
    import subprocess
    import sys

    from bridge.job.edge_process import EdgeProcess

    edge = EdgeProcess(load_config(None, [], env={}))
    try:
        code = f"import os, signal; os.kill(os.getpid(), {-exit_code})" if exit_code < 0 else \
            f"raise SystemExit({exit_code})"
        edge.proc = subprocess.Popen([sys.executable, "-c", code])
        edge.proc.wait(30)
        edge.failed = failed
        assert edge.restartable is restart
    finally:
        edge.close()
