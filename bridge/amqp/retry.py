"""Failure classification and the retry backoff of the forwarding engine.

What no retry can cure (:data:`PERMANENT_CONDITIONS`: fail the batch at
once), which rejections are the message's own fault
(:data:`MESSAGE_FAULT_CONDITIONS`: quarantined as ``LG-amqp-rejected`` once
its retries are spent, the batch goes on; :func:`message_fault`), how long
the n-th failed attempt waits (:func:`backoff`:
``amqp.retry_backoff_s * 2**(n-1)``, at most :data:`MAX_BACKOFF_S`), and how
a peer's error condition and a delivery's outcome read in logs and errors.
The engine's connection, link and delivery handling apply them.
"""

from __future__ import annotations

from typing import Any

from proton import Delivery

from bridge.config import AmqpConfig

__all__ = ["MAX_BACKOFF_S", "MESSAGE_FAULT_CONDITIONS", "PERMANENT_CONDITIONS", "RECONNECT_MAX_S", "backoff",
           "condition_text", "delivery_outcome", "message_fault", "reconnect_backoff"]

#: Conditions that no retry can cure: fail at once.
PERMANENT_CONDITIONS = frozenset({
    "amqp:unauthorized-access",
    "amqp:not-implemented",
    "amqp:not-allowed",
    "amqp:invalid-field",
    "amqp:precondition-failed",
})
MAX_BACKOFF_S = 30.0

#: Conditions of a *rejected* outcome that blame the message itself (AMQP 1.0
#: sections 2.8.15 and 2.8.18): the peer could not decode it, or it is larger
#: than the link takes. Sending the same bytes again gets the same answer, so
#: once its retries are spent the message is quarantined (``LG-amqp-rejected``)
#: instead of failing the batch for good. Every other rejection -- no condition
#: (RabbitMQ 3.x's publisher nack: a queue's trouble), unauthorized-access,
#: not-allowed, resource-limit-exceeded, internal-error, invalid-field,
#: not-implemented, precondition-failed, ... -- is the peer's or the
#: configuration's, the same for every message: retried, then it fails the batch.
MESSAGE_FAULT_CONDITIONS = frozenset({
    "amqp:decode-error",
    "amqp:link:message-size-exceeded",
})


def backoff(config: AmqpConfig, n: int) -> float:
    return min(config.retry_backoff_s * (2 ** max(n - 1, 0)), MAX_BACKOFF_S)


#: the longest wait between two connection attempts of the AMQP downlink's
#: receiver: what is sent to a topic address while it is away reaches no
#: one, so it must be back soon after the peer (with :data:`MAX_BACKOFF_S`
#: it came back 17-18 s after a 30 s outage, forwarding within 6 s); an
#: attempt to a peer that is down costs one refused connection
RECONNECT_MAX_S = 2.0


def reconnect_backoff(config: AmqpConfig, n: int) -> float:
    """The wait before the downlink receiver's connection attempt after
    ``n`` failures in a row: :func:`backoff`, at most :data:`RECONNECT_MAX_S`
    (unless ``amqp.retry_backoff_s`` itself is longer)."""
    return min(backoff(config, n), max(RECONNECT_MAX_S, config.retry_backoff_s))


def condition_text(c: Any) -> str:
    if c is None:
        return "no condition given"
    return f"{c.name}: {c.description}" if c.description else str(c.name)


def message_fault(dlv: Any) -> str | None:
    """The condition name when ``dlv`` was rejected for the message's own sake
    (:data:`MESSAGE_FAULT_CONDITIONS`), else None."""
    if dlv.remote_state != Delivery.REJECTED:
        return None
    c = dlv.remote.condition
    name = None if c is None or c.name is None else str(c.name)
    return name if name in MESSAGE_FAULT_CONDITIONS else None


def delivery_outcome(dlv: Any) -> str:
    state = dlv.remote_state
    if state == Delivery.REJECTED:
        c = dlv.remote.condition
        return f"rejected ({condition_text(c)})" if c is not None else "rejected"
    if state == Delivery.RELEASED:
        return "released"
    if state == Delivery.MODIFIED:
        r = dlv.remote
        return f"modified (delivery-failed={str(bool(r.failed)).lower()}, undeliverable-here={str(bool(r.undeliverable)).lower()})"
    if state == Delivery.ACCEPTED:
        return "accepted"
    return "settled without an outcome"
