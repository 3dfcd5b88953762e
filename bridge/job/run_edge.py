"""``lakegate run``'s edge: which one (:func:`new_edge`) and the in-process
one (:class:`EdgeThread`, ``edge.own_process = false``). The default, a
process of its own, is :class:`bridge.job.edge_process.EdgeProcess`; both
have the surface the run's supervisor uses (``start``, ``stop``, ``alive``,
``failed``, ``restartable``, ``wake_on_durable``, ``close``)."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from bridge.config import Config

if TYPE_CHECKING:
    from bridge.amqp.live import LiveForwarder
    from bridge.job.edge_process import EdgeProcess

__all__ = ["EdgeThread", "new_edge"]


class EdgeThread:
    """The edge server on its own event loop, in a daemon thread."""

    def __init__(self, config: Config) -> None:
        from bridge.edge.server import EdgeServer

        self.server = EdgeServer(config)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="lakegate-edge", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def serve() -> None:
            await self.server.start()
            self._ready.set()
            try:
                await self.server.serve_until_stopped()
            finally:
                await self.server.shutdown()

        try:
            self.loop.run_until_complete(serve())
        except BaseException as exc:  # reported to the main thread
            self.error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float = 120.0) -> list[tuple[str, int, bool]]:
        self.thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the edge did not start within {timeout:.0f}s")
        if self.error is not None:
            raise self.error
        return self.server.addresses

    def stop(self, timeout: float = 30.0) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.server.stop)
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def failed(self) -> str | None:
        """Why it stopped by itself (its capture log failed, or it raised), else None."""
        if self.server.failed is not None:
            return f"capture log failed: {self.server.failed}"
        return None if self.error is None else f"{type(self.error).__name__}: {self.error}"

    #: a thread that ended is not started again (its process is this one)
    restartable = False
    stopped_from_outside = False
    pid = None
    exit_status = None

    def wake_on_durable(self, live: "LiveForwarder") -> None:
        live.attach(self.server.log)  # woken by the edge's commits

    def close(self) -> None:
        pass


def new_edge(config: Config) -> "EdgeThread | EdgeProcess":
    """The run's edge: in a process of its own (``edge.own_process``) or a thread."""
    if config.edge.own_process:
        from bridge.job.edge_process import EdgeProcess

        return EdgeProcess(config)
    return EdgeThread(config)
