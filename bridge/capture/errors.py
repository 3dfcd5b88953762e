"""The capture log's errors: one tree, each message names what to look at.

Messages carry partition numbers, offsets, file names and sizes, never
record contents.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BackPressureTimeout",
    "CaptureError",
    "CaptureWriteError",
    "CorruptRecordError",
    "LogClosedError",
    "LogFormatError",
    "LogLockedError",
    "LogMismatchError",
    "LogUnavailableError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
]


class CaptureError(Exception):
    """Base class of every capture log error."""


class LogFormatError(CaptureError):
    """A file is not a capture log file of a version this code reads."""


class CorruptRecordError(CaptureError):
    """A record that should be intact is not: a corrupt record in the middle
    of a partition. Never skipped; names the partition and the offset."""

    def __init__(self, partition: int, offset: int, path: Path | str, position: int, reason: str) -> None:
        self.partition = partition
        self.offset = offset
        self.path = str(path)
        self.position = position
        self.reason = reason
        super().__init__(
            f"capture log partition {partition} offset {offset}: corrupt record ({reason}) "
            f"in {self.path} at byte {position}; records after it are not read"
        )


class OffsetOutOfRangeError(CaptureError):
    """Asked for offsets the partition does not hold (deleted by retention, or
    not yet written/durable)."""

    def __init__(self, partition: int, start: int, end: int, earliest: int, next_offset: int) -> None:
        self.partition = partition
        self.start = start
        self.end = end
        self.earliest = earliest
        self.next_offset = next_offset
        if start < earliest:
            why = f"offsets below {earliest} were deleted by retention"
        else:
            why = f"the partition's durable records end before offset {next_offset}"
        super().__init__(
            f"capture log partition {partition}: offsets [{start}, {end}) are out of range "
            f"(the partition holds [{earliest}, {next_offset}); {why})"
        )


class LogLockedError(CaptureError):
    """Another process holds the log's writer lock."""


class LogMismatchError(CaptureError):
    """The configuration does not match the log on disk (partition count, stream)."""


class LogClosedError(CaptureError):
    """The log was closed."""


class CaptureWriteError(CaptureError):
    """Writing or fsyncing failed (disk full, I/O error). Every append that was
    not yet durable fails with it, and so does every later append: the log must
    be reopened, which recovers from what is on disk."""


class BackPressureTimeout(CaptureError, TimeoutError):
    """``append(timeout=...)`` waited that long for the disk to catch up."""


class RecordTooLargeError(CaptureError, ValueError):
    """A record larger than the capture log takes (on Kafka: the topic's
    ``max.message.bytes`` or the producer's ``message.max.bytes``). Refused
    before anything is written: the log stays healthy, offsets and sequence
    numbers are not used up. The edge answers it with reason code 0x95
    (Packet too large)."""

    rule = "LG-capture-kafka-too-large"

    def __init__(self, size: int, limit: int, what: str) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"capture record of {size} bytes exceeds {what} ({limit} bytes) [{self.rule}]; "
                         "it was not written")


#: The exit code of a command whose capture log could not be reached, at start
#: or while running (sysexits' EX_TEMPFAIL: try again later): ``lakegate run``
#: starts its edge again on it, with back-off, and so can a service manager.
EXIT_UNAVAILABLE = 75


def unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the capture log's storage did not answer (Kafka
    down or unreachable), as opposed to a failure reopening cannot mend."""
    return isinstance(exc, LogUnavailableError) or bool(getattr(exc, "unavailable", False))


class LogUnavailableError(CaptureError):
    """The capture log's storage cannot be reached (on Kafka: no broker at
    ``kafka.bootstrap_servers`` answered in time)."""
