"""``format("lakegate")``: the capture log as a Spark data source (Python Data Source API).

::

    from bridge.spark.source import register
    register(spark)
    stream = (spark.readStream.format("lakegate")
              .option("startingOffsets", "earliest")
              .option("maxRecordsPerTrigger", 100000)
              .load(str(config.capture_dir)))
    replay = (spark.read.format("lakegate")
              .option("startingOffsets", '{"0": 100, "1": 0}')
              .option("endingOffsets", "latest")
              .load(str(config.capture_dir)))

Rows have exactly the schema of Spark's Kafka source
(``schemas.capture.CAPTURE_RECORD_DDL``: key, value, topic, partition,
offset, timestamp, timestampType, headers), so a deployment that puts the
frames into Kafka can switch the job to ``format("kafka")`` with no other
change to the job's logic.

Offsets are JSON objects ``{"0": 123, "1": 45}``: per partition, the next
offset to read. A micro-batch is planned as one offset range per partition
(split into ranges of at most ``SPLIT_RECORDS``); executors read their range
from the log's files and yield Arrow record batches. **Executors must see the
log's directory**: local mode, or a shared file system mounted at the same
path on every executor.

Options (case-insensitive; unknown or ill-typed options fail when the query
starts, naming the option):

==========================  ========  ==============================================
option                      used by   value
==========================  ========  ==============================================
path (or ``load(path)``)    both      the capture log directory (``data_dir/capture``)
startingOffsets             both      ``earliest`` (default), ``latest`` or JSON
                                      ``{"0": 12, "1": -2}`` (-2 earliest, -1 latest;
                                      partitions not named start at earliest)
endingOffsets               batch     ``latest`` (default) or JSON (-1 latest)
maxRecordsPerTrigger        stream    positive integer: records per micro-batch,
                                      shared among partitions by their backlog
consumer                    stream    name under which ``commit`` records the
                                      processed offsets (default ``spark``)
failOnDataLoss              both      ``true`` (default): offsets deleted by retention
                                      are an error; ``false``: skip to the earliest
==========================  ========  ==============================================

``commit(end)`` writes the consumer's committed offsets; the edge's
retention deletes only segments wholly below every consumer's commit.
Readers see only durable (fsynced) records.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from schemas.capture import CAPTURE_RECORD_DDL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LakegateDataSource", "OffsetRange", "SourceOptionError", "parse_options", "register"]

log = logging.getLogger(__name__)

#: An offset range longer than this is read by several tasks.
SPLIT_RECORDS = 1_000_000
EARLIEST, LATEST = -2, -1

_OPTIONS = {
    "path": "both",
    "startingoffsets": "both",
    "endingoffsets": "batch",
    "maxrecordspertrigger": "stream",
    "consumer": "stream",
    "failondataloss": "both",
}
_CANONICAL = {
    "path": "path",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
    "consumer": "consumer",
    "failondataloss": "failOnDataLoss",
}


class SourceOptionError(ValueError):
    """An option of the lakegate source is unknown or ill-typed."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        super().__init__(f"lakegate source: option {option}: {problem}")


def _offsets_option(name: str, text: str, allowed_words: tuple[str, ...], min_value: int) -> str | dict[int, int]:
    t = text.strip()
    if t.lower() in allowed_words:
        return t.lower()
    try:
        d = json.loads(t)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        raise SourceOptionError(name, f"expected {' or '.join(allowed_words)} or a JSON object like "
                                      f'{{"0": 12, "1": 0}}, got {text!r}')
    out: dict[int, int] = {}
    for k, v in d.items():
        try:
            p = int(k)
        except ValueError:
            raise SourceOptionError(name, f"partition {k!r} is not an integer") from None
        if isinstance(v, bool) or not isinstance(v, int) or v < min_value or p < 0:
            raise SourceOptionError(name, f"partition {k}: offset must be an integer >= {min_value}, got {v!r}")
        out[p] = v
    return out


def parse_options(options: Mapping[str, str]) -> dict[str, Any]:
    """Check and type the source options. Raises SourceOptionError naming the option."""
    opts: dict[str, Any] = {"startingOffsets": "earliest", "endingOffsets": "latest",
                            "maxRecordsPerTrigger": None, "consumer": "spark", "failOnDataLoss": True, "given": set()}
    for raw_key, value in options.items():
        key = raw_key.lower()
        if key not in _OPTIONS:
            raise SourceOptionError(raw_key, f"unknown option; known options: {', '.join(_CANONICAL.values())}")
        name = _CANONICAL[key]
        opts["given"].add(name)
        if name == "path":
            opts["path"] = str(value)
        elif name == "startingOffsets":
            opts[name] = _offsets_option(name, str(value), ("earliest", "latest"), EARLIEST)
        elif name == "endingOffsets":
            opts[name] = _offsets_option(name, str(value), ("latest",), LATEST)
        elif name == "maxRecordsPerTrigger":
            try:
                n = int(str(value).strip())
            except ValueError:
                n = 0
            if n <= 0:
                raise SourceOptionError(name, f"expected a positive integer, got {value!r}")
            opts[name] = n
        elif name == "consumer":
            from bridge.capture.commits import CONSUMER_NAME

            if not CONSUMER_NAME.match(str(value)):
                raise SourceOptionError(name, f"use letters, digits, '.', '_' and '-', got {value!r}")
            opts[name] = str(value)
        elif name == "failOnDataLoss":
            low = str(value).strip().lower()
            if low not in ("true", "false"):
                raise SourceOptionError(name, f"expected true or false, got {value!r}")
            opts[name] = low == "true"
    if not opts.get("path"):
        raise SourceOptionError("path", "required: .load(capture_dir) or .option('path', capture_dir)")
    from bridge.capture.reader import LogReader

    try:
        reader = LogReader(opts["path"])
    except FileNotFoundError as exc:
        raise SourceOptionError("path", str(exc)) from None
    for name in ("startingOffsets", "endingOffsets"):
        v = opts[name]
        if isinstance(v, dict):
            bad = sorted(p for p in v if p >= reader.partitions)
            if bad:
                raise SourceOptionError(name, f"partition {bad[0]} does not exist; the log has "
                                              f"partitions 0-{reader.partitions - 1}")
    opts["partitions"] = reader.partitions
    return opts


def _reject(opts: dict[str, Any], mode: str) -> None:
    for name in sorted(opts["given"]):
        scope = _OPTIONS[name.lower()]
        if scope not in ("both", mode):
            other = "spark.readStream" if scope == "stream" else "spark.read"
            raise SourceOptionError(name, f"applies only to {other}")


class OffsetRange(InputPartition):
    """Records [start, end) of one log partition: one Spark task. Picklable."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"OffsetRange(partition={self.partition}, [{self.start}, {self.end}))"


def _read_range(path: str, part: InputPartition) -> Iterator[Any]:
    """Runs on executors: yield the range's records as Arrow record batches."""
    if not isinstance(part, OffsetRange):  # Spark's placeholder for "no partitions"
        return iter(())
    from bridge.capture.reader import LogReader

    return LogReader(path).arrow_batches(part.partition, part.start, part.end)


def _resolve(spec: str | dict[int, int], partitions: int, earliest: list[int], latest: list[int],
             default: int) -> dict[str, int]:
    out = {}
    for p in range(partitions):
        if spec == "earliest":
            v = EARLIEST
        elif spec == "latest":
            v = LATEST
        else:
            v = spec.get(p, default)  # type: ignore[union-attr]
        out[str(p)] = earliest[p] if v == EARLIEST else latest[p] if v == LATEST else v
    return out


def _ranges(start: Mapping[str, int], end: Mapping[str, int], earliest: list[int],
            fail_on_data_loss: bool) -> list[OffsetRange]:
    from bridge.capture.errors import OffsetOutOfRangeError

    out = []
    for key in sorted(end, key=int):
        p = int(key)
        s, e = int(start.get(key, 0)), int(end[key])
        if s < earliest[p] and s < e:
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(p, s, e, earliest[p], e)
            from bridge.logs import ensure_worker_logging

            ensure_worker_logging()  # planned in a Python worker: give the line a timestamp
            log.warning("lakegate source: partition %d offsets [%d, %d) were deleted by retention; skipping them",
                        p, s, min(e, earliest[p]))
            s = min(earliest[p], e)
        while s < e:
            n = min(e - s, SPLIT_RECORDS)
            out.append(OffsetRange(p, s, s + n))
            s += n
    return out


def _share(budget: int, lags: list[int]) -> list[int]:
    """Split ``budget`` records among partitions in proportion to their
    backlog (largest remainders get the leftover), never more than a backlog."""
    total = sum(lags)
    if total <= budget:
        return list(lags)
    shares = [budget * lag // total for lag in lags]
    left = budget - sum(shares)
    order = sorted(range(len(lags)), key=lambda i: (-(budget * lags[i] % total), i))
    for i in order:
        if left == 0:
            break
        if shares[i] < lags[i]:
            shares[i] += 1
            left -= 1
    return shares


class LakegateStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Its driver-side methods run in Spark's Python
    streaming-source worker; ``read`` runs on executors (the instance is
    pickled there: it holds only the path and the options)."""

    def __init__(self, opts: dict[str, Any]) -> None:
        self.path: str = opts["path"]
        self.opts = opts
        self._target: dict[str, int] | None = None

    def _log(self):
        from bridge.capture.reader import LogReader

        return LogReader(self.path)

    def initialOffset(self) -> dict:
        r = self._log()
        return _resolve(self.opts["startingOffsets"], r.partitions, r.earliest_offsets(), r.durable_offsets(), EARLIEST)

    def _available(self) -> dict[str, int]:
        durable = self._log().durable_offsets()
        avail = {str(p): o for p, o in enumerate(durable)}
        if self._target is not None:
            avail = {k: min(v, self._target.get(k, v)) for k, v in avail.items()}
        return avail

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Called once per trigger: the end of the next micro-batch."""
        avail = self._available()
        keys = sorted(avail, key=int)
        starts = [int(start.get(k, 0)) for k in keys]
        for k, s in zip(keys, starts):
            if avail[k] < s:
                if self.opts["failOnDataLoss"]:
                    raise RuntimeError(
                        f"lakegate source: partition {k}: the log's durable end {avail[k]} is below the "
                        f"query's offset {s}; the capture log at {self.path} was truncated or replaced "
                        "(set failOnDataLoss=false to continue from what the log holds)")
                avail[k] = s
        if isinstance(limit, ReadMaxRows):
            shares = _share(int(limit.max_rows), [avail[k] - s for k, s in zip(keys, starts)])
            return {k: s + n for k, s, n in zip(keys, starts, shares)}
        return {k: avail[k] for k in keys}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts["maxRecordsPerTrigger"]
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {str(p): o for p, o in enumerate(self._log().durable_offsets())}

    def reportLatestOffset(self) -> dict:
        return {str(p): o for p, o in enumerate(self._log().durable_offsets())}

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        return _ranges(start, end, self._log().earliest_offsets(), self.opts["failOnDataLoss"])

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Runs on executors: the range's records as Arrow record batches."""
        return _read_range(self.path, partition)

    def commit(self, end: dict) -> None:
        """Spark processed everything below ``end``: record it for retention."""
        from bridge.capture.commits import commit_offsets

        commit_offsets(self._log().root, self.opts["consumer"], {int(k): int(v) for k, v in end.items()})


class LakegateBatchReader(DataSourceReader):
    """``spark.read`` between offsets, for replays and backfills. Offsets are
    resolved when the query is planned."""

    def __init__(self, opts: dict[str, Any]) -> None:
        self.path: str = opts["path"]
        self.opts = opts

    def partitions(self) -> list[OffsetRange]:
        from bridge.capture.reader import LogReader

        r = LogReader(self.path)
        earliest, durable = r.earliest_offsets(), r.durable_offsets()
        start = _resolve(self.opts["startingOffsets"], r.partitions, earliest, durable, EARLIEST)
        end = _resolve(self.opts["endingOffsets"], r.partitions, earliest, durable, LATEST)
        for k in end:
            if end[k] > durable[int(k)]:
                raise SourceOptionError("endingOffsets", f"partition {k}: {end[k]} is beyond the log's "
                                                         f"durable end {durable[int(k)]}")
            if end[k] < start[k]:
                raise SourceOptionError("endingOffsets", f"partition {k}: {end[k]} is below startingOffsets {start[k]}")
        return _ranges(start, end, earliest, self.opts["failOnDataLoss"])

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Runs on executors: the range's records as Arrow record batches."""
        return _read_range(self.path, partition)


class LakegateDataSource(DataSource):
    """The capture log as ``format("lakegate")``; see the module docstring.
    Options are checked when the source is created (at ``load()``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)  # type: ignore[arg-type]
        self._opts = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "lakegate"

    def schema(self) -> str:
        return CAPTURE_RECORD_DDL

    def reader(self, schema) -> LakegateBatchReader:
        _reject(self._opts, "batch")
        return LakegateBatchReader(self._opts)

    def streamReader(self, schema) -> LakegateStreamReader:
        _reject(self._opts, "stream")
        _ignore_terminal_interrupt()
        return LakegateStreamReader(self._opts)


def _ignore_terminal_interrupt() -> None:
    """Spark's streaming-source worker (a Python process the JVM starts, where
    ``streamReader`` runs) ignores SIGINT: a Ctrl-C in the terminal reaches
    the whole process group, this worker too, and it would end the query with
    KeyboardInterrupt at its next ``latestOffset``; the driver decides, and
    stops the query after its batch. Never in the driver (it has a context)."""
    import signal
    import threading

    from pyspark import SparkContext

    in_driver = SparkContext._active_spark_context is not None  # noqa: SLF001 - no public API says so
    if not in_driver and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def register(spark: "SparkSession") -> None:
    """Make ``format("lakegate")`` available in this session."""
    spark.dataSource.register(LakegateDataSource)
