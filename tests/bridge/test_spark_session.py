import pandas as pd
import pytest

pytestmark = pytest.mark.spark


def test_session_runs_a_pandas_udf(spark):
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("long")
    def plus_one(s: pd.Series) -> pd.Series:
        return s + 1

    rows = spark.range(5).select(plus_one("id").alias("v")).collect()
    assert [r.v for r in rows] == [1, 2, 3, 4, 5]


def test_session_is_local_and_quiet(spark):
    assert spark.sparkContext.master.startswith("local")
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


def test_local_jvm_runs_with_spark_java_options_c1_only_by_default(spark):
    """spark.java_options reaches the local JVM (C1 JIT only by default: README, where the CPU goes)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j handle, no public API for the JVM's arguments
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in args
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in args)  # the project's log4j2 file too


def test_python_workers_fork_from_the_daemon_that_preloaded_the_parser(spark):
    """bridge/spark/daemon.py: a worker Spark forks (also after an idle minute)
    starts with the parser, pandas and pyarrow imported."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("boolean")
    def preloaded(s: pd.Series) -> pd.Series:
        import sys

        return s.map(lambda _: "bridge.parse.frames" in sys.modules and "bridge.spark.source" in sys.modules)

    assert spark.conf.get("spark.python.daemon.module") == "bridge.spark.daemon"
    assert all(r.v for r in spark.range(4).select(preloaded("id").alias("v")).collect())
