"""librdkafka settings of the capture log on Kafka, from ``config.kafka``.

:func:`client_conf` is the one place that turns the ``[kafka]`` section into
a librdkafka configuration dict, for the edge's producer, the readers'
consumers and the admin client alike (the Spark side reuses it). No Kafka
import here: building the dict needs none.

:func:`printable` is the dict as it may be logged: the SASL password masked.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["READER_GROUP", "client_conf", "printable"]

#: The consumer group id of capture readers: they ``assign`` partitions and
#: never commit, so the group only names them in the brokers' logs.
READER_GROUP = "lakegate-reader"

_SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password"})
#: librdkafka's own log lines go to this logger (not to stderr)
_RDKAFKA_LOG = logging.getLogger("bridge.capture.rdkafka")


def client_conf(config, role: str = "admin", *, logger: bool = True) -> dict[str, Any]:
    """The librdkafka configuration of a client of the capture topic.

    ``config``: the whole :class:`bridge.config.Config`. ``role``:

    - ``"admin"``: the connection only (servers, security, TLS, SASL);
    - ``"producer"``: plus the edge's producer: idempotent, ``acks=all``, at
      most 5 requests in flight (ordering and no duplicates survive retries),
      ``kafka.linger_ms``, ``kafka.delivery_timeout_ms``, ``kafka.compression``;
    - ``"consumer"``: plus a reader's consumer: group :data:`READER_GROUP`,
      no commits, ``read_uncommitted`` (the high watermark is the end).

    Topics are never created by a metadata request (``allow.auto.create.topics``
    false): only :class:`~bridge.capture.kafka_log.KafkaCaptureLog` creates
    the topic, when ``kafka.create_topic`` says so. ``logger``: route
    librdkafka's log lines to Python logging (False for a dict that must be
    picklable or printed).
    """
    k = config.kafka
    conf: dict[str, Any] = {
        "bootstrap.servers": k.bootstrap_servers,
        "client.id": "lakegate",
        "security.protocol": k.security_protocol,
        "allow.auto.create.topics": False,
        "socket.connection.setup.timeout.ms": 10000,
    }
    if k.security_protocol.startswith("sasl"):
        conf["sasl.mechanism"] = k.sasl_mechanism
        if k.sasl_username:
            conf["sasl.username"] = k.sasl_username
        if k.sasl_password:
            conf["sasl.password"] = k.sasl_password
    if k.security_protocol in ("ssl", "sasl_ssl"):
        for key, value in (("ssl.ca.location", k.ssl_ca_location),
                           ("ssl.certificate.location", k.ssl_certificate_location),
                           ("ssl.key.location", k.ssl_key_location)):
            if value:
                conf[key] = value
    if role == "producer":
        conf.update({
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": float(k.linger_ms),
            "delivery.timeout.ms": int(k.delivery_timeout_ms),
            "compression.type": k.compression,
            # delivery reports carry no payload copy: the log keeps its own bookkeeping
            "delivery.report.only.error": False,
        })
    elif role == "consumer":
        conf.update({
            "group.id": READER_GROUP,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": False,
            # readers read bounded ranges of records that are there: the broker answers a fetch at once
            # when it has data; a fetch past a range's end (librdkafka prefetches) must not hold the next
            # range's first read (measured: 100 ms a read with 100, for the live forwarder a round trip)
            "fetch.wait.max.ms": 10,
        })
    elif role != "admin":
        raise ValueError(f"client_conf: role must be admin, producer or consumer, not {role!r}")
    if logger:
        conf["logger"] = _RDKAFKA_LOG
    return conf


def printable(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` as it may be logged or shown: secrets masked, the logger left out."""
    return {key: ("****" if key in _SECRET_KEYS and value else value)
            for key, value in conf.items() if key != "logger"}
