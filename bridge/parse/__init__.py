"""Vectorised parsing of captured MQTT frames (Spark-free).

:func:`parse_frames` turns a batch of raw frames into the typed columns of
``schemas.frames.PARSED_FRAME_DDL``; :mod:`bridge.parse.udf` wraps it as the
Spark job's pandas UDF. Runs on executors: numpy, pyarrow and the pure-Python
codec tables only.
"""

from bridge.parse.frames import PARSED_SCHEMA, PARSED_VIEW_SCHEMA, parse_frames

__all__ = ["PARSED_SCHEMA", "PARSED_VIEW_SCHEMA", "parse_frames"]
