"""The forward-acknowledgement channel: what the AMQP sink has forwarded.

With ``edge.ack_after = "forward"`` the edge holds PUBACK / PUBREC (and
PUBCOMP) until the AMQP peer has accepted the message (the PUBREL). The sink
tells it through the data directory: after a task's messages are all
accepted (QoS 0: handed to the link; expired: counted), it records, per
capture partition, the highest capture offset forwarded, in
``<data_dir>/forwarded/<stream>-<partition>`` (decimal text, written to a
temporary file and renamed over the old one, so a reader sees the old or the
new value, never a torn one).

The value only grows, and it is a *contiguous* mark: every record of that
partition at or below it that was meant for forwarding has been forwarded.
That holds because one task forwards all of a partition's rows of a
micro-batch, micro-batches run in order, and a batch's mark is written only
when the whole task succeeded (a re-run batch sends again and writes the
same or a higher mark).

The edge uses :meth:`ForwardedOffsets.get`, :meth:`~ForwardedOffsets.wait_for`
(blocking) or :meth:`~ForwardedOffsets.wait_for_async` (asyncio).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from pathlib import Path

__all__ = ["ForwardedOffsets", "NOTHING"]

#: ``get`` for a partition nothing has been forwarded from yet.
NOTHING = -1
_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.05


class ForwardedOffsets:
    """Reader and writer of the forwarded-offset marks of one capture stream."""

    def __init__(self, data_dir: str | os.PathLike[str], stream: str = "mqtt-frames") -> None:
        self.dir = Path(data_dir) / "forwarded"
        self.stream = stream

    def path(self, partition: int) -> Path:
        return self.dir / f"{self.stream}-{int(partition)}"

    def get(self, partition: int) -> int:
        """The highest forwarded offset of ``partition``, or ``NOTHING`` (-1)."""
        try:
            text = self.path(partition).read_text()
        except FileNotFoundError:
            return NOTHING
        text = text.strip()
        return int(text) if text else NOTHING

    def record(self, partition: int, offset: int, *, sync: bool = True) -> int:
        """Raise the mark of ``partition`` to ``offset`` (never lowers it).

        Atomic (temporary file + rename) and serialised between processes
        with a lock file. Returns the mark now in force. Runs on executors.
        ``sync=False`` skips the fsync (the live forwarder, which records a
        mark every few milliseconds, syncs once a second: after a power
        loss a mark may be older than what was forwarded, so some messages
        are sent again; none is skipped).
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.path(partition)
        with open(self.dir / f".{target.name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.get(partition)
            if offset <= current:
                return current
            tmp = self.dir / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as fh:
                fh.write(f"{int(offset)}\n")
                fh.flush()
                if sync:
                    os.fsync(fh.fileno())
            os.replace(tmp, target)
            return int(offset)

    def behind(self, ends) -> int:
        """Records not forwarded yet: per partition, ``ends`` (partition ->
        durable end offset, keys int or str) minus the mark + 1, summed."""
        items = ends.items() if hasattr(ends, "items") else enumerate(ends)
        return sum(max(0, int(n) - (self.get(int(p)) + 1)) for p, n in items)

    def sync(self, partition: int) -> None:
        """fsync the mark of ``partition`` (written with ``sync=False``)."""
        try:
            fd = os.open(self.path(partition), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def wait_for(self, partition: int, offset: int, timeout: float) -> bool:
        """Block until ``offset`` of ``partition`` is forwarded; False on timeout.

        Polls the mark (1 ms, growing to 50 ms between looks).
        """
        deadline = time.monotonic() + timeout
        pause = _POLL_MIN_S
        wake = threading.Event()
        while True:
            if self.get(partition) >= offset:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wake.wait(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)

    async def wait_for_async(self, partition: int, offset: int, timeout: float) -> bool:
        """:meth:`wait_for` for an asyncio event loop (the edge)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = _POLL_MIN_S
        while True:
            if self.get(partition) >= offset:
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)
