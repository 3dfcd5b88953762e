"""KafkaCaptureLog: the capture log's writer on Apache Kafka (``capture.backend = "kafka"``).

The same API as :class:`bridge.capture.writer.CaptureLog`, the edge's side::

    log = KafkaCaptureLog.open(config)        # the whole bridge.config.Config
    ack = log.append(conn_id, key=client_id, value=frame, headers=[("conn_id", b"c1"), ...])
    ack.partition, ack.offset, ack.seq        # known at once
    ack.wait(timeout=5)                       # returns once Kafka has it (acks=all)
    log.close()

Each record is one Kafka record of the topic ``config.kafka_topic``: key the
MQTT client id, value the raw frame, the caller's headers and then ``seq``
(the capture sequence, decimal), timestamp the receive time (ms), in
partition :func:`~bridge.capture.record.partition_for` of the connection.
The producer is idempotent with ``acks=all`` and at most 5 requests in
flight, so a partition's records land in order, once each.

Offsets are known at append: the edge is the only writer of the topic, so a
partition's offsets are dense and the next one is the end offset read at
open plus the records appended since. Each delivery report is checked
against that prediction; a record that landed elsewhere means another
producer writes the topic (LG-capture-kafka-offset) and the log fails.

Durable means Kafka confirmed the record (every in-sync replica has it).
Failure: a delivery that fails or lands at another offset fails that append,
every append not yet confirmed, and every later append, with
:class:`CaptureWriteError`: nothing depending on it may be acknowledged. The
log must be reopened (which reads the offsets afresh).

Kafka not answering: librdkafka keeps the records and re-sends them; the log
says so once per outage (one warning naming ``kafka.bootstrap_servers``) and
once when Kafka confirms records again. Nothing is acknowledged meanwhile. A
record still unconfirmed after ``kafka.delivery_timeout_ms`` fails the log
as above; :attr:`KafkaCaptureLog.failed` then has ``unavailable`` True (a
reopen succeeds once Kafka is back), unlike a wrong offset or a fatal
producer error.

Crash points for the kill tests (:mod:`bridge.failpoints`, ``name@seq``):
``capture-kafka-before-produce``, ``capture-kafka-after-produce``,
``capture-kafka-delivered`` (confirmed, its ack not yet resolved) and
``capture-kafka-acked``; read only when ``LAKEGATE_FAILPOINTS`` is set at
import.

A record Kafka could not take (the topic's ``max.message.bytes``, the
producer's ``message.max.bytes``) is refused before it is produced with
:class:`RecordTooLargeError` (LG-capture-kafka-too-large): nothing written,
the log stays healthy.

Back-pressure: bytes count as pending from ``append`` until confirmed;
beyond ``capture.max_pending_bytes`` (or when librdkafka's queue is full)
appends wait, as on the local log.

One piece: :class:`KafkaCaptureLog` is one protocol between the appending
threads and the poller thread over shared state -- ``_lock`` with its
``_room`` condition, the per-partition queues of records awaiting their
delivery report, the predicted and confirmed offsets, ``_pending_bytes`` and
``_failed`` -- and its parts are correct only together: an append predicts
the offset and queues its entry under the lock in the order it produces,
the delivery reports one poll serves are applied in their order under one
lock (``_settle``), each popping its partition's oldest entry and checking
the offset, a
failure fails every queued entry and every later append, and ``close``
drains the producer before the poller stops.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterable

from bridge.capture.errors import (
    BackPressureTimeout,
    CaptureWriteError,
    LogClosedError,
    RecordTooLargeError,
)
from bridge.capture.kafka_conf import client_conf
from bridge.capture.kafka_topic import (
    PARTITIONS_RULE,
    admin_client,
    check_retention,
    inspect_topic,
    kafka_error,
    read_tail,
    read_topic_configs,
)
from bridge.capture.record import SEQ_HEADER, Headers, encode_headers, kafka_headers_size
from bridge.capture.writer import Ack
from bridge.capture.writer_base import WriterBase, take_writer_lock
from bridge.failpoints import failpoint

__all__ = ["KafkaCaptureLog", "OFFSET_RULE", "PARTITIONS_RULE", "inspect_topic", "record_wire_size"]

log = logging.getLogger(__name__)

OFFSET_RULE = "LG-capture-kafka-offset"
#: Seconds a record may wait for Kafka's confirmation before ``/healthz`` fails.
STALL_S = 5.0
#: Kafka's record batch header (v2), which every batch of records carries.
BATCH_OVERHEAD = 61
#: A cluster edge's capture sequence: a hybrid logical clock (µs) shifted by
#: this many bits, the edge's id in them: unique across the cluster, in the
#: order of the wall clock and of what each edge saw (at most 18 digits, as
#: the job's kafka source reads it, until about 2090).
SEQ_EDGE_BITS = 8
#: librdkafka's default ``message.max.bytes`` (the largest request it sends).
PRODUCER_MAX_BYTES = 1_000_000
_SEQ = SEQ_HEADER
#: delivery errors that mean Kafka did not answer (not that it refused)
_UNAVAILABLE_CODES = frozenset({-192, -195, -187, -185})  # _MSG_TIMED_OUT (-192), _TRANSPORT, _ALL_BROKERS_DOWN,
#                                                           _TIMED_OUT
#: named crash points (bridge.failpoints) of the append and delivery path, for
#: the kill tests; checked only when the environment names some at import
_FAILPOINTS = bool(os.environ.get("LAKEGATE_FAILPOINTS"))


#: the bytes of a batch holding one record besides its key, value and headers
#: (Kafka record format v2, every varint at its widest)
_RECORD_FIXED = BATCH_OVERHEAD + 36


def record_wire_size(key_len: int, value_len: int, headers: Iterable[tuple[str, bytes]]) -> int:
    """An upper bound of the bytes of a batch holding only this record (Kafka
    record format v2, every varint at its widest): what the topic's
    ``max.message.bytes`` is checked against, and what back-pressure counts."""
    return _RECORD_FIXED + key_len + value_len + kafka_headers_size(headers)


#: what a record's ``seq`` header adds to it at most (a 20-digit value)
_SEQ_HEADER_BYTES = 10 + 3 + 20


def _kafka_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], int]:
    """(checked header pairs, the bytes they add to a record): computed once
    for a :class:`~bridge.capture.record.Headers` (a connection's)."""
    if type(headers) is Headers:
        return headers.kafka()
    encode_headers(headers)  # checks the keys (seq is the log's) and the values
    pairs = [(k, bytes(v)) for k, v in headers]
    return pairs, kafka_headers_size(pairs)


class _Group:
    """Records appended between two turns of the poller: one future for all
    of them, resolved once each is confirmed and the group is sealed (no
    more records join it), as the local log's group commit has one per
    fsync: the edge hops to its loop once per group, not once per record."""

    __slots__ = ("future", "count", "pending", "sealed", "seqs", "t0")

    def __init__(self) -> None:
        self.future: Future = Future()
        self.t0 = 0.0       # when its first record was appended (monotonic)
        self.count = 0      # records appended into it
        self.pending = 0    # of those, not yet confirmed
        self.sealed = False
        self.seqs: list[int] | None = [] if _FAILPOINTS else None  # for the "acked" crash point


#: A record produced and awaiting its delivery report: a tuple (a few
#: hundred thousand a second are made), fields at these indexes.
_OFFSET, _SEQNO, _SIZE, _GROUP = range(4)
_Entry = tuple  # (offset, seq, size, group)


class KafkaCaptureLog(WriterBase):
    """The capture log writer on Kafka. Create with :meth:`open`; thread-safe."""

    def __init__(self, config) -> None:
        # Use KafkaCaptureLog.open(config); this only stores settings.
        cap = config.capture
        self.config = config
        self.topic = config.kafka_topic
        #: the records' ``topic`` column (Spark's Kafka source gives the topic's name)
        self.stream = self.topic
        self.partitions = cap.partitions
        self.max_pending_bytes = cap.max_pending_bytes
        #: the edge's side files (hold and commit files) live here
        self.root = Path(config.capture_dir)
        #: accepted for the edge's sake; appends never wait for the poller's GIL turn
        self.yield_to_flusher = True
        self.delivery_timeout_s = config.kafka.delivery_timeout_ms / 1000
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # appends waiting for room, flush, close
        self._inflight: list[collections.deque[_Entry]] = [collections.deque() for _ in range(self.partitions)]
        #: delivery reports (error, partition, offset) not yet applied (_settle)
        self._reports: collections.deque[tuple[Any, int, int]] = collections.deque()
        self._group = _Group()  # the open group: appends join it (see _Group)
        self._next_offset: list[int] = [0] * self.partitions
        self._durable: list[int] = [0] * self.partitions
        self._next_seq = 0
        self._pending_bytes = 0
        self._pcache: dict[str, int] = {}
        self._delivered = False  # a delivery since the poller last ran on_durable
        self._stopping = False
        self._closed = False
        self._failed: CaptureWriteError | None = None
        cl = config.cluster
        #: a cluster edge (``cluster.edges`` > 1) writes its own partitions only
        #: (p % edges == edge_id) and numbers records by a hybrid logical clock
        #: (see :meth:`_append_locked`)
        self.edge_id = cl.edge_id
        self._hlc = cl.edges > 1
        if self._hlc:
            self.own = [p for p in range(self.partitions) if p % cl.edges == cl.edge_id]
        self._down = False  # librdkafka said every broker is down; no delivery since
        self._producer = None
        self._thread: threading.Thread | None = None
        self._lock_fd = -1
        #: the smallest limit a record must stay under, and what sets it
        self.max_record_bytes = PRODUCER_MAX_BYTES
        self._limit_what = "the producer's message.max.bytes"
        #: counters: appends, commits (poll rounds that confirmed records),
        #: deliveries, bytes confirmed, queue_full (waits for librdkafka's queue), outages (every
        #: broker down)
        self.stats = {"appends": 0, "commits": 0, "fsyncs": 0, "bytes": 0, "truncated_bytes": 0,
                      "deliveries": 0, "queue_full": 0, "outages": 0}
        #: a bridge.buckets.Buckets timing each group: its first record produced -> its last confirmed
        #: (None: not timed)
        self.fsync_latency = None
        #: called (no arguments, on the poller thread, after the acks) when
        #: deliveries made records durable; must be quick and must not raise
        self.on_durable: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, config, producer_conf: dict[str, Any] | None = None) -> "KafkaCaptureLog":
        """Open the capture log on the topic ``config.kafka_topic``.

        Checks the topic (creating it when missing and ``kafka.create_topic``),
        reads each partition's end offset and the last record's ``seq``, and
        starts the producer. ``producer_conf``: librdkafka settings added to
        :func:`~bridge.capture.kafka_conf.client_conf`'s (tests, tuning).
        Raises LogUnavailableError when no broker answers within about 10 s,
        LogMismatchError for a missing topic or too few partitions,
        LogLockedError when another process writes this data_dir.
        """
        for k in ("partitions", "max_pending_bytes"):
            if int(getattr(config.capture, k)) <= 0:
                raise ValueError(f"capture.{k} must be positive, got {getattr(config.capture, k)}")
        self = cls(config)
        try:
            self._open(producer_conf or {})
        except BaseException:
            self._release()
            raise
        return self

    def _open(self, extra: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = take_writer_lock(self.root, f"{self.root} is in use by another capture writer (pid {{pid}}); "
                                                    "only one lakegate edge may use a data_dir")

        admin, errors = admin_client(self.config)
        have = inspect_topic(admin, self.config, create=True, errors=errors)
        if have > self.partitions:
            log.warning("capture log on Kafka: topic %s has %d partitions; the edge writes the first %d "
                        "(capture.partitions)", self.topic, have, self.partitions)
        entries = read_topic_configs(self.config, admin)
        check_retention(self.config, entries)
        topic_max = int(entries["max.message.bytes"])
        conf = client_conf(self.config, "producer")
        # A batch of several records must fit the topic too: librdkafka does not split a rejected batch.
        conf["batch.size"] = max(min(1_000_000, topic_max), 1)
        conf["message.max.bytes"] = max(PRODUCER_MAX_BYTES, min(topic_max + 4096, 1_000_000_000))
        conf.update(extra)
        producer_max = int(conf["message.max.bytes"])
        if topic_max <= producer_max:
            self.max_record_bytes = topic_max
            self._limit_what = f"max.message.bytes of Kafka topic {self.topic!r}"
        else:
            self.max_record_bytes = producer_max
            self._limit_what = "the producer's message.max.bytes"
        _lows, ends, next_seq = read_tail(self.config, self.partitions)
        self._next_offset = list(ends)
        self._durable = list(ends)
        self._next_seq = ((next_seq - 1) >> SEQ_EDGE_BITS) + 1 if self._hlc and next_seq else next_seq
        conf["on_delivery"] = self._on_delivery
        conf["error_cb"] = self._on_error
        self._producer = Producer(conf)
        log.info("capture log on Kafka topic %s at %s: %d partitions, next offsets %s, next seq %d%s",
                 self.topic, self.config.kafka.bootstrap_servers, self.partitions, self._next_offset,
                 self._next_seq, "" if self.own is None else
                 f"; cluster edge {self.edge_id} of {self.config.cluster.edges}, writing partitions {self.own}")
        self._thread = threading.Thread(target=self._poller, name="capture-kafka-poller", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- append
    def append(self, partition_key: str, key: bytes, value: bytes,
               headers: Iterable[tuple[str, bytes]] = (), timestamp_us: int | None = None,
               timeout: float | None = None, partition: int | None = None) -> Ack:
        """Append one record; returns its :class:`Ack` at once (not yet in Kafka).

        As :meth:`bridge.capture.writer.CaptureLog.append`. Also raises
        RecordTooLargeError (nothing produced, the log stays healthy).
        ``partition``: this partition (one this writer writes) instead of
        ``partition_key``'s: a cluster edge's record that must follow
        another in its partition."""
        if not isinstance(key, (bytes, bytearray)) or not isinstance(value, (bytes, bytearray)):
            raise TypeError("capture append: key and value must be bytes")
        hlist, hsize = _kafka_headers(headers)
        ts = time.time_ns() // 1000 if timestamp_us is None else int(timestamp_us)
        p = self._partition_of(partition_key) if partition is None else partition
        if partition is not None and self.own is not None and partition not in self.own:
            raise ValueError(f"capture log on Kafka: partition {partition} is another cluster edge's")
        with self._lock:
            if self._failed is not None or self._stopping or self._closed:
                self._check_writable()
            return self._append_locked(p, ts, bytes(key), bytes(value), hlist, hsize, timeout)

    def append_many(self, partition_key: str, key: bytes,
                    items: list[tuple[bytes, Iterable[tuple[str, bytes]]]],
                    timeout: float | None = None) -> list[Ack]:
        """Append several records of one connection (``items``: (value,
        headers) pairs) as :meth:`append` would one by one, in order."""
        if not isinstance(key, (bytes, bytearray)):
            raise TypeError("capture append: key and value must be bytes")
        encoded = []
        for value, headers in items:
            if not isinstance(value, (bytes, bytearray)):
                raise TypeError("capture append: key and value must be bytes")
            encoded.append((bytes(value), *_kafka_headers(headers)))
        ts = time.time_ns() // 1000
        p = self._partition_of(partition_key)
        key = bytes(key)
        with self._lock:
            self._check_writable()
            return [self._append_locked(p, ts, key, v, h, hs, timeout) for v, h, hs in encoded]

    def _append_locked(self, p: int, ts: int, key: bytes, value: bytes, hlist: list[tuple[str, bytes]],
                       hsize: int, timeout: float | None) -> Ack:
        size = _RECORD_FIXED + len(key) + len(value) + hsize + _SEQ_HEADER_BYTES  # record_wire_size, inline
        if size > self.max_record_bytes:
            raise RecordTooLargeError(size, self.max_record_bytes, self._limit_what)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
            self._wait_for_room(size, deadline)
        while True:
            # read after every wait: another append may have gone first
            offset = self._next_offset[p]
            if self._hlc:  # the clock: never behind the wall clock (µs), never repeating
                c = self._next_seq if self._next_seq > ts else ts
                seq = (c << SEQ_EDGE_BITS) | self.edge_id
            else:
                c = seq = self._next_seq
            if _FAILPOINTS:
                failpoint("capture-kafka-before-produce", seq)
            try:
                self._producer.produce(self.topic, value=value, key=key, partition=p, timestamp=ts // 1000,
                                       headers=[*hlist, (_SEQ, b"%d" % seq)])
                break
            except BufferError:  # librdkafka's queue is full: wait for deliveries, never drop
                self.stats["queue_full"] += 1
                self._wait_queue(size, deadline)
            except Exception as exc:
                from confluent_kafka import KafkaError, KafkaException

                if not isinstance(exc, KafkaException):
                    raise
                if exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise RecordTooLargeError(size, self.max_record_bytes, self._limit_what) from None
                raise CaptureWriteError(f"capture log on Kafka: librdkafka refused a record of partition {p}: "
                                        f"{kafka_error(exc)}; it was not written") from None
        if _FAILPOINTS:
            failpoint("capture-kafka-after-produce", seq)
        g = self._group
        if not g.count:
            g.t0 = time.monotonic()
        g.count += 1
        g.pending += 1
        if g.seqs is not None:
            g.seqs.append(seq)
        self._inflight[p].append((offset, seq, size, g))
        self._next_offset[p] = offset + 1
        self._next_seq = c + 1
        self._pending_bytes += size
        self.stats["appends"] += 1
        return Ack(p, offset, seq, g.future)

    def observe_seq(self, seq: int) -> None:
        """A cluster edge saw another edge's record ``seq``: its own next
        records number after it (the hybrid logical clock's rule, so that a
        retained publish made after seeing another edge's wins over it)."""
        if self._hlc:
            c = (seq >> SEQ_EDGE_BITS) + 1
            with self._lock:
                if c > self._next_seq:
                    self._next_seq = c

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise CaptureWriteError(f"capture log on Kafka topic {self.topic!r} failed earlier and must be "
                                    f"reopened: {self._failed}")
        if self._stopping or self._closed:
            raise LogClosedError(f"capture log on Kafka topic {self.topic!r} is closed")

    def _wait_for_room(self, size: int, deadline: float | None) -> None:
        self._wait_below_max_pending(size, deadline, "capture log on Kafka", "Kafka")

    def _wait_queue(self, size: int, deadline: float | None) -> None:
        """librdkafka's queue was full: wait for a delivery (or a short while)."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise BackPressureTimeout(
                f"capture log on Kafka: librdkafka's queue is full ({self._pending_bytes} bytes waiting for "
                f"Kafka); append of {size} bytes timed out")
        self._room.wait(0.05 if remaining is None else min(remaining, 0.05))
        self._check_writable()

    def has_room(self, nbytes: int = 0) -> bool:
        """True when an append of ``nbytes`` would not wait for Kafka."""
        with self._lock:
            return not self._pending_bytes or self._pending_bytes + nbytes <= self.max_pending_bytes

    def wait_for_room(self, nbytes: int = 0, timeout: float | None = None) -> bool:
        """Block until an append of ``nbytes`` would not wait; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            try:
                self._wait_for_room(nbytes, deadline)
            except BackPressureTimeout:
                return False
            return True

    # ----------------------------------------------------- flush and close
    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything appended so far is in Kafka. Raises
        CaptureWriteError when the log failed, TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check_writable()
            target = list(self._next_offset)
            while any(d < t for d, t in zip(self._durable, target)):
                if self._failed is not None:
                    raise self._failed
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"capture log on Kafka: flush timed out after {timeout} s")
                self._room.wait(remaining)
            if self._failed is not None:
                raise self._failed

    def close(self) -> None:
        """Wait for every record produced (up to ``kafka.delivery_timeout_ms``),
        stop the poller, release the data_dir. Idempotent. Appends after
        close raise LogClosedError."""
        with self._lock:
            if self._closed or self._stopping:
                return
            self._stopping = True
            self._room.notify_all()
        producer = self._producer
        if producer is not None:
            if self._failed is not None:
                producer.purge()
                producer.flush(5)
            else:
                left = producer.flush(self.delivery_timeout_s + 5)
                if left:
                    self._fail(f"{left} records were still not delivered when the log closed")
        self._settle()  # reports close's flush served
        if self._thread is not None:
            self._thread.join()
        self._settle()
        self._seal()  # confirmed during close's flush, after the poller's last turn
        with self._lock:
            stray = [e for q in self._inflight for e in q]
            for q in self._inflight:
                q.clear()
        for e in stray:  # only after a failure: reports of purged records may be lost
            if not e[_GROUP].future.done():
                e[_GROUP].future.set_exception(self._failed or LogClosedError("capture log closed before Kafka "
                                                                      "confirmed the record"))
        self._producer = None
        self._release()
        with self._lock:
            self._closed = True
        log.info("capture log on Kafka topic %s closed: %d appends, %d confirmed", self.topic,
                 self.stats["appends"], self.stats["deliveries"])

    def _release(self) -> None:
        if self._lock_fd >= 0:
            try:
                os.close(self._lock_fd)  # closing the lock file releases the flock
            except OSError:
                pass
            self._lock_fd = -1

    def apply_retention(self) -> None:
        """Kafka applies the topic's own retention; nothing to do here."""
        return None

    # ------------------------------------------------------------- state
    def stalled(self) -> str | None:
        """Why the log is not healthy although it has not failed: records
        waiting for Kafka's confirmation longer than :data:`STALL_S` (Kafka
        down or slow); None when none is (``/healthz``'s ``capture_log``)."""
        with self._lock:
            waiting = [q[0][_GROUP].t0 for q in self._inflight if q]  # its group's first record: no later
            n = sum(len(q) for q in self._inflight)
        if not waiting:
            return None
        age = time.monotonic() - min(waiting)
        if age < STALL_S:
            return None
        return (f"{n} records waiting {age:.0f} s for Kafka at kafka.bootstrap_servers = "
                f"{self.config.kafka.bootstrap_servers!r} to confirm them"
                f"{' (no broker answers)' if self._down else ''}; nothing of them is acknowledged")

    def __repr__(self) -> str:
        return f"KafkaCaptureLog(topic={self.topic!r}, partitions={self.partitions})"

    # ------------------------------------------------------------ poller
    def _poller(self) -> None:
        try:
            while True:
                self._producer.poll(0.1)
                self._settle()  # the delivery reports this poll served
                self._seal()  # what arrived during the turn: a group of its own, resolved once confirmed
                if self._delivered:
                    self._delivered = False
                    self.stats["commits"] += 1
                    for fn in self.on_durable:
                        fn()
                if self._stopping:
                    with self._lock:
                        if self._failed is not None or not any(self._inflight):
                            return
        except BaseException as exc:  # a bug must not leave acks hanging forever
            log.exception("capture log on Kafka: the poller stopped unexpectedly")
            self._fail(f"the poller stopped: {exc!r}")

    def _on_delivery(self, err, msg) -> None:
        """librdkafka's delivery report (on the poller thread, or close's
        flush): queued, and applied by :meth:`_settle` with the others the
        same poll served, under one lock."""
        self._reports.append((err, msg.partition(), msg.offset()))

    def _settle(self) -> None:
        """Apply the delivery reports queued so far, in the order librdkafka
        gave them: each pops its partition's oldest entry and checks the
        offset; a group whose last record is confirmed resolves; a failed or
        misplaced record fails the log."""
        reports = self._reports
        if not reports:
            return
        done: list[_Group] = []
        seqs: list[int] | None = [] if _FAILPOINTS else None
        failure = None
        confirmed = 0
        with self._lock:
            inflight, durable, nparts = self._inflight, self._durable, self.partitions
            size = 0
            while reports:  # popped under the lock: two threads settling keep the order
                err, p, got = reports.popleft()
                q = inflight[p] if 0 <= p < nparts else None
                if not q:
                    if self._failed is not None:
                        continue  # failed already: its futures are resolved
                    failure = (f"a delivery report for partition {p} that no record awaits", None, False)
                    break
                entry = q.popleft()
                if err is not None:
                    why, unavailable = self._delivery_error(err, p, entry[_OFFSET])
                    failure = (why, entry, unavailable)
                    break
                if got != entry[_OFFSET]:
                    failure = (f"Kafka put the record of partition {p} at offset {got} where offset "
                               f"{entry[_OFFSET]} was predicted [{OFFSET_RULE}]: another producer writes topic "
                               f"{self.topic!r}; the edge must be its only writer", entry, False)
                    break
                durable[p] = got + 1
                size += entry[_SIZE]
                confirmed += 1
                if seqs is not None:
                    seqs.append(entry[_SEQNO])
                g = entry[_GROUP]
                g.pending -= 1
                if not g.pending:
                    if g is self._group:  # every record of the open group is in: no need to wait a turn
                        self._group = _Group()
                        g.sealed = True
                    if g.sealed:
                        done.append(g)
            if confirmed:
                self._pending_bytes -= size
                self.stats["deliveries"] += confirmed
                self.stats["bytes"] += size
                self._delivered = True
                self._room.notify_all()  # appends waiting for room, flush
        if confirmed and self._down:
            self._down = False
            log.warning("capture log on Kafka: Kafka at kafka.bootstrap_servers = %r confirms records again; "
                        "acknowledging resumes", self.config.kafka.bootstrap_servers)
        if seqs:
            for seq in seqs:
                failpoint("capture-kafka-delivered", seq)  # in Kafka, not yet acknowledged
        for g in done:
            self._resolve(g)
        if failure is not None:
            self._fail(failure[0], failure[1], unavailable=failure[2])

    def _delivery_error(self, err, p: int, offset: int) -> tuple[str, bool]:
        """(why, whether Kafka did not answer) of a failed delivery."""
        reason = f"Kafka did not take the record of partition {p} offset {offset}: {err.str()}"
        if err.code() not in _UNAVAILABLE_CODES:
            return reason, False
        within = (f"not confirmed within kafka.delivery_timeout_ms = {self.config.kafka.delivery_timeout_ms} ms: "
                  if err.code() == -192 else "")
        return reason + f" ({within}is Kafka at kafka.bootstrap_servers = {self.config.kafka.bootstrap_servers!r} " \
                        "up?)", True

    def _seal(self) -> None:
        """Close the open group to new records (the poller, after each turn):
        a group's records all wait for its last one, so a group must stop
        growing; resolved now when all of them are confirmed already."""
        with self._lock:
            g = self._group
            if not g.count:
                return
            self._group = _Group()
            g.sealed = True
            if g.pending or self._failed is not None:
                return
        self._resolve(g)

    def _resolve(self, g: _Group) -> None:
        if self.fsync_latency is not None:  # its first record's produce -> its last one's confirmation
            self.fsync_latency.observe(time.monotonic() - g.t0)
        if not g.future.done():
            g.future.set_result(None)
        if g.seqs is not None:
            for seq in g.seqs:
                failpoint("capture-kafka-acked", seq)  # its waiters may have acknowledged

    def _on_error(self, err) -> None:
        """librdkafka's error callback (on the poller thread)."""
        from confluent_kafka import KafkaError

        servers = self.config.kafka.bootstrap_servers
        if err.fatal():
            self._fail(f"the Kafka producer hit a fatal error: {err.str()}")
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            if not self._down:  # one line per outage; librdkafka repeats itself
                self._down = True
                self.stats["outages"] += 1
                with self._lock:
                    waiting = sum(len(q) for q in self._inflight)
                log.warning("capture log on Kafka: no broker answers at kafka.bootstrap_servers = %r (%s): "
                            "nothing is acknowledged until one does (%d records waiting); a record Kafka has "
                            "not confirmed within kafka.delivery_timeout_ms = %d ms fails the capture log (the "
                            "edge then stops)", servers, err.str(), waiting, self.config.kafka.delivery_timeout_ms)
        elif self._down and err.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE):
            log.info("capture log on Kafka (%s): %s", servers, err.str())  # said once already
        else:
            log.warning("capture log on Kafka (%s): %s", servers, err.str())

    def _fail(self, reason: str, entry: _Entry | None = None, unavailable: bool = False) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = CaptureWriteError(
                    f"capture log on Kafka topic {self.topic!r} failed: {reason}; every record appended but not "
                    "yet confirmed by Kafka fails, and so does every later append (nothing depending on them "
                    "may be acknowledged); reopen the log")
                self._failed.unavailable = unavailable
            err = self._failed
            entries = [entry] if entry is not None else []
            for q in self._inflight:
                entries.extend(q)
                q.clear()
            self._room.notify_all()
        log.error("capture log on Kafka topic %s: %s; failing %d unconfirmed appends; reopen the log",
                  self.topic, reason, len(entries))
        for e in entries:
            if not e[_GROUP].future.done():
                e[_GROUP].future.set_exception(err)
