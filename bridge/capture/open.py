"""Open the capture log of a configuration: local files or a Kafka topic.

``capture.backend`` chooses: ``"local"`` is :class:`~bridge.capture.writer.CaptureLog`
and :class:`~bridge.capture.reader.LogReader` on ``config.capture_dir``;
``"kafka"`` is :class:`~bridge.capture.kafka_log.KafkaCaptureLog` and
:class:`~bridge.capture.kafka_reader.KafkaLogReader` on ``config.kafka_topic``.
The Kafka modules (and confluent_kafka) are imported only for ``"kafka"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from bridge.capture.kafka_log import KafkaCaptureLog
    from bridge.capture.kafka_reader import KafkaLogReader
    from bridge.capture.reader import LogReader
    from bridge.capture.writer import CaptureLog

__all__ = ["durable_ends", "open_capture_log", "open_reader"]


def _backend(config) -> str:
    backend = config.capture.backend
    if backend not in ("local", "kafka"):
        raise ValueError(f"capture.backend must be 'local' or 'kafka', not {backend!r}")
    return backend


def open_capture_log(config) -> Union["CaptureLog", "KafkaCaptureLog"]:
    """The capture log writer of ``config`` (the whole :class:`bridge.config.Config`)."""
    if _backend(config) == "kafka":
        from bridge.capture.kafka_log import KafkaCaptureLog

        return KafkaCaptureLog.open(config)
    from bridge.capture.writer import CaptureLog

    return CaptureLog.open(config.capture_dir, config.capture)


def open_reader(config) -> Union["LogReader", "KafkaLogReader"]:
    """A reader of the capture log of ``config``."""
    if _backend(config) == "kafka":
        from bridge.capture.kafka_reader import KafkaLogReader

        return KafkaLogReader(config)
    from bridge.capture.reader import LogReader

    return LogReader(config.capture_dir)


def durable_ends(config) -> list[int]:
    """Per partition, the end of the durable records of ``config``'s capture
    log (on Kafka, the high watermarks), with a reader opened and closed
    for it (a Kafka reader holds consumers: sockets and threads)."""
    reader = open_reader(config)
    try:
        return reader.durable_offsets()
    finally:
        reader.close()
