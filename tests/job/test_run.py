"""`lakegate run` as a user runs it: one process with the edge and the job.

* an unreachable AMQP peer is said in one line, capture goes on, and
  forwarding (live, the default, and by the job) catches up when the peer
  appears (nothing lost);
* with ``edge.ack_after = "forward"`` the PUBACK waits until the peer
  accepted the forwarded message;
* Ctrl-C (SIGINT) stops cleanly: exit 0, the capture log is closed.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from bridge.capture import CaptureLog, LogReader
from bridge.config import load_config
from bridge.tables.deltars import DeltaRsEngine
from tests.amqp.rabbitnode import RabbitNode, find_rabbitmq
from tests.amqp.test_outage import declare_durable_queue, receive_all
from tests.waiting import wait_for
from tests.conftest import child_env

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path_factory):
    if find_rabbitmq() is None:
        pytest.skip("no RabbitMQ installation to start a private node from (scripts/services up installs it)")
    n = RabbitNode(tmp_path_factory.mktemp("rabbit"))  # not started: the peer is unreachable
    yield n
    n.close()


class Run:
    """A `lakegate run` subprocess; its stdout lines are collected."""

    def __init__(self, data_dir, *sets: str, new_session: bool = False) -> None:
        env = child_env()
        args = [sys.executable, "-m", "bridge", "run", "--set", f"data_dir={data_dir}", "--set", "edge.port=0",
                "--set", "spark.master=local[2]", "--set", "job.trigger_interval_s=0.5"]
        for s in sets:
            args += ["--set", s]
        self.data_dir = data_dir
        # new_session: a process group of its own (the run and its JVM), to signal as systemd or a terminal does
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                                     start_new_session=new_session)
        self.lines: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True).start()
        line = wait_for(lambda: next((x for x in self.lines if "edge on mqtt://" in x), None) or self._dead(),
                        timeout=120, what="lakegate run to start its edge")
        self.port = int(re.search(r"mqtt://127\.0\.0\.1:(\d+)", line).group(1))

    def _dead(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"lakegate run exited {self.proc.returncode}: {''.join(self.err)[-2000:]}")
        return None

    @staticmethod
    def _pump(stream, out):
        for line in stream:
            out.append(line)

    def stop(self, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout)


def _status(data_dir) -> list[str]:
    env = child_env()
    out = subprocess.run([sys.executable, "-m", "bridge", "status", "--set", f"data_dir={data_dir}"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    return out.stdout.splitlines()


def _client(port, cid):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _queue_while_down(node: RabbitNode, prefix: str) -> str:
    """A durable queue on the (stopped) private node: declared on a brief
    start, then the node stops again. The queue exists from the moment the
    peer appears, so no forwarded message can meet a missing queue (RabbitMQ
    3.x accepts a message to ``/amq/queue/<missing>`` and drops it)."""
    queue = f"{prefix}{uuid.uuid4().hex[:8]}"
    node.start()
    declare_durable_queue(node.url, queue)
    node.stop()
    return queue


def _publish_ids(data_dir):
    """lakegate-id of every PUBLISH in the capture log."""
    reader = LogReader(Path(data_dir) / "capture")
    ends = reader.durable_offsets()
    return {f"{reader.stream}/{p}/{r.offset}" for p in range(reader.partitions)
            for r in reader.records(p, 0, ends[p]) if r.value[0] >> 4 == 3}


@pytest.mark.parametrize("forward_by", ["auto", "job"])
def test_unreachable_peer_one_line_capture_continues_forwarding_catches_up_then_ctrl_c(node, tmp_path, forward_by):
    queue = _queue_while_down(node, "lgrun")
    run = Run(tmp_path, f"amqp.url={node.url}", "amqp.address_template=/amq/queue/{routing_key}",
              "amqp.max_retries=1", "amqp.retry_backoff_s=0.2", f"amqp.forward_by={forward_by}")
    try:
        wait_for(lambda: any(x.startswith("lakegate run: AMQP peer") for x in run.lines), timeout=30, what="the peer line")
        notice = [x for x in run.lines if x.startswith("lakegate run: AMQP peer")]
        assert notice == [f"lakegate run: AMQP peer amqp://guest:****@127.0.0.1:{node.port} is unreachable; "
                          "capturing continues and forwarding catches up when it appears\n"]
        c = _client(run.port, "dev-1")
        for i in range(20):
            assert c.publish(queue, b"m%d" % i, qos=1).wait_for_publish(10) is None  # PUBACK: captured
        c.loop_stop()
        c.disconnect()
        engine = DeltaRsEngine(tmp_path / "tables")
        wait_for(lambda: engine.arrow("messages").num_rows >= 20, timeout=120, what="the tables to get the messages")
        want = _publish_ids(tmp_path)
        assert len(want) == 20
        # the outage is visible: lakegate status says what fails and since when
        failing = wait_for(lambda: next((x for x in _status(tmp_path) if x.startswith("FAILING since ")), None),
                           timeout=60, what="lakegate status to show the failure")
        assert f"connection to amqp://127.0.0.1:{node.port} failed" in failing, failing
        node.start()  # the peer appears, with the queue
        got = receive_all(node.url, queue, want, timeout=180)
        assert want <= set(got), f"missing after catch-up: {sorted(want - set(got))[:5]}"
        if forward_by == "job":  # the batch failed and runs again
            assert any("restarting from the checkpoint" in e for e in run.err)
        else:  # the live forwarder sent the range again; the job's batches never failed
            assert any("live forwarding: a range was not forwarded" in e for e in run.err)
            assert not any("restarting from the checkpoint" in e for e in run.err)
        wait_for(lambda: not any(x.startswith("FAILING") for x in _status(tmp_path)), timeout=60,
                 what="lakegate status to drop the failure once forwarding works again")
        if forward_by == "auto":
            lines = _status(tmp_path)
            assert any(x.startswith("forwarding live: ") and "; 0 records not forwarded yet" in x for x in lines), lines
        # every lakegate line, the executors' Python workers' too, carries a timestamp
        stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ bridge[.\w]*: ")
        ours = [e for e in run.err if re.search(r" bridge[.\w]*: |^AMQP ", e)]
        assert any("bridge.amqp: AMQP forwarding trouble: connection to" in e for e in ours), "".join(run.err)[-3000:]
        assert all(stamp.match(e) for e in ours), [e for e in ours if not stamp.match(e)][:5]
    finally:
        code = run.stop()
    assert code == 0, "".join(run.err)[-2000:]
    CaptureLog.open(tmp_path / "capture").close()  # the writer lock was released: the log was closed


def test_ack_after_forward_holds_puback_until_the_peer_accepted(node, tmp_path):
    queue = _queue_while_down(node, "lgfwd")
    run = Run(tmp_path, f"amqp.url={node.url}", "amqp.address_template=/amq/queue/{routing_key}",
              "edge.ack_after=forward", "amqp.max_retries=1", "amqp.retry_backoff_s=0.2")
    try:
        c = _client(run.port, "dev-2")
        info = c.publish(queue, b"hold me", qos=1)
        cfg = load_config(None, [f"data_dir={tmp_path}"], env={})
        wait_for(lambda: len(_publish_ids(cfg.data_path)) == 1, timeout=30, what="the message to be captured")
        # captured and durable, but the peer is down: no PUBACK within 8 s
        info.wait_for_publish(timeout=8)
        assert not info.is_published(), "PUBACK before the AMQP peer accepted the message"
        node.start()  # the peer appears, with the queue
        wait_for(info.is_published, timeout=180, what="PUBACK after the peer accepted")
        got = receive_all(node.url, queue, _publish_ids(cfg.data_path), timeout=30)
        assert len(got) >= 1
        c.loop_stop()
        c.disconnect()
    finally:
        code = run.stop()
    assert code == 0, "".join(run.err)[-2000:]
