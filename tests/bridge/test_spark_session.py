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


def test_local_jvm_runs_with_spark_java_options_c1_only_serial_gc_by_default(spark):
    """spark.java_options reaches the local JVM (C1 JIT only and the serial
    collector by default: docs/job.md, The local JVM)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j handle, no public API for the JVM's arguments
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in args and "-XX:+UseSerialGC" in args
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in args)  # the project's log4j2 file too
