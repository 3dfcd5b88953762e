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
  the link's address when it names one topic: the inverse of
  ``amqp.address_template``, or RabbitMQ's ``/topic/<routing key>`` and
  ``/exchange/amq.topic/<routing key>`` give the routing key with ``.`` as
  ``/`` (RabbitMQ's MQTT plugin's rule, the inverse of
  :func:`bridge.amqp.mapping.routing_key`); any other address (a client's
  own ``$mqtt.to.<client id>``, a queue) names no topic. No usable topic --
  none, empty, with ``+``/``#`` [MQTT-3.3.2-2], with U+0000 [MQTT-4.7.3-2]
  or longer than 65,535 bytes [MQTT-4.7.3-3] -- rejects the message
  [``LG-amqp-no-topic``]; a topic taken from an address that holds text
  of ``amqp.address_refuse`` (the peer's: a list of destinations, a
  queue name) too [``LG-amqp-address-chars``];
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
  **Response Topic** <- ``reply-to`` (a topic address, read through
  ``amqp.address_template`` or RabbitMQ's forms, as its topic, else
  verbatim), **User Properties** <- the application properties but
  ``lakegate-id``, in order, values as text (or the ordered annotation
  list, when present: lossless), **Payload Format Indicator** <- its
  annotation (0 or 1, else rejected [``LG-amqp-payload-format``]).
* **PUBREL** <- ``subject`` "pubrel" (AMQP_PUBREL, QoS 2's second step):
  :attr:`Downlink.pubrel`, with ``message-id``.

Typed AMQP values (uint, int, long, boolean, symbol, timestamp, ...) become
what they say, never a Python repr (:func:`text_of`: ``uint(7)`` -> ``7``,
``True`` -> ``true``); an absent ``content-type`` is no Content Type
(python-qpid-proton 0.40 reads it as ``symbol('None')``).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import cproton  # python-qpid-proton's C binding (_content_type_of)

from bridge.amqp.addresses import refused_in
from bridge.amqp.mapping import (
    ADDRESS_CHARS, ANN_CONTENT_TYPE, ANN_PAYLOAD_FORMAT, ANN_USER_PROPERTIES, ID_PROPERTY, PROFILES,
)

__all__ = [
    "Downlink", "NO_TOPIC", "BAD_BODY", "BAD_PFI", "BAD_QOS", "OWN", "REVERSE", "ReverseMappingError",
    "ReverseRule", "map_message", "reverse_table_markdown", "text_of", "topic_of_address",
]

NO_TOPIC = "LG-amqp-no-topic"
BAD_BODY = "LG-amqp-body"
BAD_QOS = "LG-amqp-qos"
BAD_PFI = "LG-amqp-payload-format"
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
    #: ``amqp.address_template`` the topic addresses were made with (read by the rules)
    template: str | None = field(default=None, repr=False, compare=False)
    #: ``amqp.address_refuse``: text a topic taken from an address must not hold
    refuse: str = field(default="", repr=False, compare=False)
    #: a ``to`` of the template's form is an address (the peer's anonymous relay)
    to_may_be_address: bool = field(default=False, repr=False, compare=False)


@dataclass(frozen=True)
class ReverseRule:
    """One MQTT field: how it is read from the message, and its documentation."""

    mqtt: str
    read: Callable[[Any, str, dict, float, Downlink], None]
    doc_amqp: str
    doc_rule: str


# --------------------------------------------------------------- helpers
def topic_of_address(address: str | None, template: str | None = None) -> str | None:
    """The MQTT topic a topic address names, or None for an address that
    names none (a client's own address, a queue): the inverse of
    ``amqp.address_template`` (``template``; ``topic://{routing_key}``
    makes ``topic://a.b`` -> ``a/b``, ``{topic}`` is the topic verbatim),
    else RabbitMQ's forms (``/topic/a.b``, ``/exchange/amq.topic/a.b``)."""
    if not address:
        return None
    if template:
        for name, undo in (("{routing_key}", True), ("{topic}", False)):
            at = template.find(name)
            if at < 0 or template.count("{") != 1:
                continue
            head, tail = template[:at], template[at + len(name):]
            if len(address) > len(head) + len(tail) and address.startswith(head) \
                    and address.endswith(tail):
                inner = address[len(head):len(address) - len(tail)]
                return inner.replace(".", "/") if undo else inner
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


def text_of(value: Any) -> str:
    """An AMQP value as the text an MQTT User Property (or a log line) holds:
    what the value is, never a Python repr. python-qpid-proton gives typed
    values as subclasses whose ``str`` is their repr (``uint(7)``,
    ``int32(-3)``, ``symbol('a')``): integers of every width (and
    ``timestamp``, milliseconds since the epoch) as decimal digits, floats
    as the shortest text that reads back the same, booleans as ``true`` /
    ``false``, null as the empty string, strings, symbols and chars as
    themselves, binary as UTF-8 (invalid bytes replaced), a UUID in its
    8-4-4-4-12 form, a list or map as JSON of the same."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(float(value))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple, dict)):
        import json

        return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _plain(value: Any) -> Any:
    """A list or map of AMQP values as JSON's values (for :func:`text_of`)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {text_of(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return text_of(value)


def _content_type_of(m) -> str | None:
    """The message's content-type, None when absent: python-qpid-proton
    0.40 reads an absent one as ``symbol('None')`` (its getter wraps the C
    NULL), so the C field is asked directly."""
    try:
        ct = cproton.pn_message_get_content_type(m._msg)
    except AttributeError:  # not a proton Message (or a proton without that field)
        ct = m.content_type
    return None if ct is None else text_of(ct)


# --------------------------------------------------------------- rule bodies
def _refused_text(topic: str, address: str | None, out: Downlink) -> None:
    bad = refused_in(topic, out.refuse)
    if bad is not None:  # the peer read it: a list of destinations, a queue name
        raise ReverseMappingError(ADDRESS_CHARS, f"the message's topic comes from the address "
                                                 f"{(address or '')[:200]!r}, which holds {bad!r}: the peer "
                                                 "reads it (amqp.address_refuse)")


def _from_address(to: str, out: Downlink) -> str:
    """``to`` read back through ``amqp.address_template`` when it has the
    template's form (``topic://a.b`` -> ``a/b``), else ``to`` as it is."""
    topic = topic_of_address(to, out.template) if out.template else None
    if topic is None or topic == to:
        return to
    _refused_text(topic, to, out)
    return topic


def _topic(m, address, ann, now, out: Downlink) -> None:
    to = m.address
    if to and out.to_may_be_address:  # a producer on the anonymous relay: `to` is where it sent
        to = _from_address(text_of(to), out)
    if not to:
        rk = ann.get("x-routing-key")  # RabbitMQ's, on a message published over AMQP 0-9-1
        if rk:
            to = text_of(rk).replace(".", "/")
        else:
            to = topic_of_address(address, out.template) or ""
            if "*" in to or "#" in to or ">" in to:  # RabbitMQ's and ActiveMQ's wildcards
                raise ReverseMappingError(NO_TOPIC, "the message has no 'to' (its topic) and "
                                                    f"arrived over the wildcard address {address!r}")
            _refused_text(to, address, out)
    out.topic = _check_topic(text_of(to))


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
            raise ReverseMappingError(BAD_QOS, f"annotation {name} is {text_of(ann.get(name))[:64]!r}, "
                                               "not a QoS 0, 1 or 2")
        out.qos = q
    return read


def _retain_reader(name: str):
    def read(m, address, ann, now, out: Downlink) -> None:
        v = ann.get(name)
        if isinstance(v, (str, bytes)):  # a client that sends the text: "true" / "false"
            v = text_of(v).strip().lower() in ("true", "1")
        out.retain = bool(v)
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
        try:
            v = int(v)
        except (TypeError, ValueError):
            v = -1
        if v not in (0, 1):
            raise ReverseMappingError(BAD_PFI, f"annotation {ANN_PAYLOAD_FORMAT} is "
                                               f"{text_of(ann.get(ANN_PAYLOAD_FORMAT))[:64]!r}, not 0 or 1 "
                                               "[MQTT-3.3.2-4]")
        out.payload_format_indicator = v


def _content_type(m, address, ann, now, out: Downlink) -> None:
    ct = ann.get(ANN_CONTENT_TYPE)
    out.content_type = text_of(ct) if ct is not None else _content_type_of(m)


def _correlation(m, address, ann, now, out: Downlink) -> None:
    c = m.correlation_id
    if c is None:
        return
    if isinstance(c, (bytes, bytearray, memoryview)):
        out.correlation_data = bytes(c)  # a copy: it may be a view into proton's buffer
    else:
        out.correlation_data = text_of(c).encode("utf-8")


def _reply_to(m, address, ann, now, out: Downlink) -> None:
    rt = m.reply_to
    if rt:
        rt = text_of(rt)
        out.response_topic = topic_of_address(rt, out.template) or rt


def _user_properties(m, address, ann, now, out: Downlink) -> None:
    full = ann.get(ANN_USER_PROPERTIES)
    if full:
        out.user_properties = [(text_of(k), text_of(v)) for k, v in full]
        return
    props = m.properties or {}
    out.user_properties = [(text_of(k), text_of(v)) for k, v in props.items() if k != ID_PROPERTY]


def _rules(qos_ann: str, retain_ann: str) -> tuple[ReverseRule, ...]:
    return (
        ReverseRule("topic", _topic, "`to`, else the topic of the link's address: the inverse of "
                    "`amqp.address_template`, or RabbitMQ's `/topic/...` (`.` as `/`); from an address, "
                    "none of `amqp.address_refuse`", f"{NO_TOPIC}, {ADDRESS_CHARS}"),
        ReverseRule("payload", _payload, "Data section; AmqpValue string (UTF-8, Payload Format "
                    "Indicator 1) or binary", BAD_BODY),
        ReverseRule("QoS", _qos_reader(qos_ann), f"`{qos_ann}` annotation; absent: `durable` true "
                    "-> 1, false -> 0", BAD_QOS),
        ReverseRule("RETAIN", _retain_reader(retain_ann), f"`{retain_ann}` annotation "
                    "(delivered as RETAIN 0 unless Retain As Published)", "MQTT-3.3.1-12"),
        ReverseRule("Message Expiry Interval", _expiry, "`ttl` (ms, rounded up), else "
                    "`absolute-expiry-time` (seconds left)", "MQTT-3.3.2-5"),
        ReverseRule("Payload Format Indicator", _pfi, f"`{ANN_PAYLOAD_FORMAT}` annotation "
                    "(0 or 1)", BAD_PFI),
        ReverseRule("Content Type", _content_type, f"`content-type` (or `{ANN_CONTENT_TYPE}`)", "-"),
        ReverseRule("Correlation Data", _correlation, "`correlation-id` (binary as is, else its "
                    "text as UTF-8)", "-"),
        ReverseRule("Response Topic", _reply_to, "`reply-to` (a topic address, through "
                    "`amqp.address_template` or RabbitMQ's forms, as its topic)", "-"),
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


def map_message(message, address: str | None, profile: str, now: float,
                address_template: str | None = None, address_refuse: str = "",
                to_may_be_address: bool = False):
    """The :class:`Downlink` of a proton ``message`` received on ``address``
    (``now``: epoch seconds), :data:`OWN` for a message lakegate forwarded;
    raises :class:`ReverseMappingError`. ``address_template``: the
    configured ``amqp.address_template``, whose addresses name topics too
    (a ``reply-to``, the link's address); ``address_refuse``: the
    configured ``amqp.address_refuse``, text a topic taken from an address
    must not hold [LG-amqp-address-chars]; ``to_may_be_address``: the
    peer's (``bridge.peers``), a ``to`` of the template's form is read back
    as its topic (a producer on the anonymous relay sets ``to`` to the
    address it sends to)."""
    props = message.properties or {}
    if ID_PROPERTY in props:
        return OWN
    ann = {str(k): v for k, v in (message.annotations or {}).items()}
    out = Downlink(message_id=message.id, template=address_template, refuse=address_refuse,
                   to_may_be_address=to_may_be_address)
    if message.subject == "pubrel":
        to = text_of(message.address) if message.address else ""
        if to and to_may_be_address:
            to = _from_address(to, out)
        return Downlink(topic=to or topic_of_address(address, address_template) or "", qos=2, pubrel=True,
                        message_id=message.id)
    for rule in REVERSE[profile]:
        rule.read(message, address, ann, now, out)
    return out


def reverse_table_markdown(profile: str) -> str:
    """The README's table of one profile's reverse mapping."""
    lines = ["| MQTT | from AMQP | rule |", "|---|---|---|"]
    for r in REVERSE[profile]:
        lines.append(f"| {r.mqtt} | {r.doc_amqp} | {r.doc_rule} |")
    return "\n".join(lines)
