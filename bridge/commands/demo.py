"""``lakegate demo``: publish a realistic workload and show what the lake made of it.

Starts ``lakegate run`` in the background when none runs on this data_dir,
publishes (4 devices on MQTT 3.1.1 and 5: retained status set, updated and
cleared; telemetry at QoS 0/1/2 with topic aliases, message expiry and user
properties; one malformed frame), waits until the job processed it, and
prints the retained state, the quarantine rows and the forwarding counts.
"""

from __future__ import annotations

import argparse
import sys

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-running", action="store_true",
                   help="leave the background lakegate run up afterwards (default: stop it if the demo started it)")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.demo import Demo, DemoError

    passthrough: list[str] = []
    if getattr(args, "config", None):
        passthrough += ["--config", args.config]
    for item in getattr(args, "overrides", []) or []:
        passthrough += ["--set", item]
    try:
        return Demo(config, passthrough, out=sys.stdout, keep_running=args.keep_running).run()
    except DemoError as exc:
        raise UsageError(f"demo: {exc}") from None
