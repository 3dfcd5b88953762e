"""KafkaTail: follow partitions of the capture topic as records arrive.

A cluster edge (``cluster.edges`` > 1, ``docs/cluster.md``) delivers to its
subscribers what the other edges captured: it follows their partitions of
the shared topic from given offsets, on a thread of its own::

    tail = KafkaTail(config, {1: 120, 3: 98}, on_records)   # partition -> first offset
    tail.start()
    tail.watermarks()      # per followed partition, the high watermark now (a broker round trip)
    tail.lag()             # records between what was handed out and the last known watermarks
    tail.close()

``on_records(records)`` is called on the tail's thread with a list of
:class:`~bridge.capture.record.Record` in offset order per partition; it
must be quick (the edge hands the list to its event loop). A consumer
reads only up to the high watermark: what every in-sync replica has, what
the writing edge was told is durable, so no edge delivers a message Kafka
could still lose. One consumer, no group, no commits: positions are the
caller's. A read error is logged once per kind and the tail goes on (the
consumer retries); a gap in the offsets (records deleted by retention
before they were read) is logged with its size.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from bridge.capture.kafka_conf import client_conf
from bridge.capture.kafka_reader import kafka_record

__all__ = ["KafkaTail"]

log = logging.getLogger(__name__)

#: records one consume call returns at most
CHUNK = 1000


class KafkaTail:
    """See the module docstring."""

    def __init__(self, config, start: dict[int, int], on_records: Callable[[list], None],
                 name: str = "capture-kafka-tail") -> None:
        self.config = config
        self.topic = config.kafka_topic
        #: partition -> the next offset to hand out
        self.positions: dict[int, int] = dict(start)
        self.on_records = on_records
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = None
        self._meta = None
        self._meta_lock = threading.Lock()
        #: the watermarks read last (partition -> high), for lag()
        self.known: dict[int, int] = dict(start)
        #: counters: records handed out, batches, errors
        self.stats = {"records": 0, "batches": 0, "errors": 0, "gaps": 0}

    def start(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        conf = client_conf(self.config, "consumer")
        conf.setdefault("fetch.wait.max.ms", 5)  # a record waits at most this long in the broker
        self._consumer = Consumer(conf)
        if self.positions:
            self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in self.positions.items()])
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen_errors: set[str] = set()
        consumer = self._consumer
        positions = self.positions
        while not self._stop.is_set():
            try:
                first = consumer.poll(0.1)  # (consume would wait for a whole CHUNK or its timeout)
                if first is None:
                    continue
                msgs = [first, *consumer.consume(CHUNK - 1, timeout=0)]
            except Exception as exc:  # noqa: BLE001 - a closed consumer at shutdown, or a client error
                if self._stop.is_set():
                    return
                log.warning("cluster tail of %s: %s", self.topic, exc)
                time.sleep(0.5)
                continue
            out = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == -191:  # _PARTITION_EOF
                        continue
                    self.stats["errors"] += 1
                    what = err.str()
                    if what not in seen_errors:
                        seen_errors.add(what)
                        log.warning("cluster tail of %s partition %s: %s (the consumer retries; said once)",
                                    self.topic, m.partition(), what)
                    continue
                p, o = m.partition(), m.offset()
                want = positions.get(p)
                if want is None or o < want:
                    continue
                if o > want:
                    self.stats["gaps"] += 1
                    log.warning("cluster tail of %s partition %d: offsets %d..%d were deleted before this edge "
                                "read them (retention); their messages are not delivered here", self.topic, p,
                                want, o - 1)
                try:
                    out.append(kafka_record(m, p))
                except Exception as exc:  # noqa: BLE001 - not a capture record: skipped, said once per kind
                    what = f"not a capture record: {exc}"
                    if what not in seen_errors:
                        seen_errors.add(what)
                        log.warning("cluster tail of %s partition %d offset %d: %s", self.topic, p, o, exc)
                positions[p] = o + 1
            if out:
                self.stats["records"] += len(out)
                self.stats["batches"] += 1
                try:
                    self.on_records(out)
                except Exception:  # noqa: BLE001 - the loop closed meanwhile (shutdown)
                    if self._stop.is_set():
                        return
                    log.exception("cluster tail of %s: handing out %d records failed", self.topic, len(out))

    def watermarks(self, timeout: float = 5.0) -> dict[int, int]:
        """Per followed partition, the high watermark (asks the brokers)."""
        from confluent_kafka import Consumer, TopicPartition

        with self._meta_lock:
            if self._meta is None:
                self._meta = Consumer(client_conf(self.config, "consumer"))
            out = {}
            for p in list(self.positions):
                _lo, hi = self._meta.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)
                out[p] = hi
            self.known = out
            return out

    def lag(self) -> int:
        """Records between what was handed out and the watermarks read last."""
        return sum(max(0, hi - self.positions.get(p, hi)) for p, hi in self.known.items())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for c in (self._consumer, self._meta):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing at shutdown
                    pass
        self._consumer = self._meta = None


def beat_partition(edge: int, edges: int, partitions: int) -> int:
    """The partition a cluster edge's beats go to (its partition key ``edge<k>``)."""
    from bridge.capture.record import partition_for

    own = [p for p in range(partitions) if p % edges == edge]
    return own[partition_for(f"edge{edge}", len(own))]


def last_beats(config, chunk: int = 1000, max_chunks: int = 20) -> dict[int, dict]:
    """The newest ``beat`` record of each cluster edge (``cluster.edges``),
    read backwards from the end of its beat partition a ``chunk`` at a time
    (at most ``max_chunks``): edge id -> {"seen": its wall time, "info":
    what it said, "partition", "offset"}. For ``lakegate status`` on any
    machine that reaches Kafka."""
    import json

    from bridge.capture.kafka_reader import KafkaLogReader

    edges = config.cluster.edges
    out: dict[int, dict] = {}
    reader = KafkaLogReader(config)
    try:
        lows = reader.earliest_offsets()
        ends = reader.durable_offsets()
        for edge in range(edges):
            p = beat_partition(edge, edges, reader.partitions)
            hi = ends[p]
            for _ in range(max_chunks):
                if hi <= lows[p]:
                    break
                lo = max(lows[p], hi - chunk)
                found = None
                for r in reader.records(p, lo, hi):
                    if not r.value and dict(r.stored_headers).get("edge") == b"beat":
                        found = r
                hi = lo
                if found is not None:
                    h = dict(found.stored_headers)
                    try:
                        info = json.loads(h.get("edge_info", b"{}"))
                    except ValueError:
                        info = {}
                    out[edge] = {"seen": found.timestamp_us / 1e6, "info": info, "partition": p,
                                 "offset": found.offset}
                    break
    finally:
        reader.close()
    return out
