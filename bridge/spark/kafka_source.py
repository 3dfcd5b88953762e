"""The capture log on Kafka (``capture.backend = "kafka"``), read with Spark's own Kafka source.

::

    from bridge.spark.kafka_source import read_capture_stream
    records = read_capture_stream(spark, config)   # spark.readStream.format("kafka")...

The rows have exactly the schema of ``format("lakegate")``
(``schemas.capture.CAPTURE_RECORD_DDL``: key, value, topic, partition,
offset, timestamp, timestampType, headers; the Kafka source's own columns,
``includeHeaders=true``), so the job's parsing, tables and quarantine take
them unchanged. ``topic`` is the Kafka topic (``Config.kafka_topic``), the
``stream`` column of the tables.

Options (:func:`kafka_options`): ``kafka.bootstrap.servers``, ``subscribe``
(the topic), ``includeHeaders=true``, ``startingOffsets=earliest``,
``failOnDataLoss=true`` (records deleted by the topic's retention before the
job read them are an error, as with the local log), and the ``[kafka]``
section's security settings as the Java client's: ``kafka.security.protocol``,
``kafka.sasl.mechanism`` with ``kafka.sasl.jaas.config`` (PlainLoginModule
for PLAIN, ScramLoginModule for SCRAM-SHA-*), a PEM trust store
(``kafka.ssl.truststore.type=PEM``, ``kafka.ssl.truststore.location``) and
a PEM client certificate and key (``kafka.ssl.keystore.type=PEM`` with the
files' contents, ``kafka.ssl.keystore.certificate.chain`` /
``kafka.ssl.keystore.key``: the executors' consumers need not see the
driver's files; the key must be PKCS#8, unencrypted, as the Java client
reads PEM keys). The CA file must be at the same path on the executors
(local mode: it is). :func:`describe` is what may be logged: the password
and the key never are. The stream reads at most ``job.max_records_per_trigger``
records a micro-batch (``maxOffsetsPerTrigger``).

Offsets: Spark's Kafka source keeps them in the checkpoint as
``{"<topic>": {"<partition>": <next offset>}}``; :func:`partition_offsets`
flattens that to the lakegate source's ``{"<partition>": <offset>}`` (the
batch step's size and coverage read them). There is no consumer commit:
Kafka's retention is the topic's, not held back by the job.

A record in the topic the edge did not write (:data:`NOT_A_RECORD`): no
``conn_id`` header, no ``seq`` header or one that is not a decimal number,
or a ``proto`` / ``rel_seq`` / ``reject_code`` header that is not a decimal
number. The job's context columns cast those headers to numbers (with ANSI
SQL on, a malformed one would fail every run of the batch), and ``seq``
orders the retained table. Such a record keeps its key, value and
coordinates, but its headers become a ``reject`` header with the rule id
``LG-capture-not-a-record`` and a ``reject_error`` naming what is wrong,
followed by the record's own headers minus the malformed numeric ones (and
minus ``reject``/``reject_code``/``reject_error``/``ack_refs``): the batch
step quarantines it as it does a frame the edge rejected (the rule id in
``rule``, the parser's finding on the frame in ``parser_rule``), forwards
nothing of it, and goes on. A record with a null value (a tombstone) that
is otherwise a capture record is quarantined by the parser
(``LG-truncated``, an empty record).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from bridge.config import Config

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["KAFKA_PROVIDER", "NOT_A_RECORD", "capture_records", "describe", "kafka_options", "partition_offsets",
           "read_capture_batch", "read_capture_stream", "require_kafka_source"]

log = logging.getLogger(__name__)

#: The rule id of a Kafka record that is not a capture record (module doc).
NOT_A_RECORD = "LG-capture-not-a-record"
#: Spark's Kafka source: present when its jars are on the classpath.
KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

#: Capture headers the job casts to a number, with the most digits each may have.
_NUMERIC = {"seq": 18, "proto": 9, "rel_seq": 18, "reject_code": 9}
#: Headers a non-record loses (its own verdict replaces them; ack_refs or edge would drop it unseen).
_REPLACED = ("reject", "reject_code", "reject_error", "ack_refs", "edge")
_SECRET_OPTIONS = ("kafka.sasl.jaas.config", "kafka.ssl.keystore.key")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quote(text: str) -> str:
    """A JAAS option value: double quotes, with backslash and quote escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kafka_options(config: Config) -> dict[str, str]:
    """The options of Spark's Kafka source for the capture topic (module
    doc). Holds the SASL password and the client key, when configured: log
    :func:`describe` of it, never the dict itself."""
    k = config.kafka
    opts = {
        "kafka.bootstrap.servers": k.bootstrap_servers,
        "subscribe": config.kafka_topic,
        "includeHeaders": "true",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
    }
    protocol = (k.security_protocol or "plaintext").strip().lower()
    opts["kafka.security.protocol"] = protocol.upper()
    if protocol.startswith("sasl_"):
        mechanism = (k.sasl_mechanism or "PLAIN").strip().upper()
        opts["kafka.sasl.mechanism"] = mechanism
        module = _LOGIN_MODULES.get(mechanism)
        if module is not None:
            opts["kafka.sasl.jaas.config"] = (f"{module} required username={_jaas_quote(k.sasl_username)} "
                                              f"password={_jaas_quote(k.sasl_password)};")
        else:  # GSSAPI, OAUTHBEARER...: configured through the JVM's own JAAS file
            log.warning("kafka: sasl_mechanism %s: no login module set by lakegate; the JVM's JAAS "
                        "configuration must provide it", mechanism)
    if protocol in ("ssl", "sasl_ssl"):
        if k.ssl_ca_location:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.location"] = str(k.ssl_ca_location)
        cert, key = k.ssl_certificate_location, k.ssl_key_location
        if cert and (not key or Path(key) == Path(cert)):  # one file with both
            opts["kafka.ssl.keystore.type"] = "PEM"
            opts["kafka.ssl.keystore.location"] = str(cert)
        elif cert and key:
            opts["kafka.ssl.keystore.type"] = "PEM"
            opts["kafka.ssl.keystore.certificate.chain"] = Path(cert).read_text()
            opts["kafka.ssl.keystore.key"] = Path(key).read_text()
    return opts


def describe(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the secrets masked: what may be logged."""
    return {k: ("***" if k in _SECRET_OPTIONS or "password" in k.lower() else v) for k, v in options.items()}


def require_kafka_source(spark: "SparkSession", config: Config) -> None:
    """Spark's Kafka source must be on the session's classpath
    (``.jvm/lib/kafka``: ``bridge.spark.jars``), else
    :class:`bridge.spark.jars.JarsUnusable` (one line naming what to run)."""
    from bridge.spark import jars

    try:
        spark.sparkContext._jvm.org.apache.spark.util.Utils.classForName(KAFKA_PROVIDER, False, False)  # noqa: SLF001
        return
    except Exception:  # py4j: ClassNotFoundException
        pass
    source = config.sources.get("capture.backend", "default")
    bad = jars.problems("kafka", purpose=False)
    why = bad[0] if bad else (f"spark-sql-kafka-0-10 is not on spark-submit's classpath: submit from the checkout "
                              f"with {' '.join(jars.submit_options())}")
    raise jars.JarsUnusable("capture.backend", source, f"capture.backend = kafka (from {source}), but {why}")


def _header(name: str) -> str:
    """SQL: the first header called ``name``, as a string (null when absent)."""
    return f"CAST(get(headers.value, array_position(headers.key, '{name}') - 1) AS STRING)"


def _problems() -> list[tuple[str, str]]:
    """(SQL condition, what it says) of each way a row is not a capture record."""
    out = [(f"{_header('conn_id')} IS NULL", "no conn_id header"),
           (f"{_header('seq')} IS NULL", "no seq header")]
    for name, digits in _NUMERIC.items():
        out.append((f"NOT coalesce({_header(name)} RLIKE '^[0-9]{{1,{digits}}}$', true)",
                    f"header {name} is not a decimal number"))
    return out


def capture_records(raw: "DataFrame") -> "DataFrame":
    """Rows of Spark's Kafka source (``includeHeaders=true``) -> capture
    records (``CAPTURE_RECORD_DDL``, in its column order and types), a
    record that is not a capture record marked as the module doc says."""
    from pyspark.sql import functions as F

    from schemas.ddl import parse_ddl
    from schemas.capture import CAPTURE_RECORD_DDL

    problems = _problems()
    bad = F.expr(" OR ".join(f"({cond})" for cond, _ in problems))
    why = F.concat_ws("; ", *[F.when(F.expr(cond), F.lit(text)) for cond, text in problems])
    keep_sql = " AND ".join(
        [f"h.key NOT IN ({', '.join(repr(k) for k in _REPLACED)})"]
        + [f"NOT (h.key = '{name}' AND NOT coalesce(CAST(h.value AS STRING) RLIKE '^[0-9]{{1,{digits}}}$', false))"
           for name, digits in _NUMERIC.items()])
    verdict = F.array(
        F.struct(F.lit("reject").alias("key"), F.lit(NOT_A_RECORD).cast("binary").alias("value")),
        F.struct(F.lit("reject_error").alias("key"),
                 F.concat(F.lit("not a capture record: "), why).cast("binary").alias("value")))
    kept = F.expr(f"filter(coalesce(headers, array()), h -> {keep_sql})")
    headers = F.when(bad, F.concat(verdict, kept)).otherwise(F.col("headers"))
    cols: dict[str, Column] = {"headers": headers}
    fields = parse_ddl(CAPTURE_RECORD_DDL)
    types = _spark_types(raw)
    return raw.select(*[cols.get(f.name, F.col(f.name)).cast(types[f.name]).alias(f.name) for f in fields])


def _spark_types(df: "DataFrame") -> dict[str, Any]:
    """The Spark types of ``CAPTURE_RECORD_DDL``'s columns."""
    from pyspark.sql.types import StructType

    from schemas.capture import CAPTURE_RECORD_DDL

    return {f.name: f.dataType for f in StructType.fromDDL(CAPTURE_RECORD_DDL).fields}


def read_capture_stream(spark: "SparkSession", config: Config) -> "DataFrame":
    """The capture topic as a streaming DataFrame of capture records, from
    the earliest offset (a checkpoint's offsets win), at most
    ``job.max_records_per_trigger`` records a micro-batch."""
    require_kafka_source(spark, config)
    opts = kafka_options(config)
    opts["maxOffsetsPerTrigger"] = str(config.job.max_records_per_trigger)
    log.info("capture source: kafka %s", describe(opts))
    return capture_records(spark.readStream.format("kafka").options(**opts).load())


def _offsets_json(topic: str, offsets: str | Mapping[int, int]) -> str:
    if isinstance(offsets, str):
        return offsets
    return json.dumps({topic: {str(int(p)): int(o) for p, o in offsets.items()}})


def read_capture_batch(spark: "SparkSession", config: Config, starting: str | Mapping[int, int] = "earliest",
                       ending: str | Mapping[int, int] = "latest") -> "DataFrame":
    """Capture records of the topic between offsets (``spark.read``:
    replays, backfills): ``starting`` / ``ending`` are ``earliest`` /
    ``latest`` or ``{partition: offset}`` (-2 earliest, -1 latest, as
    Kafka's source takes them; ending exclusive)."""
    require_kafka_source(spark, config)
    opts = kafka_options(config)
    opts["startingOffsets"] = _offsets_json(config.kafka_topic, starting)
    opts["endingOffsets"] = _offsets_json(config.kafka_topic, ending)
    return capture_records(spark.read.format("kafka").options(**opts).load())


def partition_offsets(doc: Mapping[str, Any]) -> dict[str, int]:
    """Spark's Kafka source offsets (``{"<topic>": {"<partition>": n}}``)
    as the lakegate source's (``{"<partition>": n}``); a document that is
    already flat is returned as it is. The job subscribes to one topic."""
    if not any(isinstance(v, Mapping) for v in doc.values()):
        return dict(doc)
    out: dict[str, int] = {}
    for per_topic in doc.values():
        if isinstance(per_topic, Mapping):
            for p, o in per_topic.items():
                out[str(p)] = int(o)
    return out
