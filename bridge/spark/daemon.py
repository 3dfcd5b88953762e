"""Spark's Python daemon (``pyspark.daemon``) with the job's modules imported first.

Spark forks each Python worker from this daemon. It also stops a worker
that has been idle for a minute (``PythonWorkerFactory``, not configurable),
so after an idle minute the next micro-batch waits for new workers, and each
imported pandas, pyarrow and the parser again: 0.5-0.7 s of a 0.4 s batch
(``lakegate bench job --idle 60``). Imported here, before the daemon forks,
a new worker starts with them already loaded (copy-on-write), whenever it
is forked. The session factory names this module as
``spark.python.daemon.module`` for local sessions; it must be importable by
the executors' Python (it is wherever lakegate is installed).
"""

from __future__ import annotations

import pandas  # noqa: F401 - preloaded for the forked workers
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401

import bridge.parse.frames  # noqa: F401 - the pandas UDF's parser
import bridge.parse.udf  # noqa: F401
import bridge.spark.source  # noqa: F401 - the source's read() runs in these workers too

from pyspark.daemon import manager

if __name__ == "__main__":
    manager()
