"""The embedded default without delta-spark's jars (``LAKEGATE_JVM_DIR`` an
empty folder: no ``lib/delta``): ``lakegate run``'s endpoint serves the same
names through Python data sources over delta-rs (bridge/sqlserve/delta_source.py),
read at the newest version per query, with time travel by the data source's
options; ``lakegate sql`` through it answers from views of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.sqlserve.endpoints import (FALLBACK, lakegate_sql, retained_version, start_run,
                                      the_views_after_one_publish)


@pytest.fixture(scope="module")
def run_without_delta(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sqlserve-nodelta")
    (tmp / "jvm").mkdir()
    lg, data, port = start_run(tmp, env={"LAKEGATE_JVM_DIR": str(tmp / "jvm")})
    try:
        yield lg, data, port
    finally:
        lg.stop()


def test_without_delta_spark_the_endpoint_serves_the_names_through_python_data_sources(run_without_delta):
    lg, data, port = run_without_delta
    assert "Python data sources over delta-rs: no delta-spark" in lg.log_text(), lg.tail()
    version = retained_version(data)
    got = the_views_after_one_publish(lg, data, port, "sql/nodelta", "DESCRIBE HISTORY messages")
    # no Delta SQL without delta-spark: Spark's own DESCRIBE, of a table named HISTORY
    assert got[0].startswith("ERROR [TABLE_OR_VIEW_NOT_FOUND] The table or view `HISTORY`"), got[5]
    # time travel without lakegate's code: the lakegate_table data source, by options
    old = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom pyspark.sql import SparkSession\n"
        f"s = SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate()\n"
        f"df = s.read.format('lakegate_table').option('delta_dir', {str(data / 'tables' / 'retained')!r})"
        f".option('table', 'retained').option('version', '{version}').load()\n"
        "print(df.where(\"topic = 'sql/nodelta'\").count())\n")], capture_output=True, text=True, timeout=120, cwd="/")
    assert old.returncode == 0, old.stderr[-1500:]
    assert old.stdout.split() == ["0"]
    # lakegate sql through it: views of its own, at the newest version or --as-of
    res = lakegate_sql(data, port, "SELECT count(*) AS n FROM retained WHERE topic = 'sql/nodelta'")
    assert res.returncode == 0 and FALLBACK not in res.stderr, res.stderr
    assert res.stdout.split() == ["n", "1"]
    res = lakegate_sql(data, port, "--as-of", str(version), "SELECT count(*) AS n FROM retained_all "
                                                              "WHERE topic = 'sql/nodelta'")
    assert res.stdout.split() == ["n", "0"], res.stderr
