"""``lakegate tap --broker mqtt://HOST:PORT --topic FILTER``: capture from an existing broker.

Subscribes (MQTT 5, QoS 2, Retain As Published, persistent session) and
writes each message to the capture log with origin ``tap``, acknowledging
the broker only once the record is durable. Runs until Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import signal

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT (default: tap.broker)")
    p.add_argument("--topic", action="append", help="topic filter (repeatable; default: tap.topic)")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.tap import Tap

    if args.broker:
        from bridge.config import ConfigError, set_value

        try:
            set_value(config, "tap.broker", args.broker, "--broker")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    if not config.tap.broker:
        raise UsageError("tap: no broker; give --broker mqtt://HOST:PORT (or set tap.broker)")
    try:
        tap = Tap(config, topics=args.topic)
    except ValueError as exc:
        raise UsageError(f"tap: {exc}") from None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: tap.stop())
    print(f"lakegate tap: {config.tap.broker} topics {', '.join(tap.topics)} -> {config.capture_dir}", flush=True)
    tap.run()
    return 0
