"""The Spark job's frame parser: :func:`bridge.parse.parse_frames` as one
scalar pandas UDF.

Use on the job's context columns (``schemas.tables.CONTEXT_DDL``)::

    parsed = frames_udf()("frame", "protocol_level", "alias_topic", "origin")
    rows = context.select("*", parsed.alias("p")).select("*", "p.*").drop("p")

The UDF returns a struct with exactly ``schemas.frames.PARSED_FRAME_DDL``'s
fields. ``origin`` says who sent the frame: ``"tap"`` frames were sent by a
broker (server to client); every other origin is client to server.

Runtime contract: :func:`parse_frames_pandas` runs on executors, once per
Arrow batch (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows); it is a
module-level function, so it pickles by reference, and it imports the parser
inside. pandas is imported at module level because pandas_udf reads the
function's type hints.
"""

from __future__ import annotations

import pandas as pd  # needed at import time: pandas_udf inspects the type hints

__all__ = ["frames_udf", "parse_frames_pandas"]


def parse_frames_pandas(frame: pd.Series, protocol_level: pd.Series, alias_topic: pd.Series,
                        origin: pd.Series) -> pd.DataFrame:
    """pandas in, pandas out: parse one batch of captured frames.

    Runs on executors (picklable, module level). The conversion from the
    parser's Arrow table to pandas happens in Arrow's C++ code; no Python
    loop over rows here.
    """
    from bridge.parse.frames import parse_frames

    from_client = (origin != "tap").to_numpy(dtype=bool, na_value=True)
    # payloads stay in the frames' buffer: to_pandas copies each into its bytes
    # object anyway, so a copy in between would be wasted
    table = parse_frames(frame, protocol_level, alias_topic, from_client=from_client,
                         payload_views=True)
    # nullable integers and booleans as pandas extension columns: exact values
    # (no float round trip) and no Python object per row
    return table.to_pandas(types_mapper=_NULLABLE.get)


def _nullable_types() -> dict:
    import pyarrow as pa

    return {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
            pa.bool_(): pd.BooleanDtype()}


_NULLABLE = _nullable_types()


def frames_udf():
    """The pandas UDF (driver side; needs pyspark). Its return type is
    ``schemas.frames.PARSED_FRAME_DDL`` as a Spark struct."""
    from pyspark.sql.functions import pandas_udf

    from schemas.spark import to_spark
    from schemas.frames import PARSED_FRAME_DDL

    return pandas_udf(parse_frames_pandas, to_spark(PARSED_FRAME_DDL))
