"""``lakegate tap --broker mqtt://HOST:PORT --topic FILTER``: capture from an existing broker.

Subscribes (MQTT 5, QoS 2, Retain As Published, persistent session) and
writes each message to the capture log with origin ``tap`` -- the local
log, or a Kafka topic with ``--set capture.backend=kafka`` (section
``[kafka]``) -- acknowledging the broker (PUBACK, PUBREC) only once the
record is durable (fsynced; on Kafka, confirmed by its delivery report). Runs until
Ctrl-C / SIGTERM (exit 0). Exits 1 with one line on stderr when a message
could not be captured (it was not acknowledged: the broker re-sends it when
the tap is started again), when the capture log cannot be opened, or when
the installed paho-mqtt is not a release bridge/tap.py was verified against.
"""

from __future__ import annotations

import argparse
import signal

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT (default: tap.broker)")
    p.add_argument("--topic", action="append", help="topic filter (repeatable; default: tap.topic)")


def run(args: argparse.Namespace, config: Config) -> int:
    import sys

    from bridge.capture import CaptureError
    from bridge.cli import UsageError
    from bridge.tap import PahoVersionError, Tap, TapError

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
    except (CaptureError, PahoVersionError) as exc:
        print(f"lakegate: tap: {exc}", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: tap.stop())
    where = (f"Kafka topic {config.kafka_topic} at {config.kafka.bootstrap_servers}"
             if config.capture.backend == "kafka" else str(config.capture_dir))
    print(f"lakegate tap: {config.tap.broker} topics {', '.join(tap.topics)} -> {where}", flush=True)
    try:
        tap.run()
    except TapError as exc:
        print(f"lakegate: tap: stopped: {exc}", file=sys.stderr)
        return 1
    return 0
