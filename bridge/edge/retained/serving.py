"""The edge server's side of retained messages on SUBSCRIBE: build the
:class:`~bridge.edge.retained.store.RetainedStore` at start (the table's
latest version, then this edge's captures after it) and serve each newer
table version as it appears. :class:`RetainedServing` is a part of
:class:`~bridge.edge.server.EdgeServer` and works on its attributes."""

from __future__ import annotations

import asyncio
import logging
import time

from bridge.capture import open_reader
from bridge.edge.retained.store import RetainedStore

__all__ = ["RetainedServing"]

log = logging.getLogger("bridge.edge")


class RetainedServing:
    """Start-up and refresh of the retained store (see the module docstring)."""

    async def _start_retained(self) -> None:
        """The retained store (bridge.edge.retained): the table's latest
        version, then this edge's retained PUBLISHes captured after it."""
        cfg = self.config
        t0 = time.monotonic()
        store = RetainedStore(cfg.tables_dir / "retained", self.log.stream,
                              time.time() - self.loop.time(), self.edge.retained_cache_bytes)
        store.swap(await asyncio.to_thread(store.load))
        reader = open_reader(cfg)
        try:
            start = store.start_offsets(reader.earliest_offsets())
            read = await asyncio.to_thread(store.replay_log, reader, start, self.log.next_offsets())
        finally:
            reader.close()  # on Kafka: its consumers
        self.retained = self.router.retained = store
        snap = store.snapshot
        log.info("edge retained messages: table version %s (%d topics%s), %d topics of this edge's "
                 "own captures after it (%d capture records read) in %.2f s",
                 "-" if snap is None else snap.version, 0 if snap is None else snap.size,
                 "" if store.error is None else "; unreadable, see above",
                 len(store.overlay), read, time.monotonic() - t0)

    async def _retained_refresh(self) -> None:
        """Serve each newer version of the retained table as it appears."""
        store = self.retained
        while store is not None:
            await asyncio.sleep(self.edge.retained_refresh_s)
            try:
                if await asyncio.to_thread(store.newer):
                    store.swap(await asyncio.to_thread(store.load), gradual=True)
                    while store.overlay.dropping:  # a step per turn: the loop is never held
                        store.overlay.drop_step()
                        await asyncio.sleep(0)
            except Exception as exc:  # keep serving what is loaded; say why once per failure
                log.error("edge retained messages: refreshing from the table failed: %s", exc)
