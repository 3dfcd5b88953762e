"""Spark's Python daemon (``pyspark.daemon``) with the job's modules imported first.

Spark forks each Python worker from this daemon. It also stops a worker
that has been idle for a minute (``PythonWorkerFactory``, not configurable),
so after an idle minute the next micro-batch waits for new workers. What a
new worker paid, measured with py-spy on the floor query (``lakegate bench
job``'s ``toArrow`` batch, 0.2 s warm, 0.42 s after 70 s idle, 0.19 s after
40 s):

* importing pandas, pyarrow and the parser (0.5-0.7 s before this module
  existed): imported here, before the daemon forks, so a new worker has
  them already (copy-on-write), and so are the modules Spark's worker, the
  source's reader and the UDF import on their first task;
* reading Spark's ``pyspark.zip`` and ``py4j-*-src.zip`` again, 0.2 s: the
  workers' ``PYTHONPATH`` starts with them (Spark puts ``$SPARK_HOME/python/lib``
  first), and each new worker's first task calls ``importlib.invalidate_caches()``
  (``pyspark.worker_util.setup_spark_files``), which makes every zip on the
  path read its whole directory again; modules imported from a zip are also
  compiled from source in every process (no ``.pyc``). When ``pyspark`` and
  ``py4j`` are installed as packages and the zips are the installed
  pyspark's own (a pip install: ``$SPARK_HOME`` is the package), the daemon
  drops the zips from ``sys.path`` before importing anything of Spark's:
  the same code, from the installed files and their cached bytecode.

The session factory names this module as ``spark.python.daemon.module`` for
local sessions; it must be importable by the executors' Python (it is
wherever lakegate is installed).
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder


def spark_zips_to_drop(path: list[str]) -> list[str]:
    """Entries of ``path`` that are Spark's ``pyspark.zip`` / ``py4j-*-src.zip``
    inside the very pyspark package the rest of ``path`` imports, and only
    when the rest imports ``py4j`` too. Anything else (a Spark distribution's
    zips under another ``SPARK_HOME``, a cluster without pyspark installed)
    is kept: an empty list."""
    zips = [p for p in path if os.path.basename(p) == "pyspark.zip"
            or (os.path.basename(p).startswith("py4j-") and p.endswith("-src.zip"))]
    if not zips:
        return []
    rest = [p for p in path if p not in zips]
    pyspark, py4j = PathFinder.find_spec("pyspark", rest), PathFinder.find_spec("py4j", rest)
    if pyspark is None or py4j is None or not pyspark.submodule_search_locations:
        return []
    home = os.path.realpath(list(pyspark.submodule_search_locations)[0])
    inside = [z for z in zips if os.path.realpath(z).startswith(home + os.sep)]
    return inside if len(inside) == len(zips) else []


def _drop_spark_zips() -> None:
    drop = spark_zips_to_drop(sys.path)
    if drop:
        sys.path[:] = [p for p in sys.path if p not in drop]
        for p in drop:
            sys.path_importer_cache.pop(p, None)


#: imported before the daemon forks (what a worker's first task imports otherwise); a
#: module this pyspark does not have is skipped: preloading only saves time
PRELOAD = (
    "pandas", "pyarrow", "pyarrow.compute", "pyarrow.pandas_compat",
    "bridge.parse.frames", "bridge.parse.udf",  # the pandas UDF's parser
    "bridge.spark.source", "bridge.capture.reader", "bridge.capture.arrowcols",  # the source's read()
    "pyspark.worker_util", "pyspark.logger.worker_io", "pyspark.sql.datasource_internal",
    "pyspark.sql.streaming.stateful_processor_util", "pyspark.sql.worker.plan_data_source_read",
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; returns the names that could not be imported."""
    import importlib

    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


if __name__ == "__main__":
    _drop_spark_zips()  # before anything imports pyspark
    preload()
    from pyspark.daemon import manager

    manager()
