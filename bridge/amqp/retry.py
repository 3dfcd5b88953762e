"""Failure classification and the retry backoff of the forwarding engine.

What no retry can cure (:data:`PERMANENT_CONDITIONS`: fail the batch at
once), how long the n-th failed attempt waits (:func:`backoff`:
``amqp.retry_backoff_s * 2**(n-1)``, at most :data:`MAX_BACKOFF_S`), and how
a peer's error condition and a delivery's outcome read in logs and errors.
The engine's connection, link and delivery handling apply them.
"""

from __future__ import annotations

from typing import Any

from proton import Delivery

from bridge.config import AmqpConfig

__all__ = ["MAX_BACKOFF_S", "PERMANENT_CONDITIONS", "backoff", "condition_text", "delivery_outcome"]

#: Conditions that no retry can cure: fail at once.
PERMANENT_CONDITIONS = frozenset({
    "amqp:unauthorized-access",
    "amqp:not-implemented",
    "amqp:not-allowed",
    "amqp:invalid-field",
    "amqp:precondition-failed",
})
MAX_BACKOFF_S = 30.0


def backoff(config: AmqpConfig, n: int) -> float:
    return min(config.retry_backoff_s * (2 ** max(n - 1, 0)), MAX_BACKOFF_S)


def condition_text(c: Any) -> str:
    if c is None:
        return "no condition given"
    return f"{c.name}: {c.description}" if c.description else str(c.name)


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
