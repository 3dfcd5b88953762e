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
interpreter is unknown it raises :class:`ExecutorPythonUnknown`, one line
saying what to set. No Spark import here: the session factory applies the
choice before the SparkContext starts.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import MutableMapping

__all__ = ["ENV", "CONF", "ExecutorPython", "ExecutorPythonUnknown", "choose", "apply"]

log = logging.getLogger(__name__)

#: The environment variable PySpark's driver reads for the executors' Python.
ENV = "PYSPARK_PYTHON"
#: The Spark property spark-submit turns into $PYSPARK_PYTHON for the driver.
CONF = "spark.pyspark.python"


class ExecutorPythonUnknown(RuntimeError):
    """The executors' Python cannot be chosen; the message is one line saying what to set."""


@dataclass(frozen=True)
class ExecutorPython:
    """The executors' interpreter and where it came from (``"PYSPARK_PYTHON"`` or ``"driver"``)."""

    python: str
    source: str


def choose(environ: MutableMapping[str, str] | None = None, executable: str | None = None) -> ExecutorPython:
    """The executors' Python: ``$PYSPARK_PYTHON`` when set, else the driver's interpreter.

    Raises :class:`ExecutorPythonUnknown` when neither is known (an embedded
    interpreter with an empty ``sys.executable``).
    """
    env = os.environ if environ is None else environ
    user = env.get(ENV, "").strip()
    if user:
        return ExecutorPython(user, ENV)
    exe = sys.executable if executable is None else executable
    if not exe:
        raise ExecutorPythonUnknown(
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
