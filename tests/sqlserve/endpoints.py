"""What the endpoint tests share: a ``lakegate run`` serving the SQL endpoint,
``lakegate sql`` and a generic Spark Connect client against it, an MQTT
publisher, and the tables read with deltalake (not through the endpoint)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from bridge.bench.e2e_procs import Lakegate
from bridge.config import load_config
from bridge.sqlserve.client import endpoint_answers
from tests.amqp.peer import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FALLBACK = "starting a local Spark session"


def lakegate_sql(data: Path, port: int, *args: str, timeout: float = 120,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m bridge sql --format csv ARGS`` against the endpoint on ``port``
    (``env``: more of the command's environment)."""
    env = {**os.environ, "LAKEGATE_SQL_CONNECT_PORT": str(port), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bridge", "sql", "--set", f"data_dir={data}", "--format", "csv",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def publish(port: int, topic: str, payload: bytes, retain: bool = True) -> None:
    """One QoS 1 PUBLISH to the edge on ``port`` (retained unless told), acknowledged."""
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sqltest-{topic}", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(30)
    finally:
        c.loop_stop()
        c.disconnect()


def retained_topics(data: Path) -> set[str]:
    """The topics in the retained table now, read with deltalake (not the endpoint)."""
    from deltalake import DeltaTable

    try:
        return set(DeltaTable(str(data / "tables" / "retained")).to_pyarrow_table(columns=["topic"])
                   .column("topic").to_pylist())
    except Exception:  # not created yet
        return set()


def version(data: Path, table: str = "retained") -> int:
    """A table's newest version (-1 before it exists)."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(data / "tables" / table)).version()
    except Exception:  # not created yet
        return -1


def retained_version(data: Path) -> int:
    return version(data, "retained")


def the_views_after_one_publish(lg, data: Path, port: int, topic: str, *more: str) -> list[str]:
    """Publish ``abc`` retained to ``topic`` and check what a generic Spark
    Connect client then reads through the five names (retained, messages,
    retained_all, retained_versions, quarantine); the answers to ``more``
    queries asked in the same client."""
    version = retained_version(data)
    assert generic_client(port, f"SELECT count(*) FROM retained WHERE topic = '{topic}'") == ["0"]
    publish(lg.port, topic, b"abc")
    assert wait_for(lambda: topic in retained_topics(data), timeout=60), lg.tail()
    got = generic_client(port, f"SELECT count(*), max(payload_size) FROM retained WHERE topic = '{topic}'",
                         f"SELECT count(*) FROM messages WHERE topic = '{topic}'",
                         f"SELECT count(*) FROM retained_all WHERE topic = '{topic}'",
                         "SELECT max(version) FROM retained_versions",
                         "SELECT count(*) FROM quarantine WHERE rule IS NULL", *more)
    assert got[:3] == ["1|3", "1", "1"]
    assert int(got[3]) == retained_version(data) > version
    assert got[4] == "0"
    return got[5:]


@contextlib.contextmanager
def environ(env: dict[str, str]):
    """This process's environment with ``env`` added, as it was afterwards
    (for what starts a child with it: a run, a notebook's kernel)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_run(tmp: Path, *sets: str, env: dict[str, str] | None = None):
    """A ``lakegate run`` serving the endpoint on a port of its own, its first batch
    committed and its catalog objects made: (Lakegate, data_dir, port)."""
    port = free_port()
    lg = Lakegate(argparse.Namespace(overrides=[], config=None), tmp / "data", tmp / "run.log")
    with environ(env or {}):  # the run's environment (Lakegate starts it with this process's)
        lg.start(["amqp.url=", f"sql.connect_port={port}", *sets], timeout=120)
    cfg = load_config(None, [f"data_dir={tmp / 'data'}", f"sql.connect_port={port}"], env={})
    try:
        assert wait_for(lambda: endpoint_answers(cfg), timeout=120), lg.tail()
        assert wait_for(lambda: retained_version(tmp / "data") >= 1, timeout=120), lg.tail()  # first batch
        # the catalog objects other Connect clients see come after the query started, on a thread
        assert wait_for(lambda: "sql: Spark Connect endpoint on" in lg.log_text(), timeout=120), lg.tail()
    except BaseException:
        lg.stop()
        raise
    return lg, tmp / "data", port


GENERIC = """
import sys
from pyspark.sql import SparkSession
s = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
for q in sys.argv[2:]:
    try:
        print("|".join(str(v) for v in s.sql(q).first()), flush=True)
    except Exception as exc:
        print("ERROR " + str(exc).strip().splitlines()[0], flush=True)
s.stop()
"""


def generic_client(port: int, *queries: str) -> list[str]:
    """A Spark Connect client with no lakegate code in it (what a BI tool sends):
    each query's first row as ``a|b|...``, or ``ERROR <first line>``."""
    res = subprocess.run([sys.executable, "-c", GENERIC, f"sc://127.0.0.1:{port}", *queries],
                         capture_output=True, text=True, timeout=120, cwd="/")
    assert res.returncode == 0, res.stderr[-1500:]
    return res.stdout.split("\n")[:-1]


def commit_time(data: Path, table: str, version: int) -> str:
    """What Delta takes as a version's commit time (its commit file's modification
    time, without in-commit timestamps), as a UTC TIMESTAMP literal."""
    import datetime as dt

    f = data / "tables" / table / "_delta_log" / f"{version:020d}.json"
    return dt.datetime.fromtimestamp(f.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
