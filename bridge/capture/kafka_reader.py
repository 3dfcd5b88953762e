"""KafkaLogReader: read the capture log on Kafka by offset ranges.

The reading half of :class:`bridge.capture.reader.LogReader` for
``capture.backend = "kafka"``: partitions, earliest and durable (high
watermark) offsets, :class:`~bridge.capture.record.Record` objects, and
Arrow batches in the capture schema (``schemas.capture.CAPTURE_RECORD_DDL``)
with the same columns the local reader gives for the same records: key,
value, topic (the Kafka topic's name), partition, offset, timestamp (Kafka
keeps milliseconds), timestampType 1, and headers (the stored ones, then
``seq``).

One consumer, assigned a partition at a time, no group and no commits
(``enable.auto.commit`` false). Offsets must be dense, as the writer
makes them: a gap raises :class:`CorruptRecordError`. Picklable: holds the
configuration, and connects on first use.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Iterator

from bridge.capture.errors import CaptureError, CorruptRecordError, LogUnavailableError, OffsetOutOfRangeError
from bridge.capture.kafka_conf import client_conf
from bridge.capture.reader import BATCH_BYTES, BATCH_RECORDS, PartitionStats, capture_arrow_schema
from bridge.capture.record import SEQ_HEADER, Record
from schemas.capture import TIMESTAMP_TYPE_LOG_APPEND

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaLogReader"]

#: A read that gets no record for this many seconds while records are due fails.
STALL_S = 30.0
#: Seconds a reading of the partitions' offsets may take (retrying a leader that died).
WATERMARK_TIMEOUT_S = 30.0
_SEQ = SEQ_HEADER


class KafkaLogReader:
    """A read-only view of the capture topic ``config.kafka_topic``."""

    def __init__(self, config, check: bool = True) -> None:
        self.config = config
        self.topic = config.kafka_topic
        self.stream = self.topic
        self.partitions = config.capture.partitions
        self._consumer = None  # reads records
        self._meta = None  # reads offsets (the reading one would answer after its fetch in flight)
        self._known: list[tuple[int, int]] | None = None  # the watermarks seen last
        self._owner: object = None  # the iterator the consumer is assigned for
        self._lock = threading.RLock()
        if check:
            from bridge.capture.kafka_topic import admin_client, inspect_topic

            admin, errors = admin_client(config)
            inspect_topic(admin, config, create=False, errors=errors)

    def __getstate__(self) -> dict:
        return {"config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], check=False)

    def __repr__(self) -> str:
        return f"KafkaLogReader(topic={self.topic!r}, partitions={self.partitions})"

    def _conn(self, meta: bool = False):
        name = "_meta" if meta else "_consumer"
        c = getattr(self, name)
        if c is None:
            from confluent_kafka import Consumer

            c = Consumer(client_conf(self.config, "consumer"))
            setattr(self, name, c)
        return c

    def close(self) -> None:
        with self._lock:
            for name in ("_consumer", "_meta"):
                c = getattr(self, name)
                if c is not None:
                    c.close()
                    setattr(self, name, None)
            self._owner = None

    def __enter__(self) -> "KafkaLogReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- offsets
    def _watermarks(self) -> list[tuple[int, int]]:
        """Per partition (low, high) watermarks. A query goes to the leader
        the consumer knows, and librdkafka keeps asking a leader that died
        until its metadata refresh (minutes): after a failed attempt, a new
        consumer asks again (it learns the leaders afresh), for up to
        WATERMARK_TIMEOUT_S in all (Kafka replaces a dead leader within
        broker.session.timeout.ms, 9 s by default, and an election)."""
        from confluent_kafka import KafkaException, TopicPartition

        out = []
        with self._lock:
            deadline = time.monotonic() + WATERMARK_TIMEOUT_S
            for p in range(self.partitions):
                while True:
                    c = self._conn(meta=True)
                    try:
                        out.append(c.get_watermark_offsets(
                            TopicPartition(self.topic, p), timeout=max(min(deadline - time.monotonic(), 3.0), 0.5)))
                        break
                    except KafkaException as exc:
                        self._meta = None
                        c.close()
                        if time.monotonic() >= deadline:
                            raise LogUnavailableError(
                                f"capture log on Kafka: could not read the offsets of topic {self.topic!r} "
                                f"partition {p} at kafka.bootstrap_servers = "
                                f"{self.config.kafka.bootstrap_servers!r} within {WATERMARK_TIMEOUT_S:g} s: "
                                f"{exc}") from None
            self._known = out
        return out

    def _check_range(self, p: int, start: int, end: int) -> None:
        """OffsetOutOfRangeError unless start..end lies in the partition:
        against the watermarks seen last (a range read from a durable end
        just asked for), asking the brokers again only when it does not."""
        known = self._known
        if known is not None and known[p][0] <= start and end <= known[p][1]:
            return  # high watermarks only grow; a low one that moved on shows as a read error
        lo, hi = self._watermarks()[p]
        if start < lo or end > hi:
            raise OffsetOutOfRangeError(p, start, end, lo, hi)

    def earliest_offsets(self) -> list[int]:
        """Per partition, the first offset still in the topic."""
        return [lo for lo, _hi in self._watermarks()]

    def durable_offsets(self) -> list[int]:
        """Per partition, the high watermark: every replica in sync has the records below it."""
        return [hi for _lo, hi in self._watermarks()]

    def stats(self) -> list[PartitionStats]:
        """Per partition: first and next offsets and the record count (bytes
        and segments are Kafka's business: 0; no committed offsets)."""
        return [PartitionStats(p, lo, hi, hi - lo, 0, 0, {}) for p, (lo, hi) in enumerate(self._watermarks())]

    # ------------------------------------------------------------- reading
    def _messages(self, p: int, start: int, end: int, chunk: int = 500) -> Iterator[list]:
        """Lists of the messages with start <= offset < end, in offset order."""
        from confluent_kafka import TopicPartition

        if not 0 <= p < self.partitions:
            raise ValueError(f"capture log has partitions 0-{self.partitions - 1}, not {p}")
        if start >= end:
            return
        self._check_range(p, start, end)
        token = object()
        want = start
        last_progress = time.monotonic()
        while want < end:
            with self._lock:
                c = self._conn()
                if self._owner is not token:  # first time, or another read took the consumer meanwhile
                    c.assign([TopicPartition(self.topic, p, want)])
                    self._owner = token
                msgs = c.consume(min(chunk, end - want), timeout=0.5)
            out = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    self._known = None  # perhaps out of range by now (retention): say so if it is
                    self._check_range(p, want, end)
                    raise CaptureError(f"capture log on Kafka: reading topic {self.topic!r} partition {p} "
                                       f"at offset {want}: {err.str()}")
                o = m.offset()
                if m.partition() != p or o < want:
                    continue
                if o != want:
                    raise CorruptRecordError(p, want, f"kafka topic {self.topic}", 0,
                                             f"offset {o} where {want} was expected (offsets must be dense)")
                if o >= end:
                    break
                out.append(m)
                want = o + 1
            if out:
                last_progress = time.monotonic()
                yield out
            elif time.monotonic() - last_progress > STALL_S:
                raise LogUnavailableError(f"capture log on Kafka: no record of topic {self.topic!r} partition "
                                          f"{p} from offset {want} within {STALL_S:g} s")

    def records(self, partition: int, start: int, end: int) -> Iterator[Record]:
        """Decoded records with start <= offset < end."""
        for msgs in self._messages(partition, start, end):
            for m in msgs:
                yield kafka_record(m, partition)

    def arrow_batches(self, partition: int, start: int, end: int, batch_records: int = BATCH_RECORDS,
                      batch_bytes: int = BATCH_BYTES) -> Iterator["pa.RecordBatch"]:
        """Records with start <= offset < end as Arrow record batches in the
        capture schema, as :meth:`LogReader.arrow_batches` gives them."""
        import pyarrow as pa

        schema = capture_arrow_schema()
        htype = schema.field("headers").type
        rows: list = []
        nbytes = 0

        def batch() -> "pa.RecordBatch":
            n = len(rows)
            first = rows[0][0]
            return pa.RecordBatch.from_arrays([
                pa.array([r[1] for r in rows], pa.binary()),
                pa.array([r[2] for r in rows], pa.binary()),
                pa.repeat(pa.scalar(self.stream, pa.string()), n),
                pa.repeat(pa.scalar(partition, pa.int32()), n),
                pa.array(range(first, first + n), pa.int64()),
                pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC")),
                pa.repeat(pa.scalar(TIMESTAMP_TYPE_LOG_APPEND, pa.int32()), n),
                pa.array([r[4] for r in rows], htype),
            ], schema=schema)

        for msgs in self._messages(partition, start, end, chunk=min(batch_records, 1000)):
            for m in msgs:
                key = m.key() or b""
                value = m.value() or b""
                hs = m.headers() or []
                rows.append((m.offset(), key, value, m.timestamp()[1] * 1000,
                             [{"key": k, "value": v or b""} for k, v in hs]))
                nbytes += len(key) + len(value)
                if len(rows) >= batch_records or nbytes >= batch_bytes:
                    yield batch()
                    rows, nbytes = [], 0
        if rows:
            yield batch()


def kafka_record(m, partition: int) -> Record:
    """The capture record of a consumed Kafka message of ``partition``."""
    stored = []
    seq = None
    for k, v in m.headers() or ():
        if k == _SEQ:
            seq = int(v)
        else:
            stored.append((k, v or b""))
    if seq is None:
        raise CorruptRecordError(partition, m.offset(), "kafka topic " + m.topic(), 0,
                                 "no seq header: not a record lakegate wrote")
    return Record(partition=partition, offset=m.offset(), seq=seq, timestamp_us=m.timestamp()[1] * 1000,
                  key=m.key() or b"", value=m.value() or b"", stored_headers=tuple(stored))
