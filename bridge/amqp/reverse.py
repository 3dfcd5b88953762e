"""AMQP 1.0 message -> the MQTT PUBLISH (or PUBREL) the edge sends its
subscribers: the inverse of :mod:`bridge.amqp.mapping`, as data. Pure.

``map_message(message, address, profile, now)`` gives a :class:`Downlink`
or raises :class:`ReverseMappingError`, whose ``rule`` and message say why
(the receiving link rejects the delivery with them, ``amqp:decode-error``
or ``amqp:not-allowed``); a message lakegate itself forwarded (it carries
``lakegate-id``) gives :data:`OWN`: the edge delivered it already, from its
capture log, and it must not reach MQTT subscribers a second time.

Each MQTT field is one :class:`ReverseRule` of a profile's table
(:data:`REVERSE`), the same profiles as the forward mapping (``seed``: the
front-end design's ``x-qos`` / ``x-retain``; ``enmasse``: ``x-opt-mqtt-qos``
/ ``x-opt-retain-message``); the tables also give the README's reverse
mapping table (:func:`reverse_table_markdown`).

Field by field (MQTT <- AMQP):

* **topic** <- ``properties.to`` (the verbatim topic lakegate's forward
  mapping and the seed's AMQP_PUBLISH set), else RabbitMQ's
  ``x-routing-key`` annotation (a message published over AMQP 0-9-1), else
  the link's address when it names one topic: ``/topic/<routing key>`` and
  ``/exchange/amq.topic/<routing key>`` give the routing key with ``.`` as
  ``/`` (RabbitMQ's MQTT plugin's rule, the inverse of
  :func:`bridge.amqp.mapping.routing_key`); any other address (a client's
  own ``$mqtt.to.<client id>``, a queue) names no topic. No usable topic --
  none, empty, with ``+``/``#`` [MQTT-3.3.2-2], with U+0000 [MQTT-4.7.3-2]
  or longer than 65,535 bytes [MQTT-4.7.3-3] -- rejects the message
  [``LG-amqp-no-topic``];
* **payload** <- the Data section (bytes); an AmqpValue string (UTF-8, and
  Payload Format Indicator 1) or binary; any other body (a sequence, a map,
  a number) is rejected [``LG-amqp-body``];
* **QoS** <- the profile's QoS annotation (0, 1 or 2; another value is
  rejected [``LG-amqp-qos``]); without it the seed's rule: ``durable`` true
  -> 1, false -> 0. Each subscription gets min(this, its granted QoS);
* **RETAIN** <- the profile's retain annotation (delivered per the
  server-to-client rules: RETAIN 0 unless Retain As Published);
* **Message Expiry Interval** <- ``header.ttl`` (ms, rounded up to whole
  seconds), else ``absolute-expiry-time`` (the seconds left at receipt);
  none left: :attr:`Downlink.expired` (not delivered, the delivery
  accepted: it was consumed, and is dropped as MQTT drops an expired
  message [MQTT-3.3.2-5]);
* **Content Type** <- ``content-type`` (or the non-ASCII annotation the
  forward mapping uses), **Correlation Data** <- ``correlation-id`` (binary
  as is; a string as UTF-8; a number or UUID as its text),
  **Response Topic** <- ``reply-to`` (a topic address as its topic, else
  verbatim), **User Properties** <- the application properties but
  ``lakegate-id``, in order, values as text (or the ordered annotation
  list, when present: lossless), **Payload Format Indicator** <- its
  annotation.
* **PUBREL** <- ``subject`` "pubrel" (AMQP_PUBREL, QoS 2's second step):
  :attr:`Downlink.pubrel`, with ``message-id``.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from bridge.amqp.mapping import (
    ANN_CONTENT_TYPE, ANN_PAYLOAD_FORMAT, ANN_USER_PROPERTIES, ID_PROPERTY, PROFILES,
)

__all__ = [
    "Downlink", "NO_TOPIC", "BAD_BODY", "BAD_QOS", "OWN", "REVERSE", "ReverseMappingError",
    "ReverseRule", "map_message", "reverse_table_markdown", "topic_of_address",
]

NO_TOPIC = "LG-amqp-no-topic"
BAD_BODY = "LG-amqp-body"
BAD_QOS = "LG-amqp-qos"
#: what :func:`map_message` returns for a message lakegate forwarded itself
OWN = object()

_TOPIC_PREFIXES = ("/topic/", "/exchange/amq.topic/")


class ReverseMappingError(ValueError):
    """An AMQP message no MQTT PUBLISH can be made of; ``rule`` says why."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


@dataclass
class Downlink:
    """One AMQP message as MQTT: what every matching subscription gets
    (each at min(``qos``, its granted QoS))."""

    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    #: Message Expiry Interval left at receipt, seconds (None: none)
    expiry: int | None = None
    expired: bool = False
    payload_format_indicator: int | None = None
    content_type: str | None = None
    correlation_data: bytes | None = None
    response_topic: str | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    #: AMQP_PUBREL (QoS 2's second step) rather than AMQP_PUBLISH
    pubrel: bool = False
    message_id: Any = None


@dataclass(frozen=True)
class ReverseRule:
    """One MQTT field: how it is read from the message, and its documentation."""

    mqtt: str
    read: Callable[[Any, str, dict, float, Downlink], None]
    doc_amqp: str
    doc_rule: str


# --------------------------------------------------------------- helpers
def topic_of_address(address: str | None) -> str | None:
    """The MQTT topic a topic address names (``/topic/a.b`` -> ``a/b``), or
    None for an address that names none (a client's own address, a queue)."""
    if not address:
        return None
    for prefix in _TOPIC_PREFIXES:
        if address.startswith(prefix) and len(address) > len(prefix):
            return address[len(prefix):].replace(".", "/")
    return None


def _check_topic(topic: str) -> str:
    if not topic:
        raise ReverseMappingError(NO_TOPIC, "the message names no topic: no 'to' property, and "
                                            "its address is not a topic address")
    if "+" in topic or "#" in topic:
        raise ReverseMappingError(NO_TOPIC, f"topic {topic!r} contains a wildcard "
                                            "[MQTT-3.3.2-2]")
    if "\x00" in topic:
        raise ReverseMappingError(NO_TOPIC, "the topic contains U+0000 [MQTT-4.7.3-2]")
    if len(topic.encode("utf-8", "surrogatepass")) > 65535:
        raise ReverseMappingError(NO_TOPIC, "the topic is longer than 65,535 bytes [MQTT-4.7.3-3]")
    return topic


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


# --------------------------------------------------------------- rule bodies
def _topic(m, address, ann, now, out: Downlink) -> None:
    to = m.address
    if not to:
        rk = ann.get("x-routing-key")  # RabbitMQ's, on a message published over AMQP 0-9-1
        if rk:
            to = str(rk).replace(".", "/")
        else:
            to = topic_of_address(address) or ""
            if "*" in to or "#" in to:
                raise ReverseMappingError(NO_TOPIC, "the message has no 'to' (its topic) and "
                                                    f"arrived over the wildcard address {address!r}")
    out.topic = _check_topic(to)


def _payload(m, address, ann, now, out: Downlink) -> None:
    body = m.body
    if body is None:
        out.payload = b""
    elif isinstance(body, (bytes, bytearray, memoryview)):
        out.payload = bytes(body)  # a copy: proton's buffer is reused
    elif isinstance(body, str):
        out.payload = body.encode("utf-8")
        if out.payload_format_indicator is None:
            out.payload_format_indicator = 1
    else:
        raise ReverseMappingError(BAD_BODY, f"a body of {type(body).__name__} is not a payload "
                                            "(a Data section, or an AmqpValue string or binary)")


def _qos_reader(name: str):
    def read(m, address, ann, now, out: Downlink) -> None:
        q = ann.get(name)
        if q is None:
            out.qos = 1 if m.durable else 0  # the seed's rule when the annotation is absent
            return
        try:
            q = int(q)
        except (TypeError, ValueError):
            q = -1
        if q not in (0, 1, 2):
            raise ReverseMappingError(BAD_QOS, f"annotation {name} is {ann.get(name)!r}, "
                                               "not a QoS 0, 1 or 2")
        out.qos = q
    return read


def _retain_reader(name: str):
    def read(m, address, ann, now, out: Downlink) -> None:
        out.retain = bool(ann.get(name))
    return read


def _expiry(m, address, ann, now, out: Downlink) -> None:
    ttl = m.ttl  # proton: float seconds, 0 for none
    if ttl:
        out.expiry = max(0, math.ceil(ttl - 1e-9))
    elif m.expiry_time:
        out.expiry = max(0, math.ceil(m.expiry_time - now - 1e-9))
    if out.expiry == 0:
        out.expired = True


def _pfi(m, address, ann, now, out: Downlink) -> None:
    v = ann.get(ANN_PAYLOAD_FORMAT)
    if v is not None:
        out.payload_format_indicator = int(v)


def _content_type(m, address, ann, now, out: Downlink) -> None:
    ct = ann.get(ANN_CONTENT_TYPE) or m.content_type
    out.content_type = None if ct is None else str(ct)


def _correlation(m, address, ann, now, out: Downlink) -> None:
    c = m.correlation_id
    if c is None:
        return
    if isinstance(c, (bytes, bytearray, memoryview)):
        out.correlation_data = bytes(c)  # a copy: it may be a view into proton's buffer
    elif isinstance(c, uuid.UUID):
        out.correlation_data = str(c).encode()
    else:
        out.correlation_data = _text(c).encode("utf-8")


def _reply_to(m, address, ann, now, out: Downlink) -> None:
    rt = m.reply_to
    if rt:
        out.response_topic = topic_of_address(rt) or rt


def _user_properties(m, address, ann, now, out: Downlink) -> None:
    full = ann.get(ANN_USER_PROPERTIES)
    if full:
        out.user_properties = [(_text(k), _text(v)) for k, v in full]
        return
    props = m.properties or {}
    out.user_properties = [(_text(k), _text(v)) for k, v in props.items() if k != ID_PROPERTY]


def _rules(qos_ann: str, retain_ann: str) -> tuple[ReverseRule, ...]:
    return (
        ReverseRule("topic", _topic, "`to`, else the routing key of a `/topic/...` address "
                    "(`.` as `/`)", NO_TOPIC),
        ReverseRule("payload", _payload, "Data section; AmqpValue string (UTF-8, Payload Format "
                    "Indicator 1) or binary", BAD_BODY),
        ReverseRule("QoS", _qos_reader(qos_ann), f"`{qos_ann}` annotation; absent: `durable` true "
                    "-> 1, false -> 0", BAD_QOS),
        ReverseRule("RETAIN", _retain_reader(retain_ann), f"`{retain_ann}` annotation "
                    "(delivered as RETAIN 0 unless Retain As Published)", "MQTT-3.3.1-12"),
        ReverseRule("Message Expiry Interval", _expiry, "`ttl` (ms, rounded up), else "
                    "`absolute-expiry-time` (seconds left)", "MQTT-3.3.2-5"),
        ReverseRule("Payload Format Indicator", _pfi, f"`{ANN_PAYLOAD_FORMAT}` annotation", "-"),
        ReverseRule("Content Type", _content_type, f"`content-type` (or `{ANN_CONTENT_TYPE}`)", "-"),
        ReverseRule("Correlation Data", _correlation, "`correlation-id` (binary as is, else its "
                    "text as UTF-8)", "-"),
        ReverseRule("Response Topic", _reply_to, "`reply-to` (a topic address as its topic)", "-"),
        ReverseRule("User Properties", _user_properties, "application properties but "
                    f"`{ID_PROPERTY}`, values as text (or `{ANN_USER_PROPERTIES}`, ordered)",
                    "MQTT-3.3.2-18"),
    )


#: profile name -> its reverse rules (the forward profiles' annotation names)
REVERSE: dict[str, tuple[ReverseRule, ...]] = {
    "seed": _rules("x-qos", "x-retain"),
    "enmasse": _rules("x-opt-mqtt-qos", "x-opt-retain-message"),
}
if set(REVERSE) != set(PROFILES):  # one reverse table per forward profile
    raise RuntimeError(f"reverse mapping profiles {sorted(REVERSE)} differ from {sorted(PROFILES)}")


def map_message(message, address: str | None, profile: str, now: float):
    """The :class:`Downlink` of a proton ``message`` received on ``address``
    (``now``: epoch seconds), :data:`OWN` for a message lakegate forwarded;
    raises :class:`ReverseMappingError`."""
    props = message.properties or {}
    if ID_PROPERTY in props:
        return OWN
    ann = {str(k): v for k, v in (message.annotations or {}).items()}
    if message.subject == "pubrel":
        return Downlink(topic=message.address or topic_of_address(address) or "", qos=2,
                        pubrel=True, message_id=message.id)
    out = Downlink(message_id=message.id)
    for rule in REVERSE[profile]:
        rule.read(message, address, ann, now, out)
    return out


def reverse_table_markdown(profile: str) -> str:
    """The README's table of one profile's reverse mapping."""
    lines = ["| MQTT | from AMQP | rule |", "|---|---|---|"]
    for r in REVERSE[profile]:
        lines.append(f"| {r.mqtt} | {r.doc_amqp} | {r.doc_rule} |")
    return "\n".join(lines)
