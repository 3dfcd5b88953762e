"""``lakegate edge``: run the MQTT edge server until SIGINT or SIGTERM.

With ``amqp.forward_by = "edge"`` it also forwards to AMQP as records become
durable (``bridge.amqp.live``); otherwise forwarding is the job's.

Prints one line with the listening address(es) once it accepts connections,
then logs one line per connection open and close. On SIGINT/SIGTERM it shuts
down gracefully (stop accepting, DISCONNECT 0x8B to MQTT 5 clients, fsync,
close) and exits 0; it exits 1 when the capture log failed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from bridge.config import Config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, metavar="PORT",
                   help="TCP port (shortcut for --set edge.port=PORT; 0 picks a free port)")


def run(args: argparse.Namespace, config: Config) -> int:
    if args.port is not None:
        config.edge.port = args.port
        config.sources["edge.port"] = "--port"
    return asyncio.run(_serve(config))


async def _serve(config: Config) -> int:
    from bridge.edge.server import EdgeServer

    from bridge.metrics.wiring import EdgeRef, metrics_server

    from bridge.amqp.live import LiveForwarder, forwards_live

    server = EdgeServer(config)
    live = LiveForwarder(config) if forwards_live(config, hosts_edge=True, runs_job=False) else None  # forward_by edge
    metrics = metrics_server(config, EdgeRef(server), None,  # ConfigError (one line) when its port is taken
                             live=(lambda: live) if live is not None else None)
    await server.start()
    if live is not None:
        live.attach(server.log)  # woken by the edge's commits
        live.start()
    if metrics is not None:
        metrics.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    shown = ", ".join(f"{'mqtts' if tls else 'mqtt'}://{host}:{port}"
                      for host, port, tls in server.addresses)
    print(f"lakegate edge listening on {shown} (capture log {config.capture_dir})", flush=True)
    try:
        await server.serve_until_stopped()
    finally:
        await server.shutdown()
        if live is not None:
            await asyncio.to_thread(live.stop)  # forwards what is durable first (bounded)
        if metrics is not None:
            metrics.stop()
    if server.failed is not None:
        from bridge.capture.errors import EXIT_UNAVAILABLE, unavailable

        print(f"lakegate: edge stopped: capture log failed: {server.failed}", file=sys.stderr)
        return EXIT_UNAVAILABLE if unavailable(server.failed) else 1
    return 0
