"""A ``lakegate run`` whose configuration allows maintenance through SQL
(``sql.allow_maintenance = true``): OPTIMIZE through its endpoint compacts
the files the delta-rs engine wrote; a VACUUM RETAIN below
``tables.vacuum_retention_hours`` is still refused in one line. Then a
client whose endpoint goes away (the run killed) gets an error that says so:
the last test of the module, it ends the module's run (one JVM fewer than a
run of its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.sqlserve.endpoints import ROOT, lakegate_sql, publish, start_run, version
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def allowing_run(tmp_path_factory):
    lg, data, port = start_run(tmp_path_factory.mktemp("sqlserve-allowing"), "sql.allow_maintenance=true")
    try:
        yield lg, data, port
    finally:
        lg.stop()


def test_optimize_through_the_endpoint_when_the_operator_allows_it(allowing_run):
    from deltalake import DeltaTable

    lg, data, port = allowing_run
    for i in range(2):  # two batches: two small files in messages' partition of the day
        before = version(data, "messages")
        publish(lg.port, f"sql/opt/{i}", b"x", retain=False)
        assert wait_for(lambda: version(data, "messages") > before, timeout=60), lg.tail()
    messages = DeltaTable(str(data / "tables" / "messages"))
    files = len(messages.file_uris())
    assert files >= 2
    res = lakegate_sql(data, port, "OPTIMIZE messages")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("path,metrics\n"), res.stdout
    messages.update_incremental()
    assert messages.history(1)[0]["operation"] == "OPTIMIZE"
    assert len(messages.file_uris()) < files
    res = lakegate_sql(data, port, "SELECT count(*) AS n FROM messages WHERE topic LIKE 'sql/opt/%'")
    assert res.stdout.split() == ["n", "2"], res.stderr
    res = lakegate_sql(data, port, "VACUUM messages RETAIN 1 HOURS")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["lakegate: sql: VACUUM ... RETAIN 1.0 HOURS is below tables.vacuum_retention_hours = 168 "
                     "(readers and time travel may still need those files)"], res.stderr


def test_a_client_whose_endpoint_goes_away_gets_an_error_that_says_so_not_a_hang(allowing_run):
    """The run stops (its Spark session restarts, or it was killed) while a client holds a
    session: the next query fails within seconds, and the error is told from a query's."""
    lg, data, port = allowing_run
    code = ("import sys, time\n"
            "from bridge.config import load_config\n"
            "from bridge.sqlserve.client import open_session, endpoint_gone, one_line_error\n"
            f"cfg = load_config(None, ['data_dir={data}', 'sql.connect_port={port}'], env={{}})\n"
            "s = open_session(cfg, 'test').spark\n"
            "print(s.sql('SELECT 1 AS x').first().x, flush=True)\n"
            "sys.stdin.readline()\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    s.sql('SELECT 2').collect()\n"
            "    print('answered')\n"
            "except Exception as exc:\n"
            "    print(endpoint_gone(exc), round(time.monotonic() - t0, 1), one_line_error(exc), flush=True)\n")
    client = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "1"
    lg.kill()
    out, err = client.communicate("go\n", timeout=60)
    gone, took, line = out.strip().split(" ", 2)
    assert gone == "True", (out, err[-500:])
    assert float(took) < 15
    assert line.startswith("the endpoint stopped answering"), line
