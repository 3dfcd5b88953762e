"""Rows no AMQP message can be made of (``LG-amqp-unforwardable``).

Deterministic vs transient. Mapping and encoding a row
(:func:`bridge.amqp.wire.encode_row`, :func:`~bridge.amqp.wire.wire_bytes`)
are pure functions of the row and the clock: whatever they raise
(struct.error, OverflowError, ValueError, proton's assertion on a negative
ulong, ...) they raise again on every retry. Such a row is *unforwardable*:
the :class:`~bridge.amqp.sender.Forwarder` sets it aside (one log line: ids
and sizes, never the payload), the sink returns it to the driver and the
batch step quarantines it; the batch goes on. Only MemoryError is not the
row's fault. Everything about the peer (refusals, time-outs, lost
connections) stays transient and is retried by the Forwarder.

One peer answer is the message's fault too (``LG-amqp-rejected``,
:func:`rejected`): a *rejected* outcome whose condition blames the message
(:data:`bridge.amqp.retry.MESSAGE_FAULT_CONDITIONS`: ``amqp:decode-error``,
``amqp:link:message-size-exceeded``) on every one of its attempts, and a
message larger than the link's max-message-size, which is not sent at all.
They take the same way: an :class:`Unforwardable` with that rule, returned by
the sink, quarantined by the batch step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from bridge.amqp.mapping import REJECTED, UNFORWARDABLE, Outgoing

__all__ = ["ENCODING_FAILURES", "ERROR_CHARS", "NOT_THE_ROWS_FAULT", "Unforwardable", "rejected", "unforwardable"]

log = logging.getLogger("bridge.amqp")

#: What mapping or encoding one row may raise and still be the row's fault.
ENCODING_FAILURES = (Exception,)
#: ... except these, which are the process's.
NOT_THE_ROWS_FAULT = (MemoryError,)
#: Longest error text kept for an unforwardable row.
ERROR_CHARS = 300


@dataclass(frozen=True)
class Unforwardable:
    """A row no AMQP message can be made of: where it was captured and why."""

    stream: str | None
    partition: int | None
    offset: int | None
    rule: str
    error: str


def rejected(out: Outgoing, why: str, size: int) -> Unforwardable:
    """Record (and log, one line: ids and sizes) a message the peer refuses
    for its own sake (``LG-amqp-rejected``); ``why``: the peer's outcome and
    condition, or the size check's reason; ``size``: the encoded message's bytes."""
    stream = out.key.rsplit("/", 2)[0] if out.key.count("/") >= 2 else None
    error = f"[{REJECTED}] {why}"[:ERROR_CHARS]
    log.warning("AMQP %s %s to %r (%d bytes encoded) refused by the peer for its own sake, quarantined: %s",
                out.kind, out.key, out.address, size, error)
    return Unforwardable(stream=stream, partition=None if out.partition is None else int(out.partition),
                         offset=None if out.offset is None else int(out.offset), rule=REJECTED, error=error)


def unforwardable(row_or_out: Any, exc: BaseException) -> Unforwardable:
    """Record (and log, one line: ids and sizes) a row that cannot be
    forwarded: a FORWARD_DDL row (dict), or its :class:`Outgoing` when the
    failure came at send time."""
    if isinstance(row_or_out, Outgoing):
        key, part, off = row_or_out.key, row_or_out.partition, row_or_out.offset
        stream = key.rsplit("/", 2)[0] if key.count("/") >= 2 else None
        size = "?"  # the payload is inside the encoded tail by then
    else:
        row = row_or_out
        key = f"{row.get('stream')}/{row.get('partition')}/{row.get('offset')}"
        stream, part, off = row.get("stream"), row.get("partition"), row.get("offset")
        p = row.get("payload")
        size = 0 if p is None else len(p)
    rule = getattr(exc, "rule", None) or UNFORWARDABLE  # a more precise rule (AddressCharsError's)
    error = (str(exc) if rule != UNFORWARDABLE else f"[{UNFORWARDABLE}] {type(exc).__name__}: {exc}")[:ERROR_CHARS]
    log.warning("AMQP row %s (payload %s bytes) not forwardable, quarantined: %s", key, size, error)
    return Unforwardable(stream=stream, partition=None if part is None else int(part),
                         offset=None if off is None else int(off), rule=rule, error=error)
