"""Acknowledgements in order, behind durability and forwarding.

The capture log completes one future per group commit (fsync). A
connection whose next queued acknowledgement waits on such a future asks
:meth:`DurableAcks.watch` to drain it once the future completes: one
callback per group future (one thread hop per group commit, not per
packet), which wakes every connection waiting on it from the event loop.
With ``edge.ack_after = "forward"``, :class:`ForwardWaiter` holds
acknowledgements further, until the AMQP sink's forwarded mark passes the
record. :class:`DurableAcks` is a part of
:class:`~bridge.edge.server.EdgeServer` and works on its attributes.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.edge.connection import Connection

__all__ = ["DurableAcks", "ForwardWaiter"]


class ForwardWaiter:
    """Holds acknowledgements until the AMQP sink forwarded their records
    (``edge.ack_after = "forward"``). Polls the forwarded marks of
    :class:`bridge.amqp.forwarded.ForwardedOffsets` only while something
    waits: every millisecond, backing off to 50 ms while nothing moves."""

    def __init__(self, data_dir, stream: str, partitions: int) -> None:
        from bridge.amqp.forwarded import ForwardedOffsets

        self.marks = ForwardedOffsets(data_dir, stream)
        self.seen = [-1] * partitions
        self._waiting: dict[int, list] = {}
        self._task: asyncio.Task | None = None

    def reached(self, partition: int, offset: int) -> bool:
        return self.seen[partition] >= offset

    def wait(self, partition: int, offset: int, conn) -> None:
        self._waiting.setdefault(partition, []).append((offset, conn))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        pause = 0.001
        while self._waiting:
            moved = False
            for p in list(self._waiting):
                mark = self.marks.get(p)
                if mark > self.seen[p]:
                    self.seen[p] = mark
                    moved = True
                    waiters = self._waiting.pop(p)
                    keep = [(o, c) for o, c in waiters if o > mark]
                    if keep:
                        self._waiting[p] = keep
                    for o, c in waiters:
                        if o <= mark:
                            c.fwd_waiting = False
                            c.drain()
            pause = 0.001 if moved else min(pause * 2, 0.05)
            await asyncio.sleep(pause)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()



class DurableAcks:
    """Drain connections when the group commit they wait on completes."""

    def watch(self, fut: Future, conn: Connection) -> None:
        """Drain ``conn`` once the group commit ``fut`` completes."""
        waiting = self._watch.get(fut)
        if waiting is None:
            self._watch[fut] = [conn]
            fut.add_done_callback(self._durable_threadsafe)
        else:
            waiting.append(conn)

    def _durable_threadsafe(self, fut: Future) -> None:
        # Runs on the capture log's flusher thread: one hop per group commit.
        try:
            self.loop.call_soon_threadsafe(self._durable, fut)
        except RuntimeError:  # the loop is closed (process ending)
            pass

    def _durable(self, fut: Future) -> None:
        for conn in self._watch.pop(fut, ()):
            if conn.watching is fut:
                conn.watching = None
            conn.drain()
        if self._fanout_wait:
            self._released(fut)  # messages for subscribers (bridge.edge.fanout)

