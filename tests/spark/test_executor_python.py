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
import sys

import pyspark.sql
import pytest

from bridge.config import load_config
from bridge.spark.executor_python import ExecutorPythonUnknown, choose
from bridge.spark.session import build_session


def test_choose_is_the_driver_interpreter_when_nothing_is_set():
    chosen = choose({}, "/opt/lakegate/.venv/bin/python3")
    assert chosen.python == "/opt/lakegate/.venv/bin/python3" and chosen.source == "driver"


def test_choose_keeps_the_users_pyspark_python():
    chosen = choose({"PYSPARK_PYTHON": "/srv/py/bin/python"}, "/opt/lakegate/.venv/bin/python3")
    assert chosen.python == "/srv/py/bin/python" and chosen.source == "PYSPARK_PYTHON"


def test_unknown_interpreter_fails_in_one_line_saying_what_to_set():
    with pytest.raises(ExecutorPythonUnknown) as exc:
        choose({"PYSPARK_PYTHON": "  "}, "")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("lakegate: ")
    assert "PYSPARK_PYTHON" in msg and "spark.pyspark.python" in msg and "every worker" in msg


class _FakeSession:
    """Records the builder's settings and what $PYSPARK_PYTHON was when the context started."""

    seen: dict = {}

    class _Ctx:
        master = "spark://127.0.0.1:7077"

        def setLogLevel(self, level):  # noqa: N802 - PySpark's name
            pass

    class _Builder:
        def __init__(self):
            self.conf = {}

        def appName(self, name):  # noqa: N802
            return self

        def config(self, k, v):
            self.conf[k] = v
            return self

        def getOrCreate(self):  # noqa: N802
            _FakeSession.seen = {"conf": dict(self.conf), "env": os.environ.get("PYSPARK_PYTHON")}
            s = _FakeSession()
            s.sparkContext = _FakeSession._Ctx()
            s.version = "fake"
            return s

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


def test_spark_submit_session_keeps_a_pyspark_python_the_user_set(under_submit):
    under_submit.setenv("PYSPARK_PYTHON", "/srv/py/bin/python")
    build_session(load_config(None, [], env={}), app_name="t")
    assert _FakeSession.seen["env"] == "/srv/py/bin/python"
    assert _FakeSession.seen["conf"]["spark.pyspark.python"] == "/srv/py/bin/python"
