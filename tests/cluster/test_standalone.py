"""The spark-submit command of docs/job.md on a real Spark standalone cluster.

``scripts/cluster`` starts a master and two workers from the pyspark wheel on
loopback, in an environment whose ``python3`` is the system one (no pyarrow,
no lakegate): the workers of a real cluster. The job runs under
``spark-submit --master spark://...`` with the project's venv active and no
``PYSPARK_PYTHON``: the entry point must name the executors' Python itself
(before, the first batch failed on the executors with ``ModuleNotFoundError:
No module named 'pyarrow'``). A running edge takes a bounded QoS 1 load; one
worker is SIGKILLed while a batch of it runs. Then every acknowledged
message is in ``messages`` exactly once and reached RabbitMQ (forwarding is
at least once: repeats are allowed there, losses are not).

``conf/spark-defaults.conf`` puts delta-spark's jars (``.jvm/lib/delta``,
``scripts/bootstrap``) on the driver's and the executors' classpath, so
``tables.engine = "auto"`` on a cluster master writes with delta-spark: the
executors write the files, the driver commits. The test checks that it did
(every commit's ``engineInfo`` names Delta-Lake 4.4.0) and that exactly once
holds by Delta's own transaction identifiers: every write commit of the job
carries one ``txn`` action, its app id the query's (``lakegate:<query id>``
from the checkpoint's metadata) and its version a batch id of the
checkpoint, and no (app id, version) is committed twice to a table.
"""

from __future__ import annotations

import collections
import json
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


@pytest.fixture
def capture():
    """The imported ``edge`` fixture's capture log: the local one here (the
    end-to-end test runs both; this one is about a cluster losing a worker)."""
    return []


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


#: what the job commits besides its batches' writes (each write commit carries a txn action)
NOT_BATCH_WRITES = {"CREATE TABLE"}


def _commits(table_dir: Path) -> list[tuple[int, list[dict]]]:
    """(version, actions) of every commit of a Delta table, oldest first."""
    out = []
    for path in sorted((table_dir / "_delta_log").glob("[0-9]*.json")):
        out.append((int(path.stem), [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]))
    return out


def _check_delta_spark_exactly_once(data_dir: Path) -> dict[str, list[tuple[int, str, int, str]]]:
    """delta-spark wrote every table, and every write commit carries one txn
    action of the job's query with a batch id of its checkpoint, none
    twice (module doc); per table its write commits (table version,
    operation, txn version, rows written)."""
    checkpoint = data_dir / "checkpoints" / "lakegate"
    app = "lakegate:" + json.loads((checkpoint / "metadata").read_text())["id"]
    batches = {int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()}
    writes = {}
    for table in ("messages", "quarantine", "retained"):
        commits = _commits(data_dir / "tables" / table)
        assert commits, f"{table}: no commits"
        seen: dict[tuple[str, int], int] = {}
        for version, actions in commits:
            (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
            assert "Delta-Lake/4.4.0" in info.get("engineInfo", ""), f"{table} v{version}: not delta-spark: {info}"
            txns = [a["txn"] for a in actions if "txn" in a]
            if info["operation"] in NOT_BATCH_WRITES:
                assert not txns, f"{table} v{version}: {info['operation']} with {txns}"
                continue
            assert len(txns) == 1, f"{table} v{version} ({info['operation']}): txn actions {txns}"
            key = (txns[0]["appId"], txns[0]["version"])
            assert key[0] in (app, f"{app}/unforwardable"), f"{table} v{version}: app id {key[0]}, the query's is {app}"
            assert key[1] in batches, f"{table} v{version}: txn version {key[1]} is no batch of {sorted(batches)}"
            assert key not in seen, f"{table}: {key} committed twice, in v{seen[key]} and v{version}"
            seen[key] = version
            writes.setdefault(table, []).append((version, info["operation"], key[1],
                                                 info.get("operationMetrics", {}).get("numOutputRows", "?")))
        assert any(k[0] == app for k in seen), f"{table}: no write of the job's batches"
    return writes


def _batch_in_flight(data_dir: Path, after: int) -> int | None:
    """The id of a batch after ``after`` that the job has started (its offsets
    written) and not finished (no commit yet), else None."""
    checkpoint = data_dir / "checkpoints" / "lakegate"
    try:
        started = {int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()}
        done = {int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()}
    except FileNotFoundError:
        return None
    running = sorted(b for b in started - done if b > after)
    return running[0] if running else None


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

        # the job's start (three tables created by delta-spark) and its first batches: minutes on 2 busy cores
        wait_for(job_alive_and(lambda: sum(_messages(tmp_path, prefix).values()) >= WARMUP), timeout=420,
                 what="the warm-up messages in the messages table", poll=0.5)

        def load(i: int) -> None:
            for start in range(0, PER_CLIENT, CHUNK):
                if start >= PER_CLIENT // 2 and not killed.is_set():
                    killed.wait(300)  # the second half goes after the kill, whatever the job's speed
                publish(clients[i], i, range(start, start + CHUNK))
                time.sleep(0.5)  # pacing: about 200 msg/s over four clients

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        # kill a worker while a batch of the load runs (its offsets written, its commit not yet): with
        # delta-spark that is mostly the executors writing the batch's files
        in_flight = wait_for(job_alive_and(lambda: _batch_in_flight(tmp_path, after=0)), timeout=420,
                             what="a batch of the load in flight", poll=0.1)
        os.kill(_pid(state, "worker-1"), signal.SIGKILL)
        killed.set()
        print(f"worker-1 SIGKILLed while batch {in_flight} ran")
        for t in threads:
            t.join(180)
            assert not t.is_alive(), "a publisher did not finish"
        assert len(acked) == WARMUP + CLIENTS * PER_CLIENT, f"only {len(acked)} messages acknowledged"

        want = set(acked)
        wait_for(job_alive_and(lambda: want <= set(_messages(tmp_path, prefix))), timeout=420,
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
        lost = [ln for ln in _tail(log, 1_000_000).splitlines() if "Lost task" in ln]
        print(f"tasks lost with the worker and run again: {len(lost)}{': ' + lost[0][:300] if lost else ''}")
        writes = _check_delta_spark_exactly_once(tmp_path)
        print("delta-spark write commits, each with one txn action (table version, operation, batch id, rows): "
              f"{writes}")
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
