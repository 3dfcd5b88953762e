"""`lakegate run` when its Spark JVM dies alone (issue 21, item 3).

The kernel's out-of-memory killer picks the biggest process, which is the
JVM child of `lakegate run`. The edge, in the Python process, must keep
accepting, capturing and acknowledging; the job comes back on a new session
and resumes from its checkpoint; one log line says what happened.
"""

import os
import signal
from pathlib import Path

import pytest

from bridge.tables.deltars import DeltaRsEngine
from tests.job.test_run import Run, _client
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.slow]


def _java_children(pid: int) -> list[int]:
    """The java processes among ``pid``'s children (from /proc, no psutil)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    java = []
    for k in kids:
        try:
            exe = Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if exe.endswith(b"java"):
            java.append(k)
    return java


def _rows(tables: Path) -> int:
    try:
        return DeltaRsEngine(tables).arrow("messages").num_rows
    except Exception:  # not created yet
        return 0


def _publish_acked(port: int, cid: str, topic: str, prefix: bytes, n: int = 5) -> None:
    """``n`` QoS 1 messages from a new client, each acknowledged (PUBACK: captured durably)."""
    c = _client(port, cid)
    for i in range(n):
        assert c.publish(topic, prefix + b"%d" % i, qos=1).wait_for_publish(10) is None
    c.loop_stop()
    c.disconnect()


def test_killing_the_spark_jvm_keeps_the_edge_capturing_and_the_job_resumes(tmp_path):
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs /proc to find the JVM child")
    run = Run(tmp_path, "amqp.url=")
    try:
        wait_for(lambda: any("job started" in e for e in run.err), timeout=180, what="the job to start")
        _publish_acked(run.port, "dev-before", "plant/before", b"b")
        tables = tmp_path / "tables"
        wait_for(lambda: _rows(tables) >= 5, timeout=120, what="the first rows")

        java = wait_for(lambda: _java_children(run.proc.pid), timeout=10, what="the JVM child")
        assert len(java) == 1, java
        os.kill(java[0], signal.SIGKILL)
        # (a zombie has an empty cmdline: gone from the list once dead)
        wait_for(lambda: java[0] not in _java_children(run.proc.pid), timeout=30, what="the JVM to die")

        # The edge still accepts, captures and acknowledges (PUBACK) while the job is down.
        _publish_acked(run.port, "dev-after", "plant/after", b"a")
        assert run.proc.poll() is None, "".join(run.err)[-3000:]

        wait_for(lambda: [e for e in run.err if "the Spark JVM" in e], timeout=30, what="the line naming the cause")
        cause = [e for e in run.err if "the Spark JVM" in e]
        assert len(cause) == 1 and f"(pid {java[0]}) killed by SIGKILL" in cause[0], cause
        # The job resumes on a new JVM and the messages captured meanwhile land.
        wait_for(lambda: _rows(tables) >= 10, timeout=240, what="the rows captured while the JVM was down")
        assert len(_java_children(run.proc.pid)) == 1
        assert not any("Traceback" in e for e in run.err), "".join(run.err)[-3000:]
    finally:
        code = run.stop()
    assert code == 0, "".join(run.err)[-2000:]


def test_sigterm_to_the_whole_process_group_stops_cleanly_without_a_new_session(tmp_path):
    """systemd (KillMode=control-group) and `timeout` signal the JVM with the
    run: exit 0, one warning naming the JVM, no "starting a new Spark
    session" error, and nothing acknowledged lost (the next run writes it)."""
    run = Run(tmp_path, "amqp.url=", new_session=True)
    try:
        wait_for(lambda: any("job started" in e for e in run.err), timeout=180, what="the job to start")
        _publish_acked(run.port, "dev-term", "plant/term", b"t")
        os.killpg(run.proc.pid, signal.SIGTERM)
        assert run.proc.wait(90) == 0, "".join(run.err)[-3000:]
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(30)
    err = "".join(run.err)
    assert "starting a new Spark session" not in err, err[-3000:]
    jvm_lines = [e for e in run.err if "the Spark JVM" in e]
    assert len(jvm_lines) <= 1, jvm_lines  # the JVM may also have finished first
    if jvm_lines:
        assert "while lakegate run was stopping" in jvm_lines[0] and "WARNING" in jvm_lines[0], jvm_lines
    again = Run(tmp_path, "amqp.url=")
    try:
        wait_for(lambda: _rows(tmp_path / "tables") >= 5, timeout=180, what="the acknowledged messages in the table")
    finally:
        assert again.stop() == 0, "".join(again.err)[-3000:]
