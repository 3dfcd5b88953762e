"""The executors' Python under spark-submit (bridge/spark/executor_python.py).

Without it the job on a standalone cluster failed on the executors with
``ModuleNotFoundError: No module named 'pyarrow'``: PySpark shipped its
functions with a bare ``python3``, the workers' system Python.
``tests/cluster`` runs the job on a real standalone cluster; these check the
choice and that the session factory applies it before the SparkContext starts,
with a stand-in SparkSession (no JVM).
"""

from __future__ import annotations

import os
import re
import sys

import pyspark.sql
import pytest

from bridge.config import load_config
from bridge.spark.executor_python import ExecutorPythonError, choose, failure, probe
from bridge.spark.session import build_session


def test_choose_is_the_driver_interpreter_when_nothing_is_set():
    chosen = choose({}, "/opt/lakegate/.venv/bin/python3")
    assert chosen.python == "/opt/lakegate/.venv/bin/python3" and chosen.source == "driver"


def test_choose_keeps_the_users_pyspark_python():
    chosen = choose({"PYSPARK_PYTHON": "/srv/py/bin/python"}, "/opt/lakegate/.venv/bin/python3")
    assert chosen.python == "/srv/py/bin/python" and chosen.source == "PYSPARK_PYTHON"


def test_unknown_interpreter_fails_in_one_line_saying_what_to_set():
    with pytest.raises(ExecutorPythonError) as exc:
        choose({"PYSPARK_PYTHON": "  "}, "")
    assert re.fullmatch(r"lakegate: cannot tell which Python the Spark executors should run \(this interpreter's "
                        r"path is unknown\): set PYSPARK_PYTHON \(or --conf spark\.pyspark\.python=\.\.\.\) to a "
                        r"Python with lakegate installed on every worker", str(exc.value))


class _FakeSession:
    """Records the builder's settings and what $PYSPARK_PYTHON was when the context started."""

    seen: dict = {}

    class _Ctx:
        master = "spark://127.0.0.1:7077"
        #: what the probe task on an executor raises (None: it runs)
        task_error: str | None = None

        def setLogLevel(self, level):  # noqa: N802 - PySpark's name
            pass

        def parallelize(self, data, n):
            ctx = self

            class _Rdd:
                def map(self, f):
                    return self

                def collect(self):
                    _FakeSession.seen["probed"] = True
                    if ctx.task_error:
                        raise RuntimeError(ctx.task_error)
                    return [sys.executable]

            return _Rdd()

    class _Builder:
        def __init__(self):
            self.conf = {}

        def appName(self, name):  # noqa: N802 - PySpark's name
            return self

        def config(self, k, v):
            self.conf[k] = v
            return self

        def getOrCreate(self):  # noqa: N802 - PySpark's name
            _FakeSession.seen = {"conf": dict(self.conf), "env": os.environ.get("PYSPARK_PYTHON")}
            s = _FakeSession()
            s.sparkContext = _FakeSession._Ctx()
            s.version = "fake"
            return s

    def stop(self):
        _FakeSession.seen["stopped"] = True

    class _BuilderProp:
        def __get__(self, obj, cls):
            return _FakeSession._Builder()

    builder = _BuilderProp()


@pytest.fixture
def under_submit(monkeypatch):
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # what spark-submit's launcher sets
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(pyspark.sql, "SparkSession", _FakeSession)
    _FakeSession.seen = {}
    return monkeypatch  # undoes delenv whatever build_session wrote to $PYSPARK_PYTHON


def test_spark_submit_session_sets_executors_python_to_the_driver_interpreter(under_submit):
    build_session(load_config(None, [], env={}), app_name="t")
    assert _FakeSession.seen["env"] == sys.executable  # before the SparkContext started
    assert _FakeSession.seen["conf"]["spark.pyspark.python"] == sys.executable
    assert _FakeSession.seen["probed"] and "stopped" not in _FakeSession.seen


#: the text of a Py4JJavaError when the executors' Python lacks pyarrow (abridged from a real run)
TASK_FAILURE = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent failure:
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/x/bridge/spark/executor_python.py", line 90, in probe
    import pyarrow  # noqa: F401
ModuleNotFoundError: No module named 'pyarrow'
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:600)
"""


def test_spark_submit_session_on_workers_without_lakegate_fails_at_start_in_one_line(under_submit):
    under_submit.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    under_submit.setattr(_FakeSession._Ctx, "task_error", TASK_FAILURE)
    with pytest.raises(ExecutorPythonError) as exc:
        build_session(load_config(None, [], env={}), app_name="t")
    assert re.fullmatch(r"lakegate: the Spark executors cannot run lakegate with /usr/bin/python3 "
                        r"\(ModuleNotFoundError: No module named 'pyarrow'\): install lakegate there on every worker, "
                        r"or set PYSPARK_PYTHON \(or --conf spark\.pyspark\.python=\.\.\.\) to a Python that has it",
                        str(exc.value))
    assert _FakeSession.seen["stopped"]


def test_local_master_under_spark_submit_runs_no_probe(under_submit):
    under_submit.setattr(_FakeSession._Ctx, "master", "local[2]")
    build_session(load_config(None, [], env={}), app_name="t")
    assert "probed" not in _FakeSession.seen


def test_probe_imports_the_jobs_python_dependencies():
    assert probe(0) == sys.executable


def test_a_missing_interpreter_is_named_in_one_line():
    text = ("org.apache.spark.SparkException: Job aborted\njava.io.IOException: Cannot run program "
            "\"/srv/lakegate/.venv/bin/python3\": error=2, No such file or directory\n\tat java.base/...")
    assert re.fullmatch(r'lakegate: the Spark executors cannot run lakegate with /srv/lakegate/\.venv/bin/python3 '
                        r'\(Cannot run program "/srv/lakegate/\.venv/bin/python3": error=2, No such file or '
                        r'directory\): install lakegate there on every worker, or set PYSPARK_PYTHON .*',
                        failure("/srv/lakegate/.venv/bin/python3", text))


def test_spark_submit_session_keeps_a_pyspark_python_the_user_set(under_submit):
    under_submit.setenv("PYSPARK_PYTHON", "/srv/py/bin/python")
    build_session(load_config(None, [], env={}), app_name="t")
    assert _FakeSession.seen["env"] == "/srv/py/bin/python"
    assert _FakeSession.seen["conf"]["spark.pyspark.python"] == "/srv/py/bin/python"
