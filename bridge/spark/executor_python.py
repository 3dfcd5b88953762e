"""Which Python the executors run, under spark-submit.

PySpark sends every Python function with the interpreter to run it
(``SparkContext.pythonExec``): ``$PYSPARK_PYTHON`` in the driver process when
its SparkContext starts (spark-submit puts ``spark.pyspark.python`` there),
else ``python3``. On a standalone or YARN cluster that bare ``python3`` is
whatever the worker's PATH finds, usually a system Python without pyarrow or
lakegate, and the first batch fails on the executors with
``ModuleNotFoundError: No module named 'pyarrow'``.

:func:`choose` keeps a Python the user set and otherwise picks the driver's
own interpreter (``sys.executable``, the venv's python, unresolved so that
the venv is used): the assumption is that the same venv path exists on the
workers (one machine, a shared file system or one image). Where the driver's
interpreter is unknown it raises :class:`ExecutorPythonError`, one line
saying what to set. The session factory applies the choice before the
SparkContext starts, then, on a cluster master, :func:`check_executors` runs
one tiny task that imports lakegate there, so a Python the workers do not
have fails at start, in one line, not at the first batch.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, MutableMapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ENV", "CONF", "ExecutorPython", "ExecutorPythonError", "choose", "apply", "check_executors",
           "probe"]

log = logging.getLogger(__name__)

#: The environment variable PySpark's driver reads for the executors' Python.
ENV = "PYSPARK_PYTHON"
#: The Spark property spark-submit turns into $PYSPARK_PYTHON for the driver.
CONF = "spark.pyspark.python"


class ExecutorPythonError(RuntimeError):
    """The executors' Python cannot be chosen or cannot run lakegate; the message is one line saying what to set."""


@dataclass(frozen=True)
class ExecutorPython:
    """The executors' interpreter and where it came from (``"PYSPARK_PYTHON"`` or ``"driver"``)."""

    python: str
    source: str


def choose(environ: MutableMapping[str, str] | None = None, executable: str | None = None) -> ExecutorPython:
    """The executors' Python: ``$PYSPARK_PYTHON`` when set, else the driver's interpreter.

    Raises :class:`ExecutorPythonError` when neither is known (an embedded
    interpreter with an empty ``sys.executable``).
    """
    env = os.environ if environ is None else environ
    user = env.get(ENV, "").strip()
    if user:
        return ExecutorPython(user, ENV)
    exe = sys.executable if executable is None else executable
    if not exe:
        raise ExecutorPythonError(
            f"lakegate: cannot tell which Python the Spark executors should run (this interpreter's path is "
            f"unknown): set {ENV} (or --conf {CONF}=...) to a Python with lakegate installed on every worker")
    return ExecutorPython(exe, "driver")


def apply(environ: MutableMapping[str, str] | None = None, executable: str | None = None) -> ExecutorPython:
    """Choose the executors' Python and put it in ``$PYSPARK_PYTHON`` (before the SparkContext starts)."""
    env = os.environ if environ is None else environ
    chosen = choose(env, executable)
    env[ENV] = chosen.python
    log.info("spark executors' python: %s (from %s)", chosen.python, chosen.source)
    return chosen


#: What an executor says when the Python it was given cannot run lakegate.
_CAUSE = re.compile(r"((?:ModuleNotFoundError|ImportError): [^\n]+|Cannot run program [^\n]+)")


def probe(_: Any) -> str:
    """Runs on an executor: imports what the job's Python code needs there; returns the interpreter."""
    import pandas  # noqa: F401 - the imports are the check
    import pyarrow  # noqa: F401 - the imports are the check

    import bridge.parse.udf  # noqa: F401 - the imports are the check (the parse UDF's module)

    return sys.executable


def failure(python: str, error: str) -> str:
    """The one line for executors that cannot run lakegate with ``python``."""
    m = _CAUSE.search(error)
    cause = m.group(1).strip() if m else next((ln.strip() for ln in error.splitlines() if ln.strip()), "unknown error")
    return (f"lakegate: the Spark executors cannot run lakegate with {python} ({cause[:300]}): install lakegate "
            f"there on every worker, or set {ENV} (or --conf {CONF}=...) to a Python that has it")


def check_executors(spark: "SparkSession", python: str) -> None:
    """On a cluster master, one task that imports lakegate on an executor; local masters are skipped.

    Raises :class:`ExecutorPythonError` (one line) when the task fails.
    """
    sc = spark.sparkContext
    if sc.master.startswith("local"):
        return
    try:
        where = sc.parallelize([0], 1).map(probe).collect()
    except Exception as exc:  # Py4JJavaError: the task's failure, with the executor's traceback as text
        raise ExecutorPythonError(failure(python, str(exc))) from None
    log.info("spark executors run lakegate with %s", where[0] if where else python)
