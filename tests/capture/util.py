"""Helpers for capture log tests: deterministic records per index."""

from __future__ import annotations

import errno
import os
import threading

from bridge.capture import CaptureLog

#: small and fast policies for tests
FAST = {"fsync_interval_ms": 1, "retention_check_interval_s": 3600}


def frame(i: int) -> bytes:
    """A PUBLISH-like frame whose bytes depend on i (sizes vary)."""
    body = b"t/%d" % (i % 17) + b"|" + (b"%d;" % i) * (1 + i % 23)
    return bytes([0x30, len(body) % 128]) + body


def conn(i: int, connections: int = 7) -> str:
    return f"edge:{i % connections}"


def headers(i: int, connections: int = 7) -> list[tuple[str, bytes]]:
    h = [("conn_id", conn(i, connections).encode()), ("proto", b"5" if i % 2 else b"4"),
         ("remote", b"127.0.0.1:%d" % (40000 + i % connections)), ("origin", b"client")]
    if i % 5 == 0:
        h.append(("alias_topic", b"t/%d" % (i % 17)))
    if i % 11 == 0:
        h.append(("username", b""))  # empty values are values too
    return h


def key(i: int, connections: int = 7) -> bytes:
    return b"client-%d" % (i % connections)


def append_range(log: CaptureLog, start: int, stop: int, connections: int = 7):
    """Append records start..stop-1; returns their acks."""
    return [log.append(conn(i, connections), key(i, connections), frame(i), headers(i, connections))
            for i in range(start, stop)]


def open_log(path, **kw) -> CaptureLog:
    return CaptureLog.open(path, **{**FAST, **kw})


class FsyncGate:
    """Stands in for os.fdatasync: blocks until ``open`` is set (a disk that
    cannot keep up); ``entered`` is set once a sync is waiting."""

    def __init__(self):
        self.open = threading.Event()
        self.entered = threading.Event()
        self.real = os.fdatasync

    def __call__(self, fd):
        self.entered.set()
        if not self.open.wait(30):
            raise OSError(errno.EIO, "test gate never opened")
        self.real(fd)
