"""The capture log: the edge appends every accepted MQTT frame, the Spark
job reads it as a stream. A small Kafka-style partition log: Kafka-shaped
records (``schemas.capture``), N partitions, segment files with an offset
index, a CRC per record, group commit with fsync, back-pressure, and
retention below the consumers' committed offsets.

Writer: :class:`CaptureLog` (one process per directory). Readers:
:class:`LogReader` (any process), and the Spark source in
``bridge.spark.source``. The on-disk format is described in
:mod:`bridge.capture.segment`, :mod:`bridge.capture.record` and
:mod:`bridge.capture.layout`.
"""

from bridge.capture.commits import commit_offsets, read_commits
from bridge.capture.errors import (
    BackPressureTimeout,
    CaptureError,
    CaptureWriteError,
    CorruptRecordError,
    LogClosedError,
    LogFormatError,
    LogLockedError,
    LogMismatchError,
    LogUnavailableError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from bridge.capture.open import durable_ends, open_capture_log, open_reader
from bridge.capture.reader import LogReader, PartitionStats
from bridge.capture.record import Record, partition_for
from bridge.capture.writer import Ack, CaptureLog

__all__ = [
    "Ack",
    "BackPressureTimeout",
    "CaptureError",
    "CaptureLog",
    "CaptureWriteError",
    "CorruptRecordError",
    "LogClosedError",
    "LogFormatError",
    "LogLockedError",
    "LogMismatchError",
    "LogReader",
    "LogUnavailableError",
    "OffsetOutOfRangeError",
    "PartitionStats",
    "Record",
    "RecordTooLargeError",
    "commit_offsets",
    "durable_ends",
    "open_capture_log",
    "open_reader",
    "partition_for",
    "read_commits",
]
