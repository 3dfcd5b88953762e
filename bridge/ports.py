"""A loopback TCP port nobody listens on, for a child process to take
(the class archive's training run, the benchmarks' servers)."""

from __future__ import annotations

import socket

__all__ = ["free_loopback_port"]


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (free when asked; a
    caller that races another process for it retries as it would for any
    bind error)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
