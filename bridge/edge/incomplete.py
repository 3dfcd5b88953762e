"""The edge server's bookkeeping of incomplete frames.

The server counts the bytes each session holds of a frame not yet complete,
and since when. One that stays incomplete for ``edge.frame_timeout_s``
closes its connection [LG-edge-frame-timeout] (not while its password is
checked, nor while the edge itself stopped reading it for capture-log
back-pressure); over ``edge.max_buffered_bytes`` across all connections, the
connection whose incomplete frame is the oldest is closed
[LG-edge-buffer-budget]. :class:`IncompleteFrames` is a part of
:class:`~bridge.edge.server.EdgeServer` and works on its attributes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bridge.edge import rules as edge_rules
from bridge.edge.session import CONNECTING

if TYPE_CHECKING:
    from bridge.edge.connection import Connection

__all__ = ["IncompleteFrames"]

log = logging.getLogger("bridge.edge")


class IncompleteFrames:
    """Incomplete-frame limits of the :class:`~bridge.edge.server.EdgeServer`."""

    def account(self, conn: Connection) -> None:
        """Count the bytes ``conn``'s session holds of an incomplete frame and
        when that frame started; over ``edge.max_buffered_bytes`` in total,
        close the connections whose incomplete frames are the oldest."""
        session = conn.session
        transport = conn.transport
        n = session.buffered if transport is not None and not transport.is_closing() else 0
        if n != conn.buffered:
            self.buffered_total += n - conn.buffered
            conn.buffered = n
        if n:
            if conn not in self._partial or session.frames_in != conn.frames_at:
                # a new frame started in this chunk (none was pending, or one completed)
                conn.partial_since = self.loop.time()
                conn.frames_at = session.frames_in
                self._partial.add(conn)
            if self.buffered_total > self.edge.max_buffered_bytes:
                self._over_budget()
        elif conn in self._partial:
            self._partial.discard(conn)

    def _unaccount(self, conn: Connection) -> None:
        self.buffered_total -= conn.buffered
        conn.buffered = 0
        self._partial.discard(conn)

    def _over_budget(self) -> None:
        budget = self.edge.max_buffered_bytes
        while self.buffered_total > budget and self._partial:
            worst = min(self._partial, key=lambda c: (c.partial_since, -c.buffered))
            self._limit_close(worst, edge_rules.BUFFER_BUDGET,
                              f"incomplete frames of all connections hold {self.buffered_total} "
                              f"bytes, over edge.max_buffered_bytes = {budget}; this "
                              f"connection's is the oldest ({worst.buffered} bytes, "
                              f"{self.loop.time() - worst.partial_since:.1f} s)")

    def _limit_close(self, conn: Connection, rule: str, detail: str) -> None:
        """Close ``conn`` for a resource limit (its reason goes to the log's
        close line); its buffered bytes are released now."""
        why = f"[{rule}] {detail}"
        log.warning("%s client=%s remote=%s: closing: %s", conn.conn_id,
                    conn.session.client_id or "-", conn.remote, why)
        if conn.session.close_reason is None:
            conn.session.close_reason = why
        self._unaccount(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def _frame_timeouts(self) -> None:
        """Close connections whose incomplete frame is older than
        ``edge.frame_timeout_s`` (not those waiting for their password check,
        nor those the edge stopped reading for capture-log back-pressure)."""
        limit = self.edge.frame_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            cutoff = self.loop.time() - limit
            for conn in [c for c in self._partial if c.partial_since <= cutoff]:
                if conn.session.state == CONNECTING or "log" in conn.paused_by:
                    continue
                self._limit_close(conn, edge_rules.FRAME_TIMEOUT,
                                  f"a frame started {self.loop.time() - conn.partial_since:.1f} s "
                                  f"ago is still incomplete ({conn.buffered} bytes buffered, "
                                  f"edge.frame_timeout_s = {limit:g})")

