"""Run the edge server on its own event loop in a thread."""

from __future__ import annotations

import asyncio
import threading

from bridge.capture import CaptureLog
from bridge.config import Config

__all__ = ["EdgeThread"]


class EdgeThread:
    """Run an :class:`EdgeServer` on its own event loop in a thread (tests,
    benchmarks, embedding). ``with EdgeThread(config) as edge: edge.port``."""

    def __init__(self, config: Config, *, log: CaptureLog | None = None,
                 start_timeout: float = 30.0) -> None:
        from bridge.edge.server import EdgeServer  # here: server.py re-exports this class

        self.config = config
        self.server = EdgeServer(config, log=log)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lakegate-edge", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._start_timeout = start_timeout

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._started.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        try:
            await self.server.start()
        finally:
            self._started.set()
        await self.server.serve_until_stopped()
        await self.server.shutdown()

    def start(self) -> EdgeThread:
        self._thread.start()
        if not self._started.wait(self._start_timeout):
            raise TimeoutError("the edge did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args, timeout: float = 30.0):
        """Run ``fn(*args)`` on the edge's loop (coroutine functions are awaited)."""
        async def run():
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self.server.stop)
            except RuntimeError:
                pass
            self._thread.join(timeout)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def tls_port(self) -> int | None:
        return self.server.tls_port

    def ws_port(self, secure: bool = False) -> int | None:
        """The WebSocket listener's port (``secure``: the wss one), or None."""
        return next((p for _h, p, tls in self.server.ws_addresses if tls == secure), None)

    def __enter__(self) -> EdgeThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

