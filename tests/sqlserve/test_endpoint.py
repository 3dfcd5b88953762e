"""The Spark Connect endpoint of a real ``lakegate run`` (bridge.sqlserve):
queries through it see batches committed after it started, time-travel,
fail in one line; a generic Spark Connect client sees mqtt_match; with
delta-spark the tables are Delta tables in its catalog (DESCRIBE HISTORY,
VERSION AS OF, TIMESTAMP AS OF over the tables delta-rs writes; OPTIMIZE and
VACUUM refused: sql.allow_maintenance is off by default); with the
endpoint off ``lakegate sql`` says so and uses a local session; a taken
port stops ``lakegate run`` in one line.

One run for the module (the default configuration); test_endpoint_allowing.py
has one with sql.allow_maintenance on, test_endpoint_without_delta.py one
without delta-spark's jars."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bridge.config import load_config
from bridge.sqlserve.client import endpoint_gone, one_line_error
from tests.amqp.peer import free_port
from tests.sqlserve.endpoints import (FALLBACK, ROOT, commit_time, environ, generic_client, lakegate_sql, publish,
                                      retained_topics, retained_version, start_run, the_views_after_one_publish)
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    lg, data, port = start_run(tmp_path_factory.mktemp("sqlserve"))
    try:
        yield lg, data, port
    finally:
        lg.stop()


def test_a_query_through_the_endpoint_sees_a_batch_committed_after_it_started(run):
    lg, data, port = run
    before = lakegate_sql(data, port, "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/1'")
    assert before.returncode == 0, before.stderr
    assert FALLBACK not in before.stderr and before.stdout.split() == ["n", "0"]
    publish(lg.port, "sql/dev/1", b"on")
    # committed: in the table as deltalake reads it (a newer version alone
    # may be a batch formed before the publish arrived, seen under load)
    assert wait_for(lambda: "sql/dev/1" in retained_topics(data), timeout=60), lg.tail()
    after = lakegate_sql(data, port, "SELECT topic, payload_size, mqtt_match('sql/+/1', topic) AS m FROM retained "
                                     "WHERE topic = 'sql/dev/1'")
    assert after.returncode == 0, after.stderr
    assert FALLBACK not in after.stderr
    assert after.stdout.split() == ["topic,payload_size,m", "sql/dev/1,2,True"]


def test_time_travel_through_the_endpoint(run):
    lg, data, port = run
    publish(lg.port, "sql/dev/tt", b"x")
    assert wait_for(lambda: lakegate_sql(data, port, "SELECT count(*) FROM retained WHERE topic = 'sql/dev/tt'")
                    .stdout.split()[-1:] == ["1"], timeout=60), lg.tail()
    old = lakegate_sql(data, port, "--as-of", "1", "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/tt'")
    assert old.returncode == 0 and FALLBACK not in old.stderr, old.stderr
    assert old.stdout.split() == ["n", "0"]
    versions = lakegate_sql(data, port, "SELECT max(version) AS v FROM retained_versions")
    assert int(versions.stdout.split()[-1]) == retained_version(data)


def test_a_failing_query_through_the_endpoint_is_one_line(run):
    _lg, data, port = run
    res = lakegate_sql(data, port, "SELECT * FROM no_such_view")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "TABLE_OR_VIEW_NOT_FOUND" in lines[0], res.stderr


def test_any_spark_connect_client_sees_the_views_at_the_latest_version_and_mqtt_match(run):
    lg, data, port = run
    assert generic_client(port, "SELECT mqtt_match('a/+', 'a/b')") == ["True"]
    version = retained_version(data)
    the_views_after_one_publish(lg, data, port, "sql/generic")
    # time travel without lakegate's code: Delta's own (this run has delta-spark)
    assert generic_client(port, f"SELECT count(*) FROM retained_all VERSION AS OF {version} "
                                "WHERE topic = 'sql/generic'") == ["0"]


def test_the_tables_delta_rs_writes_are_delta_tables_with_history_and_time_travel(run):
    """The run writes with delta-rs (its embedded engine); the endpoint's catalog
    holds them as Delta tables: DESCRIBE HISTORY, VERSION AS OF, TIMESTAMP AS OF."""
    lg, data, port = run
    before = retained_version(data)
    publish(lg.port, "sql/delta", b"d1")
    assert wait_for(lambda: "sql/delta" in retained_topics(data), timeout=60), lg.tail()
    newest = retained_version(data)
    got = generic_client(
        port, "DESCRIBE HISTORY retained_all",
        f"SELECT count(*) FROM retained_all VERSION AS OF {before} WHERE topic = 'sql/delta'",
        f"SELECT count(*) FROM retained_all TIMESTAMP AS OF '{commit_time(data, 'retained', before)}' "
        "WHERE topic = 'sql/delta'",
        "SELECT count(*) FROM retained_all WHERE topic = 'sql/delta'",
        "SELECT count(*) FROM messages VERSION AS OF 0",
        "DESCRIBE DETAIL messages",
        "DESCRIBE HISTORY retained")
    history = got[0].split("|")  # the newest version first
    assert int(history[0]) >= newest, got[0]
    assert history[-1].startswith("delta-rs"), got[0]  # engineInfo: written by delta-rs
    assert got[1:5] == ["0", "0", "1", "0"], got
    assert got[5].startswith("delta|"), got[5]  # format
    assert got[6].startswith("ERROR [EXPECT_TABLE_NOT_VIEW"), got[6]  # retained: the current rows, a view
    # lakegate sql against the same catalog (no views of its own)
    res = lakegate_sql(data, port, f"SELECT count(*) AS n FROM retained_all VERSION AS OF {before} "
                                   "WHERE topic = 'sql/delta'")
    assert res.returncode == 0 and FALLBACK not in res.stderr, res.stderr
    assert res.stdout.split() == ["n", "0"]
    res = lakegate_sql(data, port, "DESCRIBE HISTORY messages")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("version,timestamp,"), res.stdout[:200]
    # issue 41's "done when": lakegate sql answers DESCRIBE HISTORY retained, the history of the table
    # whose current rows the view retained shows, and says so
    res = lakegate_sql(data, port, "describe history `retained` limit 1")
    assert res.returncode == 0, res.stderr
    assert "the history of retained_all" in res.stderr and res.stdout.startswith("version,timestamp,")
    assert int(res.stdout.splitlines()[1].split(",")[0]) >= newest, res.stdout[:300]


_OFF = ("through SQL is off: sql.allow_maintenance = false in the configuration of the lakegate process serving "
        "this SQL (lakegate compact runs OPTIMIZE and VACUUM)")


def test_optimize_and_vacuum_through_the_endpoint_are_refused_by_default_in_one_line(run):
    _lg, data, port = run
    res = lakegate_sql(data, port, "OPTIMIZE messages")
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"lakegate: sql: OPTIMIZE {_OFF}"], res.stderr
    path = str(data / "tables" / "messages")
    got = generic_client(port, "OPTIMIZE retained_all", f"OPTIMIZE delta.`{path}`", "VACUUM messages",
                         "VACUUM quarantine RETAIN 200 HOURS", "REORG TABLE messages APPLY (PURGE)")
    assert got == [f"ERROR OPTIMIZE {_OFF}", f"ERROR OPTIMIZE {_OFF}", f"ERROR VACUUM {_OFF}",
                   f"ERROR VACUUM {_OFF}", f"ERROR REORG TABLE {_OFF}"], got
    from deltalake import DeltaTable

    ops = {h["operation"] for t in ("messages", "retained", "quarantine")
           for h in DeltaTable(str(data / "tables" / t)).history()}
    assert not ops & {"OPTIMIZE", "VACUUM START", "VACUUM END", "REORG"}, ops


def test_with_the_endpoint_off_lakegate_sql_says_so_and_answers_from_a_local_session(run, tmp_path):
    """The local session without delta-spark's jars (LAKEGATE_JVM_DIR empty): its own
    views through delta-rs (tests/tables/test_sql_command.py has the one with them)."""
    _lg, data, _port = run
    nobody = free_port()  # nothing listens here: a run with sql.connect_port=0 serves no endpoint
    res = lakegate_sql(data, nobody, "SELECT count(*) AS n FROM retained WHERE topic = 'sql/dev/1'", timeout=180,
                       env={"LAKEGATE_JVM_DIR": str(tmp_path)})
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
    with environ(env):
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert f"session sc://127.0.0.1:{port}" in text, text[:2000]
    assert FALLBACK not in text


def test_a_wildcard_bind_is_dialled_on_loopback_with_the_token():
    from bridge.sqlserve.endpoint import spark_conf, url

    cfg = load_config(None, ["sql.connect_host=0.0.0.0", "sql.connect_token=s3cret", "sql.connect_port=15099"], env={})
    assert url(cfg) == "sc://127.0.0.1:15099/;token=s3cret"
    conf = spark_conf(cfg)
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert conf["spark.connect.authenticate.token"] == "s3cret"
    assert spark_conf(load_config(None, ["sql.connect_port=0"], env={})) == {}
