"""The one source of truth for every record and table schema in lakegate.

Each schema is written once, as a Spark DDL string (``"a INT, b STRING"``),
and turned into an Arrow schema (:func:`schemas.ddl.to_arrow`) or a Spark
StructType (:func:`schemas.spark.to_spark`, which imports pyspark) where it
is needed. Readers, UDF
return types, Delta table creation and tests all use these.
"""

from schemas.ddl import parse_ddl, to_arrow

__all__ = ["parse_ddl", "to_arrow"]
