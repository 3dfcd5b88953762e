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
