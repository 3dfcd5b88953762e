"""Whether the AMQP peer answers at all: a TCP connection to its host and
port (``lakegate run``'s start, ``/health``, ``lakegate demo``)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

__all__ = ["amqp_reachable"]


def amqp_reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the AMQP peer's host and port succeeds."""
    u = urlsplit(url)
    port = u.port or (5671 if u.scheme == "amqps" else 5672)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False
