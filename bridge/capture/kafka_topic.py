"""The capture topic on Kafka: what the edge's log and the readers check
before they use it, and where its records end.

- :func:`inspect_topic`: the topic exists (created when
  ``kafka.create_topic`` allows it) with at least ``capture.partitions``
  partitions, each with a leader [LG-capture-kafka-partitions];
- :func:`topic_configs` and :func:`check_retention`: its clean-up keeps
  every record an unexpired persistent session may still need
  [LG-capture-kafka-retention];
- :func:`read_tail`: each partition's first and end offsets and the next
  capture sequence (from the last record's ``seq`` header), waiting out a
  leader election.

Split from :mod:`bridge.capture.kafka_log`, whose writer runs these at open.
"""

from __future__ import annotations

import logging
import time

from bridge.capture.record import SEQ_HEADER
from bridge.capture.errors import CaptureError, LogMismatchError, LogUnavailableError
from bridge.capture.kafka_conf import client_conf

__all__ = ["AUTH_RULE", "OPEN_TIMEOUT_S", "PARTITIONS_RULE", "RETENTION_RULE", "TAIL_TIMEOUT_S", "admin_client",
           "check_retention", "inspect_topic", "kafka_error", "read_tail", "read_topic_configs", "topic_configs"]

log = logging.getLogger("bridge.capture.kafka_log")  # the log's lines, whichever module writes them

PARTITIONS_RULE = "LG-capture-kafka-partitions"
AUTH_RULE = "LG-capture-kafka-auth"
RETENTION_RULE = "LG-capture-kafka-retention"
#: Seconds open waits for the brokers (metadata, offsets, the last records).
OPEN_TIMEOUT_S = 10.0
#: Seconds open waits for the offsets and last records of the partitions: more
#: than Kafka takes to replace a leader that died (broker.session.timeout.ms,
#: 9 s by default, then the election).
TAIL_TIMEOUT_S = 30.0
_SEQ = SEQ_HEADER


def kafka_error(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else None
    return arg.str() if hasattr(arg, "str") else str(exc)


class ClientErrors:
    """librdkafka's ``error_cb`` for a client: keeps the last error that
    waiting does not cure -- the brokers refused the client's credentials
    (SASL) or its TLS handshake -- for :func:`inspect_topic` to name."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, err) -> None:
        from confluent_kafka import KafkaError

        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL,
                          KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            self.refused = err.str()


def admin_client(config):
    """An AdminClient of ``config.kafka`` whose refused credentials
    :func:`inspect_topic` reports (its ``errors`` argument)."""
    from confluent_kafka.admin import AdminClient

    errors = ClientErrors()
    conf = client_conf(config, "admin")
    conf["error_cb"] = errors
    # its log lines (every refused connection while the brokers are down) would be served by the
    # poll that serves error_cb: inspect_topic says what went wrong in one line of its own
    conf["log_level"] = 0
    return AdminClient(conf), errors


def _refused(config, why: str) -> CaptureError:
    k = config.kafka
    who = (f"kafka.security_protocol = {k.security_protocol!r}"
           + (f", kafka.sasl_mechanism = {k.sasl_mechanism!r}, kafka.sasl_username = {k.sasl_username!r}"
              if k.security_protocol.startswith("sasl") else ""))
    return CaptureError(f"capture log on Kafka: the brokers at kafka.bootstrap_servers = {k.bootstrap_servers!r} "
                        f"refused lakegate ({who}): {why} [{AUTH_RULE}]; check the [kafka] security settings")


def inspect_topic(admin, config, create: bool, timeout: float = OPEN_TIMEOUT_S,
                  errors: ClientErrors | None = None) -> int:
    """Check the capture topic (creating it when missing and ``create`` and
    ``kafka.create_topic``); returns its partition count. Raises
    LogUnavailableError when no broker answers within ``timeout`` seconds,
    LogMismatchError when the topic is missing or has fewer partitions than
    ``capture.partitions``, CaptureError at once when the brokers refuse the
    credentials or the TLS handshake (``errors``: the admin's
    :class:`ClientErrors`, from :func:`admin_client`) [LG-capture-kafka-auth]."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topic = config.kafka_topic
    want = config.capture.partitions
    servers = config.kafka.bootstrap_servers
    deadline = time.monotonic() + timeout
    created = False
    while True:
        remaining = max(deadline - time.monotonic(), 0.1)
        try:  # in steps of a second: a refusal is said at once, not after the whole timeout
            md = admin.list_topics(topic=topic, timeout=min(remaining, 1.0))
        except KafkaException as exc:
            if errors is not None:
                admin.poll(0)  # serves the error callbacks
            if errors is not None and errors.refused:
                raise _refused(config, errors.refused) from None
            if time.monotonic() < deadline:
                time.sleep(0.1)  # a failure at once (connection refused) must not spin
                continue
            raise LogUnavailableError(
                f"capture log on Kafka: no broker answered at kafka.bootstrap_servers = {servers!r} within "
                f"{timeout:g} s ({kafka_error(exc)})") from None
        t = md.topics.get(topic)
        code = t.error.code() if t is not None and t.error is not None else None
        if t is None or code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            if created:
                pass  # created: wait for the metadata to show it
            elif create and config.kafka.create_topic:
                _create_topic(admin, config, NewTopic, KafkaError, KafkaException, remaining)
                created = True
            else:
                raise LogMismatchError(
                    f"capture log on Kafka: topic {topic!r} does not exist at {servers}; create it with "
                    f"{want} partitions, or set kafka.create_topic = true")
        elif code is None and t.partitions and all(
                pm.error is None and pm.leader >= 0 for pm in t.partitions.values()):
            have = len(t.partitions)
            if have < want:
                raise LogMismatchError(
                    f"capture log on Kafka: topic {topic!r} has {have} partitions, fewer than "
                    f"capture.partitions = {want} [{PARTITIONS_RULE}]; add partitions to the topic "
                    f"(kafka-topics --alter --partitions {want}) or set capture.partitions = {have}")
            return have
        elif code is not None and code not in (KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT,
                                               KafkaError.REQUEST_TIMED_OUT):
            raise CaptureError(f"capture log on Kafka: topic {topic!r}: {t.error.str()}")
        if time.monotonic() >= deadline:
            raise LogUnavailableError(
                f"capture log on Kafka: topic {topic!r} at kafka.bootstrap_servers = {servers!r} has no leader "
                f"for every partition after {timeout:g} s")
        time.sleep(0.1)


def _create_topic(admin, config, NewTopic, KafkaError, KafkaException, timeout: float) -> None:
    topic = config.kafka_topic
    nt = NewTopic(topic, num_partitions=config.capture.partitions,
                  replication_factor=config.kafka.replication_factor)
    fut = admin.create_topics([nt], operation_timeout=timeout, request_timeout=timeout)[topic]
    try:
        fut.result(timeout=timeout + 1)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise CaptureError(f"capture log on Kafka: could not create topic {topic!r} "
                               f"(kafka.create_topic = true): {kafka_error(exc)}") from None
    log.info("capture log on Kafka: created topic %s with %d partitions, replication factor %s",
             topic, config.capture.partitions,
             "the brokers' default" if config.kafka.replication_factor < 0 else config.kafka.replication_factor)


def check_retention(config, entries: dict[str, str]) -> None:
    """Refuse a topic whose clean-up would remove what the edge still needs:
    compaction (it keeps one record per key: a client's frames but the last)
    or time retention shorter than a persistent session may stay away
    (``edge.persistent_session_expiry_s``: its queue is positions in the
    topic) [LG-capture-kafka-retention]. Size retention cannot be checked
    against time: a warning."""
    topic = config.kafka_topic
    policy = entries.get("cleanup.policy", "delete")
    if "compact" in policy:
        raise LogMismatchError(
            f"Kafka topic {topic!r} has cleanup.policy={policy}: compaction keeps one record per key (one MQTT "
            "client's last frame) and would delete captured messages; set cleanup.policy=delete "
            f"[{RETENTION_RULE}]")
    expiry_s = config.edge.persistent_session_expiry_s
    retention_ms = int(entries.get("retention.ms", "-1"))
    if retention_ms >= 0 and (expiry_s == 0 or retention_ms < expiry_s * 1000):
        need = "unlimited (-1)" if expiry_s == 0 else f"at least {expiry_s * 1000} ms"
        raise LogMismatchError(
            f"Kafka topic {topic!r} keeps records {retention_ms} ms (retention.ms) but a persistent session may "
            f"stay away {'for ever' if expiry_s == 0 else f'{expiry_s} s'} (edge.persistent_session_expiry_s) and "
            f"its queued messages are positions in the topic: set the topic's retention.ms to {need}, or lower "
            f"edge.persistent_session_expiry_s [{RETENTION_RULE}]")
    if int(entries.get("retention.bytes", "-1")) >= 0:
        log.warning("capture log on Kafka: topic %s has retention.bytes=%s: records may be deleted by size before "
                    "a persistent session that is away has had them [%s]", topic, entries["retention.bytes"],
                    RETENTION_RULE)


def topic_configs(admin, topic: str, timeout: float = OPEN_TIMEOUT_S) -> dict[str, str]:
    """The topic's configuration (its own values, or the brokers' defaults)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    fut = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=timeout)
    (f,) = fut.values()
    try:
        entries = f.result(timeout=timeout + 1)
    except Exception as exc:
        raise CaptureError(f"capture log on Kafka: could not read the configuration of topic {topic!r}: "
                           f"{kafka_error(exc)}") from None
    return {k: e.value for k, e in entries.items() if e.value is not None}


def read_topic_configs(config, admin, timeout: float = TAIL_TIMEOUT_S) -> dict[str, str]:
    """:func:`topic_configs` of the capture topic, waiting out a broker that
    just died: the request goes to the controller or a broker the admin
    client knows, and a dead one is replaced only once Kafka fences it
    (broker.session.timeout.ms, 9 s by default). Attempts of up to
    OPEN_TIMEOUT_S, each after the first with a new admin client (it
    learns the brokers afresh), for up to ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return topic_configs(admin, config.kafka_topic,
                                 max(min(deadline - time.monotonic(), OPEN_TIMEOUT_S), 0.5))
        except CaptureError as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("%s; asking again", exc)
            time.sleep(0.5)
            admin, _errors = admin_client(config)


def read_tail(config, partitions: int, timeout: float = TAIL_TIMEOUT_S) -> tuple[list[int], list[int], int]:
    """(earliest offsets, end offsets, next capture sequence) of the topic's
    first ``partitions`` partitions: the sequence is one more than the
    largest ``seq`` header of each partition's last record (0 when empty).
    Waits up to ``timeout`` seconds for a partition whose leader does not
    answer (a broker just killed leads it until Kafka elects another)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    topic = config.kafka_topic
    deadline = time.monotonic() + timeout
    consumer = Consumer(client_conf(config, "consumer"))
    try:
        lows, ends = [], []
        for p in range(partitions):
            while True:  # attempts of a few seconds: a leader SIGKILLed is replaced only once the controller
                try:     # fences it (broker.session.timeout.ms), and each attempt asks the leader it knows
                    lo, hi = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=max(min(deadline - time.monotonic(), 2.0), 0.5))
                    break
                except KafkaException as exc:
                    if time.monotonic() >= deadline:
                        raise LogUnavailableError(
                            f"capture log on Kafka: could not read the end offset of topic {topic!r} partition "
                            f"{p} at kafka.bootstrap_servers = {config.kafka.bootstrap_servers!r} within "
                            f"{timeout:g} s (is the broker leading it down?): {kafka_error(exc)}") from None
                    consumer.close()  # a new one learns the partition's leader afresh
                    consumer = Consumer(client_conf(config, "consumer"))
            lows.append(lo)
            ends.append(hi)
        want = {p: ends[p] - 1 for p in range(partitions) if ends[p] > lows[p]}
        next_seq = 0
        if want:
            consumer.assign([TopicPartition(topic, p, o) for p, o in want.items()])
            while want:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LogUnavailableError(
                        f"capture log on Kafka: could not read the last record of topic {topic!r} "
                        f"partition(s) {sorted(want)} within {timeout:g} s (the next capture sequence comes "
                        "from their seq headers)")
                msg = consumer.poll(min(remaining, 0.5))
                if msg is None:
                    continue
                if msg.error() is not None:
                    raise CaptureError(f"capture log on Kafka: reading topic {topic!r}: {msg.error().str()}")
                p = msg.partition()
                if want.get(p) != msg.offset():
                    continue
                del want[p]
                seq = dict(msg.headers() or ()).get(_SEQ)
                if seq is None:
                    log.warning("capture log on Kafka: the last record of topic %s partition %d (offset %d) "
                                "has no seq header: not written by lakegate", topic, p, msg.offset())
                    continue
                next_seq = max(next_seq, int(seq) + 1)
        return lows, ends, next_seq
    finally:
        consumer.close()
