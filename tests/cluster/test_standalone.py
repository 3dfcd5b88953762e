"""The spark-submit command of docs/job.md on a real Spark standalone cluster.

``scripts/cluster`` starts a master and two workers from the pyspark wheel on
loopback, in an environment whose ``python3`` is the system one (no pyarrow,
no lakegate): the workers of a real cluster. The job runs under
``spark-submit --master spark://...`` with the project's venv active and no
``PYSPARK_PYTHON``: the entry point must name the executors' Python itself
(before, the first batch failed on the executors with ``ModuleNotFoundError:
No module named 'pyarrow'``). A running edge takes a bounded QoS 1 load; one
worker is SIGKILLed mid-load. Then every acknowledged message is in
``messages`` exactly once and reached RabbitMQ (forwarding is at least once:
repeats are allowed there, losses are not).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.amqp.conftest import Consumer, delete_queue
from tests.e2e.test_end_to_end import _client, edge  # noqa: F401 - edge is a fixture
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.subprocess, pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

CLIENTS = 4
PER_CLIENT = 400  # 1600 messages after the warm-up, about 200 msg/s
CHUNK = 25
WARMUP = 20


def _system_env() -> dict[str, str]:
    """The environment of a machine without lakegate's venv: what the workers see."""
    drop = ("LAKEGATE_", "PYSPARK_", "VIRTUAL_ENV", "SPARK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and Path(p) != VENV_BIN]
    env["PATH"] = os.pathsep.join(path or ["/usr/bin", "/bin"])
    return env


def _submit_env() -> dict[str, str]:
    """The spark-submit environment of docs/job.md: the venv active, PYSPARK_PYTHON not set."""
    env = _system_env()
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver binds and advertises loopback only, like the cluster
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, state dir) of a master and two workers; all of it stopped afterwards, by pid."""
    state = tmp_path_factory.mktemp("cluster")
    env = {**_system_env(), "LAKEGATE_CLUSTER_DIR": str(state), "SPARK_MASTER_PORT": "0",
           "CLUSTER_WORKER_CORES": "1", "CLUSTER_WORKER_MEMORY": "1g", "CLUSTER_WAIT_S": "120",
           "SPARK_HOME": _spark_home()}
    try:
        up = subprocess.run([str(ROOT / "scripts" / "cluster"), "up", "2"], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
        assert up.returncode == 0, f"scripts/cluster up failed: {up.stderr[-3000:]}"
        url = up.stdout.strip().splitlines()[-1]
        assert url.startswith("spark://127.0.0.1:"), up.stdout
        yield url, state
    finally:
        down = subprocess.run([str(ROOT / "scripts" / "cluster"), "down"], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)
        assert down.returncode == 0, down.stderr[-2000:]


def _spark_home() -> str:
    """The pyspark wheel's directory (spark-class, jars): the workers run the driver's Spark."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


def _pid(state: Path, name: str) -> int:
    return int((state / f"{name}.pid").read_text().strip())


def _messages(data_dir: Path, prefix: str) -> collections.Counter:
    """payload -> rows in the messages table, for this test's topics."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        t = DeltaTable(str(data_dir / "tables" / "messages")).to_pyarrow_table(columns=["topic", "payload"])
    except TableNotFoundError:
        return collections.Counter()
    return collections.Counter(bytes(p) for tp, p in zip(t.column("topic").to_pylist(), t.column("payload").to_pylist())
                               if tp.startswith(prefix + "/"))


def _forwarded(consumer: Consumer) -> collections.Counter:
    with consumer.cond:
        return collections.Counter(bytes(m.body) for ms in consumer.by_topic.values() for m in ms
                                   if m.subject == "publish")


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def test_executors_that_cannot_run_lakegate_stop_the_job_at_start_in_one_line(cluster, tmp_path):
    """A PYSPARK_PYTHON the workers do not have: exit 2 and one line at start, not a failed first batch."""
    url, _ = cluster
    env = {**_submit_env(), "PYSPARK_PYTHON": "/nonexistent/lakegate/bin/python3",
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    job = subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--master", url, "--properties-file", "conf/spark-defaults.conf",
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf", "spark.task.maxFailures=1",
         "jobs/process_packets.py", "--config", "conf/lakegate.toml", "--set", f"data_dir={tmp_path}",
         "--set", "log_level=WARNING", "--once"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    # spark-submit passes the Python driver's stderr on to its stdout (it merges the two streams)
    assert job.returncode == 2, (job.stdout + job.stderr)[-3000:]
    ours = [ln for ln in job.stdout.splitlines() if ln.startswith("lakegate:")]
    assert len(ours) == 1, job.stdout[-3000:]
    last = ours[0]
    assert last.startswith("lakegate: the Spark executors cannot run lakegate with /nonexistent/lakegate/bin/python3 (")
    assert "Cannot run program" in last and "PYSPARK_PYTHON" in last
    assert not (tmp_path / "checkpoints").exists()  # no query started


def test_spark_submit_on_a_standalone_cluster_survives_a_killed_worker(
        cluster, edge, tmp_path, rabbitmq):  # noqa: F811 - edge is the imported fixture
    url, state = cluster
    port = edge
    prefix = f"cl{uuid.uuid4().hex[:8]}"
    consumer = Consumer(rabbitmq, prefix)
    log = tmp_path / "job.log"
    job = None
    clients: list[mqtt.Client] = []
    acked: list[bytes] = []
    lock = threading.Lock()
    killed = threading.Event()
    try:
        with open(log, "w") as out:
            job = subprocess.Popen(
                [str(VENV_BIN / "spark-submit"), "--master", url, "--properties-file", "conf/spark-defaults.conf",
                 "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
                 "jobs/process_packets.py", "--config", "conf/lakegate.toml", "--set", f"data_dir={tmp_path}",
                 "--set", f"amqp.url={rabbitmq}", "--set", "log_level=WARNING"],
                stdout=out, stderr=subprocess.STDOUT, env=_submit_env(), cwd=ROOT, start_new_session=True)

        for i in range(CLIENTS):
            c = _client(port, f"{prefix}-c{i}", mqtt.MQTTv311 if i % 2 else mqtt.MQTTv5)
            clients.append(c)

        def publish(c: mqtt.Client, i: int, seqs: range) -> None:
            infos = [(c.publish(f"{prefix}/c{i}", f"{prefix}-c{i}-{n}".encode(), qos=1), n) for n in seqs]
            for info, n in infos:
                info.wait_for_publish(60)
                if info.is_published():  # PUBACK: the edge has it durably
                    with lock:
                        acked.append(f"{prefix}-c{i}-{n}".encode())

        # warm-up: the job processes on the cluster's executors (this is where the workers' python3 failed)
        publish(clients[0], 0, range(-WARMUP, 0))
        assert len(acked) == WARMUP

        def job_alive_and(cond):
            def check():
                assert job.poll() is None, f"the job ended (exit {job.returncode}):\n{_tail(log)}"
                return cond()
            return check

        wait_for(job_alive_and(lambda: sum(_messages(tmp_path, prefix).values()) >= WARMUP), timeout=180,
                 what="the warm-up messages in the messages table", poll=0.5)

        def load(i: int) -> None:
            for start in range(0, PER_CLIENT, CHUNK):
                if start >= PER_CLIENT // 2 and not killed.is_set():
                    killed.wait(120)  # the second half goes after the kill, whatever the job's speed
                publish(clients[i], i, range(start, start + CHUNK))
                time.sleep(0.5)  # pacing: about 200 msg/s over four clients

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        # kill a worker once the job has written part of the load (it is processing the rest)
        wait_for(job_alive_and(lambda: sum(_messages(tmp_path, prefix).values()) >= WARMUP + CHUNK * CLIENTS),
                 timeout=120, what="part of the load in the messages table", poll=0.25)
        os.kill(_pid(state, "worker-1"), signal.SIGKILL)
        killed.set()
        for t in threads:
            t.join(180)
            assert not t.is_alive(), "a publisher did not finish"
        assert len(acked) == WARMUP + CLIENTS * PER_CLIENT, f"only {len(acked)} messages acknowledged"

        want = set(acked)
        wait_for(job_alive_and(lambda: want <= set(_messages(tmp_path, prefix))), timeout=180,
                 what="every acknowledged message in the messages table", poll=0.5)
        wait_for(lambda: want <= set(_forwarded(consumer)), timeout=120, what="every message forwarded to RabbitMQ",
                 poll=0.2)
        rows = _messages(tmp_path, prefix)
        assert set(rows) == want, "rows the edge never acknowledged"
        dups = {p: n for p, n in rows.items() if n != 1}
        assert not dups, f"{len(dups)} messages have more than one row, e.g. {next(iter(dups))!r}"
        assert job.poll() is None, f"the job ended:\n{_tail(log)}"
        # the kill took an executor the job was using, and the job went on with the other one
        assert "Lost executor" in _tail(log, 1_000_000), _tail(log)
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)  # the job's own process group: spark-submit and its Python
            try:
                job.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
        consumer.close()
        delete_queue(consumer)
