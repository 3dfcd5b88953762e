"""MQTT topic -> AMQP address, for forwarding (the link's target, a
``reply-to``) and back (the downlink reads the same template in reverse:
:func:`bridge.amqp.reverse.topic_of_address`).

``amqp.address_template`` has two placeholders: ``{topic}`` (the
MQTT topic, verbatim) and ``{routing_key}`` (the topic with every ``/``
replaced by ``.``, RabbitMQ's rule for MQTT topics on ``amq.topic``).
In a routing key only ``.`` is special (it separates words); ``*`` and ``#``
are wildcards in *binding* keys only, and MQTT topic names cannot contain
``+`` or ``#`` [MQTT-4.7.1-1]. A ``.`` inside an MQTT topic level therefore
becomes a word separator, exactly as RabbitMQ's own MQTT plugin does, so a
binding made for RabbitMQ's MQTT subscribers sees lakegate's messages under
the same words. The message's ``to`` is always the verbatim topic.

A topic holding text the peer reads in an address (``amqp.address_refuse``,
:mod:`bridge.peers`: a wildcard, a list of destinations, a queue name) has
no address: :class:`AddressCharsError` [LG-amqp-address-chars], and the
message is quarantined, never split or re-routed.

Names work the same way: an MQTT User Property becomes an application
property under its own name, and a peer may read some names as orders
(Artemis: ``_AMQ_DUPL_ID`` drops a later message with the same value as a
duplicate, ``_AMQ_SCHED_DELIVERY`` holds it back). A message with a User
Property whose name starts with one of ``amqp.property_refuse`` is
quarantined [LG-amqp-reserved-property] (:class:`ReservedPropertyError`):
accepted by the peer, it could be dropped or delayed with no trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ADDRESS_CHARS", "RESERVED_PROPERTY", "AddressCharsError", "ReservedPropertyError", "address_for",
           "check_properties", "refused_in", "reserved_property", "routing_key"]

#: Rule id of a topic holding text the peer reads in an address (a wildcard,
#: a list of destinations, a queue name): quarantined (forward) or
#: rejected (downlink), never split or re-routed (``bridge.peers``).
ADDRESS_CHARS = "LG-amqp-address-chars"
#: Rule id of a message with a User Property whose name the peer reads as an
#: order (``amqp.property_refuse``): quarantined, never sent.
RESERVED_PROPERTY = "LG-amqp-reserved-property"


def routing_key(topic: str) -> str:
    """RabbitMQ's routing key for an MQTT topic: every ``/`` becomes ``.``."""
    return topic.replace("/", ".")


class AddressCharsError(ValueError):
    """A topic holds text the peer gives a meaning in an address
    [LG-amqp-address-chars]: the message is quarantined, never split or
    re-routed (:mod:`bridge.amqp.unforwardable` reads ``rule``)."""

    rule = ADDRESS_CHARS


class ReservedPropertyError(ValueError):
    """A User Property's name is one the peer reads as an order
    [LG-amqp-reserved-property]: the message is quarantined."""

    rule = RESERVED_PROPERTY


def reserved_property(pairs: Iterable[Any] | None, prefixes: str) -> str | None:
    """The first User Property name in ``pairs`` (a row's ``user_properties``:
    ``[key, value]`` pairs or ``{"key", "value"}`` maps) that starts with
    one of ``prefixes`` (space-separated, ``amqp.property_refuse``), else None."""
    if not pairs or not prefixes:
        return None
    starts = tuple(prefixes.split())
    for p in pairs:
        name = p.get("key") if isinstance(p, Mapping) else p[0]
        if isinstance(name, str) and name.startswith(starts):
            return name
    return None


def check_properties(pairs: Iterable[Any] | None, prefixes: str, key: str) -> None:
    """Raise :class:`ReservedPropertyError` when a User Property of the row
    ``key`` (its capture coordinates) has a name of ``prefixes``."""
    name = reserved_property(pairs, prefixes)
    if name is not None:
        raise ReservedPropertyError(
            f"[{RESERVED_PROPERTY}] {key}: User Property {name[:100]!r} is a name the AMQP peer reads as an "
            f"order (amqp.property_refuse = {prefixes!r}, amqp.peer): not forwarded")


def refused_in(topic: str, refuse: str) -> str | None:
    """The first text of ``refuse`` (space-separated, ``amqp.address_refuse``)
    that ``topic`` holds, else None. (A ``.`` in a topic stays a word
    separator of the routing key, as in RabbitMQ's own MQTT plugin.)"""
    for text in refuse.split():
        if text in topic:
            return text
    return None


def address_for(topic: str, template: str, refuse: str = "") -> str:
    """The AMQP target address for ``topic`` through ``amqp.address_template``.

    ``{topic}`` is the topic verbatim, ``{routing_key}`` is :func:`routing_key`;
    other braces in the template are left alone. Raises
    :class:`AddressCharsError` when the topic holds text the peer would read
    (:func:`refused_in`). Kept for the last 4,096 (topic, template, refuse)
    triples: devices publish to the same topics again.
    """
    key = (topic, template, refuse)
    out = _ADDRESSES.get(key)
    if out is None:
        bad = refused_in(topic, refuse) if ("{topic}" in template or "{routing_key}" in template) \
            else None
        if bad is not None:
            raise AddressCharsError(
                f"[{ADDRESS_CHARS}] topic {topic[:200]!r} ({len(topic)} chars) holds {bad!r}, which the "
                f"AMQP peer reads in an address made by {template!r} (amqp.address_refuse, amqp.peer); "
                "not forwarded, never split or re-routed")
        out = _address_for(topic, template)
        if len(_ADDRESSES) >= 4096:
            _ADDRESSES.clear()
        _ADDRESSES[key] = out
    return out


_ADDRESSES: dict[tuple[str, str, str], str] = {}


def _address_for(topic: str, template: str) -> str:
    out = template
    if "{routing_key}" in out:
        out = out.replace("{routing_key}", routing_key(topic))
    if "{topic}" in out:
        out = out.replace("{topic}", topic)
    return out
