"""The Spark Connect endpoint of a real ``lakegate run`` (bridge.sqlserve):
queries through it see batches committed after it started, time-travel,
fail in one line; a generic Spark Connect client sees mqtt_match; with the
endpoint off ``lakegate sql`` says so and uses a local session; a taken
port stops ``lakegate run`` in one line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.bench.e2e_procs import Lakegate
from bridge.config import load_config
from bridge.sqlserve.client import endpoint_answers, endpoint_gone, one_line_error
from tests.amqp.peer import free_port as _free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FALLBACK = "starting a local Spark session"


def _sql(data: Path, port: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAKEGATE_SQL_CONNECT_PORT": str(port)}
    return subprocess.run([sys.executable, "-m", "bridge", "sql", "--set", f"data_dir={data}", "--format", "csv",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _publish_retained(port: int, topic: str, payload: bytes) -> None:
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sqltest-{topic}", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(topic, payload, qos=1, retain=True).wait_for_publish(30)
    finally:
        c.loop_stop()
        c.disconnect()


def _retained_topics(data: Path) -> set[str]:
    """The topics in the retained table now, read with deltalake (not the endpoint)."""
    from deltalake import DeltaTable

    try:
        return set(DeltaTable(str(data / "tables" / "retained")).to_pyarrow_table(columns=["topic"])
                   .column("topic").to_pylist())
    except Exception:  # not created yet
        return set()


def _retained_version(data: Path) -> int:
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(data / "tables" / "retained")).version()
    except Exception:  # not created yet
        return -1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sqlserve")
    port = _free_port()
    lg = Lakegate(argparse.Namespace(overrides=[], config=None), tmp / "data", tmp / "run.log")
    lg.start(["amqp.url=", f"sql.connect_port={port}"], timeout=120)
    cfg = load_config(None, [f"data_dir={tmp / 'data'}", f"sql.connect_port={port}"], env={})
    try:
        assert wait_for(lambda: endpoint_answers(cfg), timeout=120), lg.tail()
        assert wait_for(lambda: _retained_version(tmp / "data") >= 1, timeout=120), lg.tail()  # first batch
        # the catalog objects other Connect clients see come after the query started, on a thread
        assert wait_for(lambda: "sql: Spark Connect endpoint on" in lg.log_text(), timeout=120), lg.tail()
        yield lg, tmp / "data", port
    finally:
        lg.stop()


def test_a_query_through_the_endpoint_sees_a_batch_committed_after_it_started(run):
    lg, data, port = run
    before = _sql(data, port, "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/1'")
    assert before.returncode == 0, before.stderr
    assert FALLBACK not in before.stderr and before.stdout.split() == ["n", "0"]
    _publish_retained(lg.port, "sql/dev/1", b"on")
    # committed: in the table as deltalake reads it (a newer version alone
    # may be a batch formed before the publish arrived, seen under load)
    assert wait_for(lambda: "sql/dev/1" in _retained_topics(data), timeout=60), lg.tail()
    after = _sql(data, port, "SELECT topic, payload_size, mqtt_match('sql/+/1', topic) AS m FROM retained "
                             "WHERE topic = 'sql/dev/1'")
    assert after.returncode == 0, after.stderr
    assert FALLBACK not in after.stderr
    assert after.stdout.split() == ["topic,payload_size,m", "sql/dev/1,2,True"]


def test_time_travel_through_the_endpoint(run):
    lg, data, port = run
    _publish_retained(lg.port, "sql/dev/tt", b"x")
    assert wait_for(lambda: _sql(data, port, "SELECT count(*) FROM retained WHERE topic = 'sql/dev/tt'")
                    .stdout.split()[-1:] == ["1"], timeout=60), lg.tail()
    old = _sql(data, port, "--as-of", "1", "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/tt'")
    assert old.returncode == 0 and FALLBACK not in old.stderr, old.stderr
    assert old.stdout.split() == ["n", "0"]
    versions = _sql(data, port, "SELECT max(version) AS v FROM retained_versions")
    assert int(versions.stdout.split()[-1]) == _retained_version(data)


def test_a_failing_query_through_the_endpoint_is_one_line(run):
    _lg, data, port = run
    res = _sql(data, port, "SELECT * FROM no_such_view")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "TABLE_OR_VIEW_NOT_FOUND" in lines[0], res.stderr


_GENERIC = """
import sys
from pyspark.sql import SparkSession
s = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
for q in sys.argv[2:]:
    print("|".join(str(v) for v in s.sql(q).first()), flush=True)
s.stop()
"""


def _generic_client(port: int, *queries: str) -> list[str]:
    """A Spark Connect client with no lakegate code in it (what a BI tool sends)."""
    res = subprocess.run([sys.executable, "-c", _GENERIC, f"sc://127.0.0.1:{port}", *queries],
                         capture_output=True, text=True, timeout=120, cwd="/")
    assert res.returncode == 0, res.stderr[-1500:]
    return res.stdout.split("\n")[:-1]


def test_any_spark_connect_client_sees_the_views_at_the_latest_version_and_mqtt_match(run):
    lg, data, port = run
    assert _generic_client(port, "SELECT mqtt_match('a/+', 'a/b')") == ["True"]
    before = _generic_client(port, "SELECT count(*) FROM retained WHERE topic = 'sql/generic'")
    assert before == ["0"]
    version = _retained_version(data)
    _publish_retained(lg.port, "sql/generic", b"abc")
    assert wait_for(lambda: "sql/generic" in _retained_topics(data), timeout=60), lg.tail()
    got = _generic_client(port, "SELECT count(*), max(payload_size) FROM retained WHERE topic = 'sql/generic'",
                          "SELECT count(*) FROM messages WHERE topic = 'sql/generic'",
                          "SELECT count(*) FROM retained_all WHERE topic = 'sql/generic'",
                          "SELECT max(version) FROM retained_versions",
                          "SELECT count(*) FROM quarantine WHERE rule IS NULL")
    assert got[:3] == ["1|3", "1", "1"]
    assert int(got[3]) == _retained_version(data)
    assert got[4] == "0"
    # time travel without lakegate's code: the lakegate_table data source, by options
    old = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom pyspark.sql import SparkSession\n"
        f"s = SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate()\n"
        f"df = s.read.format('lakegate_table').option('delta_dir', {str(data / 'tables' / 'retained')!r})"
        f".option('table', 'retained').option('version', '{version}').load()\n"
        "print(df.where(\"topic = 'sql/generic'\").count())\n")], capture_output=True, text=True, timeout=120, cwd="/")
    assert old.returncode == 0, old.stderr[-1500:]
    assert old.stdout.split() == ["0"]


def test_with_the_endpoint_off_lakegate_sql_says_so_and_answers_from_a_local_session(run, tmp_path):
    _lg, data, _port = run
    nobody = _free_port()  # nothing listens here: a run with sql.connect_port=0 serves no endpoint
    res = _sql(data, nobody, "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/1'", timeout=180)
    assert res.returncode == 0, res.stderr
    said = [ln for ln in res.stderr.splitlines() if FALLBACK in ln]
    assert said == [f"lakegate: no SQL endpoint answers on sc://127.0.0.1:{nobody} (is lakegate run up?); "
                    f"{FALLBACK}"]
    assert res.stdout.split()[0] == "n"


def test_a_taken_port_stops_lakegate_run_in_one_line(run, tmp_path):
    _lg, _data, port = run  # the module's run holds it
    res = subprocess.run([sys.executable, "-m", "bridge", "run", "--set", f"data_dir={tmp_path / 'd'}",
                          "--set", "edge.port=0", "--set", "amqp.url="],
                         cwd=ROOT, env={**os.environ, "LAKEGATE_SQL_CONNECT_PORT": str(port)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"lakegate: config error: sql.connect_port: 127.0.0.1:{port} is in use (another lakegate run or "
                     "process?); set sql.connect_port to a free port, or 0 to serve no SQL endpoint "
                     "(from environment LAKEGATE_SQL_CONNECT_PORT)"], res.stderr


def test_transport_errors_are_told_apart_from_query_errors():
    gone = RuntimeError("<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE "
                        "details = \"failed to connect to all addresses\">")
    assert endpoint_gone(gone)
    assert one_line_error(gone).startswith("the endpoint stopped answering")
    query = RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table or view `x` cannot be found. SQLSTATE: 42P01; line 1 pos 14")
    assert not endpoint_gone(query)
    assert one_line_error(query) == "[TABLE_OR_VIEW_NOT_FOUND] The table or view `x` cannot be found. SQLSTATE: 42P01"


def test_a_notebook_queries_through_the_endpoint(run, tmp_path):
    import json as _json

    import nbformat
    from nbclient import NotebookClient

    _lg, data, port = run
    kdir = tmp_path / "jupyter" / "kernels" / "python3"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(_json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "lakegate", "language": "python"}))
    path = ROOT / "notebooks" / "retained_state.ipynb"
    nb = nbformat.read(path, as_version=4)
    env = {"JUPYTER_PATH": str(tmp_path / "jupyter"), "LAKEGATE_DATA_DIR": str(data),
           "LAKEGATE_SQL_CONNECT_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert f"session sc://127.0.0.1:{port}" in text, text[:2000]
    assert FALLBACK not in text


def test_a_client_whose_endpoint_goes_away_gets_an_error_that_says_so_not_a_hang(tmp_path):
    """The run stops (its Spark session restarts, or it was killed) while a client holds a
    session: the next query fails within seconds, and the error is told from a query's."""
    port = _free_port()
    lg = Lakegate(argparse.Namespace(overrides=[], config=None), tmp_path / "data", tmp_path / "run.log")
    lg.start(["amqp.url=", f"sql.connect_port={port}"], timeout=120)
    cfg = load_config(None, [f"data_dir={tmp_path / 'data'}", f"sql.connect_port={port}"], env={})
    code = ("import sys, time\n"
            "from bridge.config import load_config\n"
            "from bridge.sqlserve.client import open_session, endpoint_gone, one_line_error\n"
            f"cfg = load_config(None, ['data_dir={tmp_path / 'data'}', 'sql.connect_port={port}'], env={{}})\n"
            "s = open_session(cfg, 'test').spark\n"
            "print(s.sql('SELECT 1 AS x').first().x, flush=True)\n"
            "sys.stdin.readline()\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    s.sql('SELECT 2').collect()\n"
            "    print('answered')\n"
            "except Exception as exc:\n"
            "    print(endpoint_gone(exc), round(time.monotonic() - t0, 1), one_line_error(exc), flush=True)\n")
    try:
        assert wait_for(lambda: endpoint_answers(cfg), timeout=120), lg.tail()
        client = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert client.stdout.readline().strip() == "1"
        lg.kill()
        out, err = client.communicate("go\n", timeout=60)
        gone, took, line = out.strip().split(" ", 2)
        assert gone == "True", (out, err[-500:])
        assert float(took) < 15
        assert line.startswith("the endpoint stopped answering"), line
    finally:
        lg.stop()


def test_a_wildcard_bind_is_dialled_on_loopback_with_the_token():
    from bridge.sqlserve.endpoint import spark_conf, url

    cfg = load_config(None, ["sql.connect_host=0.0.0.0", "sql.connect_token=s3cret", "sql.connect_port=15099"], env={})
    assert url(cfg) == "sc://127.0.0.1:15099/;token=s3cret"
    conf = spark_conf(cfg)
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert conf["spark.connect.authenticate.token"] == "s3cret"
    assert spark_conf(load_config(None, ["sql.connect_port=0"], env={})) == {}
