"""A DDL string as a Spark ``StructType`` (no JVM needed, but it imports
pyspark): apart from :mod:`schemas.ddl` so that what reads the schemas
without Spark (the edge, the capture log, delta-rs) never imports it."""

from __future__ import annotations

from schemas.ddl import Type, parse_ddl

__all__ = ["to_spark"]


def _spark_type(t: Type):
    from pyspark.sql import types as T

    prim = {
        "BOOLEAN": T.BooleanType(), "TINYINT": T.ByteType(), "SMALLINT": T.ShortType(),
        "INT": T.IntegerType(), "BIGINT": T.LongType(), "FLOAT": T.FloatType(),
        "DOUBLE": T.DoubleType(), "STRING": T.StringType(), "BINARY": T.BinaryType(),
        "DATE": T.DateType(), "TIMESTAMP": T.TimestampType(),
    }
    if t.name in prim:
        return prim[t.name]
    if t.name == "ARRAY":
        return T.ArrayType(_spark_type(t.args[0]), True)
    if t.name == "MAP":
        return T.MapType(_spark_type(t.args[0]), _spark_type(t.args[1]), True)
    return T.StructType([T.StructField(f.name, _spark_type(f.type), f.nullable) for f in t.args])


def to_spark(ddl: str):
    """The pyspark StructType for a DDL string (no JVM needed)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, _spark_type(f.type), f.nullable) for f in parse_ddl(ddl)])
