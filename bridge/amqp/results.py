"""What one :meth:`~bridge.amqp.sender.Forwarder.forward` call ends with:
:class:`ForwardResult` (its counts and unforwardable rows: ``LG-amqp-unforwardable``,
``LG-amqp-rejected``) or
:class:`ForwardError` (the address and outcome that failed the batch).

Both are importable from :mod:`bridge.amqp.sender`, which is also
``ForwardError``'s ``__module__``: tracebacks, Spark's error text and
``lakegate status`` name it ``bridge.amqp.sender.ForwardError`` as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bridge.amqp.unforwardable import Unforwardable

__all__ = ["ForwardError", "ForwardResult"]


class ForwardError(RuntimeError):
    """A batch could not be forwarded: names the address and the outcome."""

    def __init__(self, message: str, *, address: str | None = None, outcome: str | None = None,
                 attempts: int = 0, key: str | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.outcome = outcome
        self.attempts = attempts
        self.key = key


ForwardError.__module__ = "bridge.amqp.sender"


@dataclass
class ForwardResult:
    """Counts for one :meth:`~bridge.amqp.sender.Forwarder.forward` call."""

    rows: int = 0  # rows given
    accepted: int = 0  # QoS 1/2 messages (and PUBRELs) the peer accepted
    qos0: int = 0  # QoS 0 messages handed to their link (not awaited)
    expired: int = 0  # not sent: the Message Expiry Interval had passed
    unroutable: int = 0  # not sent: no topic (logged with its lakegate-id; also unforwardable)
    unforwardable: int = 0  # set aside (``failures``): not mappable or encodable, or refused for its own sake
    transfers: int = 0  # deliveries sent, resends included
    retried: int = 0  # resends after a failed attempt
    reconnects: int = 0  # connections (re)established during the batch
    seconds: float = 0.0
    #: the unforwardable rows (not a count: left out of :meth:`as_dict`)
    failures: list[Unforwardable] = field(default_factory=list)

    def add(self, other: "ForwardResult") -> None:
        for k, v in self.as_dict().items():
            setattr(self, k, v + getattr(other, k))
        self.failures.extend(other.failures)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "failures"}
