"""``lakegate compact``: expire retained messages, compact small files, vacuum."""

from __future__ import annotations

import argparse
import json

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.tables.engine import make_engine
    from bridge.tables.maintenance import run_maintenance

    engine = make_engine(config)
    try:
        report = run_maintenance(engine, config.tables.vacuum_retention_hours)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps({"expired": report.expired, "compacted": report.compacted,
                          "vacuumed": report.vacuumed, "seconds": round(report.seconds, 3)}))
    else:
        print(report.line())
    return 0
