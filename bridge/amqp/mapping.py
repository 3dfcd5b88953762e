"""MQTT PUBLISH / PUBREL -> AMQP 1.0 message: the seed's mapping, as data.

Pure and Spark-free: one row shaped like :data:`schemas.forward.FORWARD_DDL`
(a dict), a profile and the current time give an :class:`Outgoing`: the
proton ``Message``, the link's target address and which of the two sender
links of that address carries it (``qos01`` or ``qos2``).

Every AMQP field is one :class:`Rule` in a profile's table (``PROFILES``):
the same tables build the messages and the README's mapping table
(:func:`mapping_table_markdown`; a test checks the README against it), and
:func:`bridge.amqp.wire.encode_row` encodes by them without proton.

Addresses (``amqp.address_template``, the characters a peer reads in
them): :mod:`bridge.amqp.addresses`.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from proton import Message, int32, symbol, timestamp, ubyte, ulong

# re-exported: the names every forwarding module and test took from here before
from bridge.amqp.addresses import ADDRESS_CHARS, AddressCharsError, address_for, check_properties, refused_in, \
    routing_key

__all__ = ["ADDRESS_CHARS", "AddressCharsError", "address_for", "refused_in", "routing_key", "ANN_CONTENT_TYPE",
           "ANN_PAYLOAD_FORMAT", "ANN_USER_PROPERTIES", "ID_PROPERTY", "LINK_QOS01", "LINK_QOS2", "MappingError",
           "Outgoing", "PROFILES", "Profile", "Rule", "TTL_MAX_MS", "REJECTED", "UNFORWARDABLE", "identity",
           "map_row", "mapping_table_markdown", "user_properties_map"]

#: Application property carrying the stable identity of a forwarded message:
#: ``<stream>/<partition>/<offset>`` of its capture record. Packet ids are
#: reused and a re-run batch sends again; this does not change.
ID_PROPERTY = "lakegate-id"
#: Message annotation with the complete, ordered MQTT User Property list
#: (a list of [key, value] lists), present only when a key repeats or
#: collides with ``lakegate-id``.
ANN_USER_PROPERTIES = "x-opt-mqtt-user-properties"
#: Message annotation for the MQTT 5 Payload Format Indicator (ubyte 0 or 1).
ANN_PAYLOAD_FORMAT = "x-opt-mqtt-payload-format-indicator"
#: Message annotation for a Content Type that is not ASCII (AMQP's
#: content-type is a symbol, which is ASCII only).
ANN_CONTENT_TYPE = "x-opt-mqtt-content-type"

#: The longest header ``ttl``: an AMQP uint of milliseconds (about 49.7 days).
#: An MQTT 5 Message Expiry Interval may be up to 2**32-1 *seconds*; a longer
#: remaining lifetime leaves ``ttl`` out and goes in ``absolute-expiry-time``.
TTL_MAX_MS = 2**32 - 1

#: Rule id of a row that no AMQP message can be made of (a mapping or encoding
#: failure, the same on every retry): the job quarantines it instead of
#: retrying the batch for ever.
UNFORWARDABLE = "LG-amqp-unforwardable"
#: Rule id of a message the peer refuses for its own sake (rejected with a
#: condition of :data:`bridge.amqp.retry.MESSAGE_FAULT_CONDITIONS` on every
#: attempt, or larger than the link's max-message-size): quarantined too.
REJECTED = "LG-amqp-rejected"

LINK_QOS01 = "qos01"
LINK_QOS2 = "qos2"

#: AMQP sections, in the order the README lists them.
HEADER = "header"
ANNOTATIONS = "message-annotations"
PROPERTIES = "properties"
APP_PROPERTIES = "application-properties"
BODY = "body"


class MappingError(ValueError):
    """A row cannot become an AMQP message (e.g. it has no topic)."""


class Ctx(NamedTuple):
    """What a rule may look at besides the row (a tuple: made per row, cheaply)."""

    now: float  # epoch seconds: the send time
    address_template: str
    expires_at: float | None  # epoch seconds, from the Message Expiry Interval
    refuse: str = ""  # amqp.address_refuse


@dataclass(frozen=True)
class Rule:
    """One AMQP field: where it goes, how it is computed, how it is documented.

    ``value(row, ctx)`` returns the field's value, or None to leave it out.
    """

    section: str
    name: str
    value: Callable[[Mapping[str, Any], Ctx], Any]
    doc_value: str
    doc_source: str


@dataclass(frozen=True)
class Profile:
    """A complete mapping: one rule table per packet kind, plus link modes."""

    name: str
    publish: tuple[Rule, ...]
    pubrel: tuple[Rule, ...]
    #: rcv-settle-mode of the QoS 2 link (0 first, 1 second); the QoS 0/1
    #: link is always first. Both links are snd-settle-mode unsettled.
    qos2_rcv_settle_mode: int
    note: str = ""


# --------------------------------------------------------------- rule bodies
def _qos(row: Mapping[str, Any]) -> int:
    return int(row.get("qos") or 0)


def _packet_id(row: Mapping[str, Any], ctx: Ctx) -> Any:
    pid = row.get("packet_id")
    return None if pid is None else ulong(int(pid))


def _topic(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return row.get("topic")


def _durable(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return _qos(row) > 0


def _delivery_count(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return 1 if row.get("dup") else 0


def _ttl_ms(row: Mapping[str, Any], ctx: Ctx) -> Any:
    if ctx.expires_at is None:
        return None
    return header_ttl(ctx.expires_at, ctx.now)


def _absolute_expiry(row: Mapping[str, Any], ctx: Ctx) -> Any:
    if ctx.expires_at is None or remaining_ms(ctx.expires_at, ctx.now) <= TTL_MAX_MS:
        return None
    return timestamp(math.floor(ctx.expires_at * 1000.0))


def _retain(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return bool(row.get("retain"))


def _qos_ann(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return int32(_qos(row))


def _payload_format(row: Mapping[str, Any], ctx: Ctx) -> Any:
    pfi = row.get("payload_format_indicator")
    return None if pfi is None else ubyte(int(pfi))


def _content_type(row: Mapping[str, Any], ctx: Ctx) -> Any:
    ct = row.get("content_type")
    return symbol(ct) if ct is not None and ct.isascii() else None


def _content_type_ann(row: Mapping[str, Any], ctx: Ctx) -> Any:
    ct = row.get("content_type")
    return ct if ct is not None and not ct.isascii() else None


def _correlation(row: Mapping[str, Any], ctx: Ctx) -> Any:
    cd = row.get("correlation_data")
    return None if cd is None else bytes(cd)


def _reply_to(row: Mapping[str, Any], ctx: Ctx) -> Any:
    rt = row.get("response_topic")
    return None if rt is None else address_for(rt, ctx.address_template, ctx.refuse)


def _user_props(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return user_properties_map(row.get("user_properties"))[0]


def _user_props_ann(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return user_properties_map(row.get("user_properties"))[1]


def _identity(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return identity(row)


def _payload(row: Mapping[str, Any], ctx: Ctx) -> Any:
    p = row.get("payload")
    return b"" if p is None else bytes(p)


def _const(value: Any) -> Callable[[Mapping[str, Any], Ctx], Any]:
    return lambda row, ctx: value


def _pubrel_true(row: Mapping[str, Any], ctx: Ctx) -> Any:
    return True


# --------------------------------------------------------------- the tables
def _publish_rules(subject: bool, retain_ann: str, qos_ann: str) -> tuple[Rule, ...]:
    rules = []
    if subject:
        rules.append(Rule(PROPERTIES, "subject", _const("publish"), '"publish"', "-"))
    rules += [
        Rule(PROPERTIES, "message-id", _packet_id, "packet identifier (ulong); absent for QoS 0", "PUBLISH"),
        Rule(PROPERTIES, "to", _topic, "topic name, verbatim", "PUBLISH"),
        Rule(ANNOTATIONS, retain_ann, _retain, "RETAIN flag (boolean)", "PUBLISH"),
        Rule(ANNOTATIONS, qos_ann, _qos_ann, "QoS level 0, 1 or 2 (int)", "PUBLISH"),
        Rule(HEADER, "durable", _durable, "false for QoS 0, true for QoS 1 and 2", "PUBLISH"),
        Rule(HEADER, "delivery-count", _delivery_count, "DUP flag: 1 when set, else 0", "PUBLISH"),
        Rule(BODY, "data", _payload, "payload, one Data section (empty payload: empty Data)", "PUBLISH"),
        Rule(PROPERTIES, "content-type", _content_type, "Content Type, when it is ASCII", "MQTT 5 Content Type"),
        Rule(ANNOTATIONS, ANN_CONTENT_TYPE, _content_type_ann, "Content Type, when it is not ASCII (string)", "MQTT 5 Content Type"),
        Rule(PROPERTIES, "correlation-id", _correlation, "Correlation Data (binary)", "MQTT 5 Correlation Data"),
        Rule(PROPERTIES, "reply-to", _reply_to, "address of the Response Topic (through `amqp.address_template`)", "MQTT 5 Response Topic"),
        Rule(HEADER, "ttl", _ttl_ms, "remaining lifetime at send time, in ms; an expired message is not sent (counted); "
             "left out when more than 2^32-1 ms (49.7 days) remain", "MQTT 5 Message Expiry Interval"),
        Rule(PROPERTIES, "absolute-expiry-time", _absolute_expiry, "expiry instant (timestamp, ms), only when the "
             "remaining lifetime exceeds what `ttl` holds", "MQTT 5 Message Expiry Interval"),
        Rule(APP_PROPERTIES, "<key>", _user_props, "first value of each User Property key, in order", "MQTT 5 User Property"),
        Rule(ANNOTATIONS, ANN_USER_PROPERTIES, _user_props_ann, "all User Properties, ordered [[key, value], ...], when a key repeats", "MQTT 5 User Property"),
        Rule(ANNOTATIONS, ANN_PAYLOAD_FORMAT, _payload_format, "Payload Format Indicator (ubyte 0 or 1)", "MQTT 5 Payload Format Indicator"),
        Rule(APP_PROPERTIES, ID_PROPERTY, _identity, '`<stream>/<partition>/<offset>` of the capture record', "capture log"),
    ]
    return tuple(rules)


def _pubrel_rules() -> tuple[Rule, ...]:
    return (
        Rule(PROPERTIES, "subject", _const("pubrel"), '"pubrel"', "-"),
        Rule(PROPERTIES, "message-id", _packet_id, "packet identifier (ulong)", "PUBREL"),
        Rule(PROPERTIES, "to", _topic, "topic of the QoS 2 PUBLISH it releases (lakegate addition)", "capture header rel_topic"),
        Rule(HEADER, "durable", _pubrel_true, "true (lakegate addition)", "-"),
        Rule(APP_PROPERTIES, ID_PROPERTY, _identity, '`<stream>/<partition>/<offset>` of the capture record', "capture log"),
    )


PROFILES: dict[str, Profile] = {
    "seed": Profile(
        name="seed",
        publish=_publish_rules(subject=True, retain_ann="x-retain", qos_ann="x-qos"),
        pubrel=_pubrel_rules(),
        qos2_rcv_settle_mode=0,
        note="The front-end design's AMQP_PUBLISH and AMQP_PUBREL tables; both links rcv-settle-mode first.",
    ),
    "enmasse": Profile(
        name="enmasse",
        publish=_publish_rules(subject=False, retain_ann="x-opt-retain-message", qos_ann="x-opt-mqtt-qos"),
        pubrel=_pubrel_rules(),
        qos2_rcv_settle_mode=1,
        note=("The design's later revision (EnMasse's MQTT gateway): no subject on AMQP_PUBLISH, "
              "x-opt- annotations, the QoS 2 link rcv-settle-mode second. AMQP_PUBREL keeps "
              'subject "pubrel" (as EnMasse\'s AmqpPubrelMessage does): it is what tells it apart.'),
    ),
}


# --------------------------------------------------------------- helpers
def identity(row: Mapping[str, Any]) -> str:
    """``<stream>/<partition>/<offset>``: the capture coordinates of a row."""
    return f"{row.get('stream')}/{row.get('partition')}/{row.get('offset')}"


def user_properties_map(pairs: Sequence[Any] | None) -> tuple[dict[str, str] | None, list[list[str]] | None]:
    """(application-properties, full ordered list or None) for MQTT User Properties.

    AMQP application-properties is a map with unique keys; MQTT allows a key
    to repeat and says the order matters [MQTT-3.3.2-18]. As RabbitMQ (3.13+)
    does, each key keeps its *first* value, keys in first-occurrence order.
    When some key repeats (or is ``lakegate-id``, which is lakegate's own),
    the complete ordered list also goes, losslessly, into the message
    annotation ``x-opt-mqtt-user-properties`` (as ActiveMQ Artemis keeps an
    ordered list), so nothing is lost.
    """
    if not pairs:
        return None, None
    first: dict[str, str] = {}
    full: list[list[str]] = []
    lossy = False
    for p in pairs:
        if isinstance(p, Mapping):
            k, v = p.get("key"), p.get("value")
        else:
            k, v = p[0], p[1]
        full.append([k, v])
        if k == ID_PROPERTY or k in first:
            lossy = True
            continue
        first[k] = v
    return (first or None), (full if lossy else None)


def remaining_ms(expires_at: float, now: float) -> int:
    """Whole milliseconds left until ``expires_at`` (may be <= 0)."""
    return math.floor((expires_at - now) * 1000.0)


def header_ttl(expires_at: float, now: float) -> int | None:
    """The header ``ttl`` at ``now``: the remaining milliseconds, or None when
    they exceed :data:`TTL_MAX_MS` (then ``absolute-expiry-time`` carries the
    expiry; it was set at mapping time, when even more remained)."""
    ms = remaining_ms(expires_at, now)
    return None if ms > TTL_MAX_MS else ms


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    return float(value)


def expires_at(row: Mapping[str, Any], now: float) -> float | None:
    """Epoch seconds when the PUBLISH expires (None: no Message Expiry Interval).

    The lifetime runs from the capture's receive time (``now`` when the row
    has none), as MQTT 5 counts it from when the server received it.
    """
    mei = row.get("message_expiry_interval")
    if mei is None:
        return None
    start = _epoch(row.get("receive_time"))
    return (now if start is None else start) + float(mei)


def set_ttl(msg: Message, ms: int) -> None:
    """Header ttl in whole milliseconds (proton's setter takes float seconds)."""
    msg.ttl = (ms + 0.5) / 1000.0


def set_expiry_time(msg: Message, ms: int) -> None:
    """Properties absolute-expiry-time in epoch milliseconds (proton's setter takes float seconds)."""
    msg.expiry_time = (ms + 0.5) / 1000.0


# --------------------------------------------------------------- the mapping
@dataclass(slots=True)
class Outgoing:
    """One row, mapped: a proton ``message`` (:func:`map_row`) or its sections
    after the header already encoded, ``tail`` (:func:`bridge.amqp.wire.encode_row`). Both are
    None when the row had expired."""

    message: Message | None
    address: str
    link: str  # LINK_QOS01 or LINK_QOS2
    qos: int  # 0, 1 or 2 (a PUBREL is 2)
    kind: str  # "publish" or "pubrel"
    key: str  # the lakegate-id
    partition: int | None
    offset: int | None
    expires_at: float | None = None
    durable: bool = False
    delivery_count: int = 0
    tail: bytes | None = None

    @property
    def expired(self) -> bool:
        return self.message is None and self.tail is None


#: How a value lands in a header field or a property: (section, name) -> setter.
_SETTERS: dict[tuple[str, str], Callable[[Message, Any], None]] = {
    (HEADER, "durable"): lambda m, v: setattr(m, "durable", bool(v)),
    (HEADER, "delivery-count"): lambda m, v: setattr(m, "delivery_count", int(v)),
    (HEADER, "ttl"): lambda m, v: set_ttl(m, int(v)),
    (PROPERTIES, "subject"): lambda m, v: setattr(m, "subject", v),
    (PROPERTIES, "message-id"): lambda m, v: setattr(m, "id", v),
    (PROPERTIES, "to"): lambda m, v: setattr(m, "address", v),
    (PROPERTIES, "content-type"): lambda m, v: setattr(m, "content_type", v),
    (PROPERTIES, "correlation-id"): lambda m, v: setattr(m, "correlation_id", v),
    (PROPERTIES, "reply-to"): lambda m, v: setattr(m, "reply_to", v),
    (PROPERTIES, "absolute-expiry-time"): lambda m, v: set_expiry_time(m, int(v)),
}


def _apply(msg: Message, rule: Rule, value: Any, ann: dict, props: dict) -> None:
    s, n = rule.section, rule.name
    setter = _SETTERS.get((s, n))
    if setter is not None:
        setter(msg, value)
    elif s == ANNOTATIONS:
        ann[symbol(n)] = value
    elif s == APP_PROPERTIES:
        if n == "<key>":
            props.update(value)
        else:
            props[n] = value
    elif s == BODY:
        msg.body = value
        msg.inferred = True  # bytes -> one Data section, not amqp-value
    else:  # pragma: no cover - a table error
        raise MappingError(f"no way to set {s} field {n!r}")


def _start(row: Mapping[str, Any], prof: Profile, address_template: str, now: float,
           refuse: str = "", reserved: str = "") -> tuple[Outgoing, tuple[Rule, ...]]:
    kind = row.get("kind") or "publish"
    if kind == "publish":
        rules, qos = prof.publish, _qos(row)
    elif kind == "pubrel":
        rules, qos = prof.pubrel, 2
    else:
        raise MappingError(f"{identity(row)}: unknown kind {kind!r}")
    topic = row.get("topic")
    if not topic:
        raise MappingError(f"{identity(row)}: {kind} has no topic")
    exp = expires_at(row, now) if kind == "publish" else None
    if reserved and kind == "publish":
        check_properties(row.get("user_properties"), reserved, identity(row))
    part, off = row.get("partition"), row.get("offset")
    out = Outgoing(
        message=None,
        address=address_for(topic, address_template, refuse),
        link=LINK_QOS2 if qos == 2 else LINK_QOS01,
        qos=qos,
        kind=kind,
        key=identity(row),
        partition=None if part is None else int(part),
        offset=None if off is None else int(off),
        expires_at=exp,
    )
    return out, rules


def map_row(row: Mapping[str, Any], profile: Profile | str, address_template: str, now: float,
            refuse: str = "", reserved: str = "") -> Outgoing:
    """Map one FORWARD_DDL row (a dict) to an :class:`Outgoing` with a proton Message.

    ``now`` is the send time (epoch seconds) for the remaining lifetime;
    ``refuse``: ``amqp.address_refuse``; ``reserved``: ``amqp.property_refuse``. An expired PUBLISH gives
    ``message=None``. Raises :class:`MappingError` when the row has no topic
    or an unknown ``kind``, :class:`~bridge.amqp.addresses.AddressCharsError` when its topic (or
    Response Topic) cannot be an address on the peer.
    """
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    out, rules = _start(row, prof, address_template, now, refuse, reserved)
    exp = out.expires_at
    if exp is not None and remaining_ms(exp, now) <= 0:
        return out
    ctx = Ctx(now=now, address_template=address_template, expires_at=exp, refuse=refuse)
    msg = Message()
    ann: dict = {}
    props: dict = {}
    for rule in rules:
        value = rule.value(row, ctx)
        if value is not None:
            _apply(msg, rule, value, ann, props)
    if ann:
        msg.annotations = ann
    if props:
        msg.properties = props
    out.message = msg
    return out


# --------------------------------------------------------------- documentation
_SECTION_ORDER = (HEADER, ANNOTATIONS, PROPERTIES, APP_PROPERTIES, BODY)


def mapping_table_markdown(profile: Profile | str) -> str:
    """The README's mapping table for one profile, generated from its rules."""
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    lines = [
        "| message | AMQP field | section | value | from |",
        "|---|---|---|---|---|",
    ]
    for kind, rules in (("AMQP_PUBLISH", prof.publish), ("AMQP_PUBREL", prof.pubrel)):
        for rule in sorted(rules, key=lambda r: _SECTION_ORDER.index(r.section)):
            lines.append(f"| {kind} | `{rule.name}` | {rule.section} | {rule.doc_value} | {rule.doc_source} |")
    return "\n".join(lines)
