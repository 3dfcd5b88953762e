"""Spark's Python workers, forked from ``bridge.spark.daemon``: the job's
modules preloaded, and Spark's own zips off ``sys.path`` when pyspark is
installed (a new worker re-read them and compiled pyspark from them: 0.2 s of
the first batch after an idle minute)."""

from __future__ import annotations

import os
import sys
import zipfile

import pyspark

from bridge.spark.daemon import PRELOAD, spark_zips_to_drop

HOME = os.path.dirname(pyspark.__file__)


def _zips(home: str) -> list[str]:
    return [os.path.join(home, "python", "lib", "pyspark.zip"),
            os.path.join(home, "python", "lib", "py4j-0.10.9.9-src.zip")]


def test_the_installed_pysparks_own_zips_are_dropped():
    path = [*_zips(HOME), "/somewhere/else", *sys.path]
    assert spark_zips_to_drop(path) == _zips(HOME)
    assert spark_zips_to_drop(sys.path) == []  # nothing to drop


def test_zips_of_another_spark_home_are_kept(tmp_path):
    """A SPARK_HOME of a Spark distribution: its zips may hold another version."""
    other = tmp_path / "spark-4.0.0"
    (other / "python" / "lib").mkdir(parents=True)
    for z in _zips(str(other)):
        with zipfile.ZipFile(z, "w") as f:
            f.writestr("pyspark/__init__.py", "")
    assert spark_zips_to_drop([*_zips(str(other)), *sys.path]) == []
    # one of them inside the installed package and one outside: both kept
    assert spark_zips_to_drop([_zips(HOME)[0], _zips(str(other))[1], *sys.path]) == []


def test_zips_are_kept_when_pyspark_is_not_installed_on_the_path(tmp_path):
    """A cluster's Python that has pyspark only through the zips."""
    assert spark_zips_to_drop([*_zips(HOME), str(tmp_path)]) == []


def test_workers_import_pyspark_from_the_installed_package_with_the_preloads(spark):
    """In the workers of the project's local session: no Spark zip on
    sys.path, pyspark from site-packages, every PRELOAD module already
    imported when a task starts (forked from the daemon)."""
    import pyspark.sql.functions as F
    from pyspark.sql.types import StringType

    @F.udf(StringType())
    def probe(_x):
        import json
        import sys as s

        return json.dumps({"zips": [p for p in s.path if p.endswith(("pyspark.zip", "-src.zip"))],
                           "pyspark": s.modules["pyspark"].__file__,
                           "loaded": sorted(m for m in PRELOAD if m in s.modules)})

    import json

    assert spark.conf.get("spark.python.daemon.module") == "bridge.spark.daemon"
    got = json.loads(spark.range(1).select(probe("id")).first()[0])
    assert got["zips"] == [], got
    assert ".zip" not in got["pyspark"] and os.path.realpath(got["pyspark"]) == os.path.realpath(pyspark.__file__), got
    assert got["loaded"] == sorted(PRELOAD), got
