"""The edge as a child process of ``lakegate run`` (``edge.own_process``).

Started by :class:`bridge.job.edge_process.EdgeProcess` as ``python -m
bridge.commands.edge_child``. The protocol, one JSON object per line:

* stdin, from the parent: ``{"config": <config_to_wire>, "durable_fd": N,
  "metrics": bool}``; then nothing. End of file on stdin means the parent
  is gone (however it ended, SIGKILL included): the edge stops as on
  SIGTERM, so no edge outlives its run.
* stdout, to the parent: ``{"ready": true, "addresses": [[host, port, tls],
  ...], "metrics": [host, port] | null}`` once it accepts connections;
  ``{"stopped": true, "failed": "..." | null}`` when it has shut down.

Logs go to stderr, which is the parent's: one stream for the user. A
failure to start (a busy port, a locked capture log) is the same one line
``lakegate edge`` prints, and exit code 1 (2: configuration).

``durable_fd``: the write end of a pipe; a byte is written (non-blocking,
dropped when the pipe is full: one pending byte wakes the reader as well
as many) each time the capture log made records durable, to wake the
run's live forwarder (:meth:`bridge.amqp.live.LiveForwarder.attach_fd`)
without polling.

``metrics``: the edge's own ``/metrics`` and ``/healthz`` on a port of
127.0.0.1 the kernel picks; the run's endpoint serves them with its own
(:mod:`bridge.metrics.wiring`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from bridge.config import Config
from bridge.config_render import config_from_wire

__all__ = ["main"]


def _report(obj: dict) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the run is gone: nobody to tell
        sys.stdout = open(os.devnull, "w")  # (nor at exit, when Python flushes it again)


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"\0")
    except (BlockingIOError, BrokenPipeError):  # a byte is pending already; the run is gone
        pass


async def _serve(config: Config, spec: dict) -> int:
    from bridge.edge.server import EdgeServer
    from bridge.metrics.wiring import EdgeRef, metrics_server

    server = EdgeServer(config)
    metrics = metrics_server(config, EdgeRef(server), None, bind=("127.0.0.1", 0)) if spec.get("metrics") else None
    await server.start()
    fd = spec.get("durable_fd")
    if fd is not None:
        os.set_blocking(fd, False)
        server.log.on_durable.append(lambda: _poke(fd))
    if metrics is not None:
        metrics.start(announce=False)  # the run's endpoint serves it
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)

    def parent_gone() -> None:
        if not os.read(0, 4096):
            loop.remove_reader(0)
            server.stop()

    loop.add_reader(0, parent_gone)
    _report({"ready": True, "pid": os.getpid(), "addresses": [list(a) for a in server.addresses],
             "metrics": list(metrics.address) if metrics is not None else None})
    try:
        await server.serve_until_stopped()
    finally:
        loop.remove_reader(0)
        await server.shutdown()
        if metrics is not None:
            metrics.stop()
        failed = server.failed
        _report({"stopped": True, "failed": f"capture log failed: {failed}" if failed is not None else None})
    if server.failed is None:
        return 0
    from bridge.capture.errors import EXIT_UNAVAILABLE, unavailable

    return EXIT_UNAVAILABLE if unavailable(server.failed) else 1  # 75: the run starts it again


def main() -> int:
    from bridge.cli import guarded, setup_logging

    spec = json.loads(sys.stdin.buffer.readline() or b"null")
    if not spec:
        print("lakegate: the edge's child process is started by lakegate run", file=sys.stderr)
        return 2
    config = config_from_wire(spec["config"])
    setup_logging(config)
    return guarded(lambda: asyncio.run(_serve(config, spec)), config, "edge")


if __name__ == "__main__":
    sys.exit(main())
