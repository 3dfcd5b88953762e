import pyarrow as pa
import pytest

from schemas.capture import CAPTURE_RECORD_DDL
from schemas.ddl import parse_ddl, to_arrow
from schemas.spark import to_spark


def test_capture_record_is_kafka_shaped_in_arrow():
    s = to_arrow(CAPTURE_RECORD_DDL)
    assert s.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert s.field("headers").type == pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    assert s.field("offset").type == pa.int64()
    assert s.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_not_null_and_nested_types():
    f = parse_ddl("a INT NOT NULL, b MAP<STRING, ARRAY<BIGINT>>, `c d` STRUCT<x: DOUBLE NOT NULL>")
    assert [x.name for x in f] == ["a", "b", "c d"]
    assert f[0].nullable is False
    s = to_arrow("a INT NOT NULL, b MAP<STRING, ARRAY<BIGINT>>")
    assert s.field("a").nullable is False
    assert s.field("b").type == pa.map_(pa.string(), pa.list_(pa.int64()))


@pytest.mark.parametrize("bad", ["a INTT", "a ARRAY<INT", "a INT,", "a STRUCT<x INT y INT>"])
def test_bad_ddl_raises(bad):
    with pytest.raises(ValueError, match="^DDL: "):
        parse_ddl(bad)


@pytest.mark.spark
def test_to_spark_agrees_with_sparks_own_parser(spark):
    from pyspark.sql.types import StructType

    ddl = CAPTURE_RECORD_DDL + ", m MAP<STRING, INT>, d DATE, b BOOLEAN, s SMALLINT, t TINYINT, f DOUBLE"
    theirs = StructType.fromDDL(ddl) if hasattr(StructType, "fromDDL") else spark.createDataFrame([], ddl).schema
    assert to_spark(ddl) == theirs


def test_frame_row_has_unique_column_names_and_contains_every_table_column():
    from schemas.ddl import field_names
    from schemas.frames import PARSED_FRAME_DDL
    from schemas.tables import FRAME_ROW_DDL, PARSED_RENAMES, TABLES

    names = field_names(FRAME_ROW_DDL)
    assert len(names) == len(set(names))
    parsed = [PARSED_RENAMES.get(n, n) for n in field_names(PARSED_FRAME_DDL)]
    assert set(parsed) <= set(names)
    for table, ddl in TABLES.items():
        extra = {"deleted", "set_at", "expires_at", "frame_size", "parser_rule", "parser_error"}  # computed
        assert set(field_names(ddl)) - extra <= set(names), table
