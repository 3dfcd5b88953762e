"""Shared fixtures: one Spark session per test run, the real brokers, paths.

Tests that need a broker use the real RabbitMQ, Mosquitto and Kafka started by
``scripts/services up`` (the README's test command starts them). When a
broker does not answer, those tests fail with a message saying so, unless
LAKEGATE_SKIP_BROKERS=1 is set, in which case they skip with that reason.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# The Spark Connect endpoint of lakegate run / process (bridge.sqlserve) and the metrics are off in every test's
# processes unless the test turns it on with a port of its own: two runs (a test's and one
# still stopping) would otherwise contend for the default 15002.
os.environ.setdefault("LAKEGATE_SQL_CONNECT_PORT", "0")
os.environ.setdefault("LAKEGATE_METRICS_PORT", "0")  # the same for the metrics endpoint



def child_env(**extra: str) -> dict[str, str]:
    """The environment of a lakegate subprocess a test starts: none of this
    process's ``LAKEGATE_*`` settings (the child reads conf/ and its
    ``--set``), with the SQL endpoint and the metrics endpoint off -- a
    lakegate run elsewhere on the machine, or another test's still
    stopping, may hold their default ports; a test that wants one gives a
    port of its own with ``--set`` (which wins over the environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEGATE_")}
    env.update(LAKEGATE_SQL_CONNECT_PORT="0", LAKEGATE_METRICS_PORT="0")
    env.update(extra)
    return env


RABBITMQ = ("127.0.0.1", int(os.environ.get("RABBITMQ_PORT", "5672")))
MOSQUITTO = ("127.0.0.1", int(os.environ.get("MOSQUITTO_PORT", "18830")))
KAFKA = ("127.0.0.1", int(os.environ.get("KAFKA_PORT", "9092")))
AMQP_URL = f"amqp://guest:guest@{RABBITMQ[0]}:{RABBITMQ[1]}"


def _answers(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=2):
            return True
    except OSError:
        return False


def _need(addr: tuple[str, int], name: str) -> None:
    if _answers(addr):
        return
    msg = f"{name} does not answer on {addr[0]}:{addr[1]}; start it with scripts/services up"
    if os.environ.get("LAKEGATE_SKIP_BROKERS") == "1":
        pytest.skip(msg + " (skipped: LAKEGATE_SKIP_BROKERS=1)")
    pytest.fail(msg)


@pytest.fixture(scope="session")
def rabbitmq() -> str:
    """The AMQP URL of the real RabbitMQ (AMQP 1.0 plugin)."""
    _need(RABBITMQ, "RabbitMQ")
    return AMQP_URL


@pytest.fixture(scope="session")
def mosquitto() -> tuple[str, int]:
    """(host, port) of the real Mosquitto."""
    _need(MOSQUITTO, "Mosquitto")
    return MOSQUITTO


@pytest.fixture(scope="session")
def kafka() -> str:
    """The bootstrap servers of the real one-node Kafka (KRaft) scripts/services starts."""
    _need(KAFKA, "Kafka")
    return f"{KAFKA[0]}:{KAFKA[1]}"


def delete_kafka_topics(bootstrap: str, names) -> None:
    """Delete test topics, waiting for the answer (a client dropped at once
    takes its request with it); one never created is fine, one that stays
    is a warning (the test itself passed)."""
    import warnings

    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    names = list(names)
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, fut in admin.delete_topics(names, operation_timeout=10, request_timeout=10).items():
        try:
            fut.result(15)
        except Exception as exc:  # noqa: BLE001 - reported below unless it was never there
            code = exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None
            if code != KafkaError.UNKNOWN_TOPIC_OR_PART:
                warnings.warn(f"test topic {name!r} not deleted: {exc}", stacklevel=1)


@pytest.fixture
def kafka_topic(kafka):
    """A function: prefix -> a fresh topic name on the Kafka of scripts/services,
    deleted after the test (whoever creates it)."""
    import uuid

    made: list[str] = []

    def name(prefix: str = "lg-test") -> str:
        made.append(f"{prefix}-{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield name
    delete_kafka_topics(kafka, made)


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return False
        except OSError:
            return True


def free_port_block(offsets) -> int:
    """A base port P with P + each of ``offsets`` free on loopback (a Kafka
    of scripts/kafka: brokers P.., controllers P+100..)."""
    base = free_port()
    while base > 65000 - max(offsets) or any(port_busy(base + d) for d in offsets):
        base = free_port()
    return base


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory):
    """A three-node Kafka cluster (scripts/kafka --nodes 3: replication factor
    3, min.insync.replicas 2) of the module's own, on free loopback ports,
    stopped after the module: (bootstrap servers, the script's arguments for
    :func:`kafka_node`)."""
    import subprocess

    base = free_port_block((0, 1, 2, 100, 101, 102))  # brokers P..P+2, controllers P+100..P+102
    d = tmp_path_factory.mktemp("kafka3")
    args = ["--nodes", "3", "--port", str(base), "--dir", str(d)]
    script = str(ROOT / "scripts" / "kafka")
    up = subprocess.run([script, "up", *args], capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield ",".join(f"127.0.0.1:{base + i}" for i in range(3)), args
    finally:
        subprocess.run([script, "down", *args], capture_output=True, timeout=120)


def kafka_node(cmd: str, node: int, args: list[str]) -> None:
    """``scripts/kafka kill|start NODE`` on a :func:`kafka_cluster`.

    ``start`` is tried twice: a node restarted after a SIGKILL on a cluster
    started moments before was seen to exit at once, with nothing in its
    log, in 2 of 5 isolated runs of one test (never within a whole module
    run); not understood yet, and not what the tests calling this check."""
    import subprocess

    for _attempt in range(2 if cmd == "start" else 1):
        r = subprocess.run([str(ROOT / "scripts" / "kafka"), cmd, str(node), *args], capture_output=True,
                           text=True, timeout=120)
        if r.returncode == 0:
            return
    raise AssertionError(r.stdout + r.stderr)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run, built by the project's factory."""
    from bridge.config import load_config
    from bridge.spark.session import build_session

    cfg = load_config(None, ["spark.master=local[2]", "spark.shuffle_partitions=2"], env={})
    session = build_session(cfg, app_name="lakegate-tests")
    yield session
    session.stop()


@pytest.fixture
def lakegate_cmd() -> list[str]:
    """argv prefix that runs the lakegate CLI of this checkout."""
    return [sys.executable, "-m", "bridge"]
