"""The ``lakegate`` command line.

Every subcommand lives in its own module under ``bridge.commands`` with two
functions: ``add_arguments(parser)`` and ``run(args, config) -> int``. They are
imported lazily so that ``lakegate config show`` does not import pyspark.
Every subcommand accepts ``--config FILE`` and repeatable ``--set KEY=VALUE``.

Exit codes: 0 success, 1 failure, 2 bad usage or configuration (one line on
stderr naming what is wrong).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from bridge.config import Config, ConfigError, load_config
from bridge.javacheck import JavaMissing
from bridge.logs import LOG_FORMAT

__all__ = ["COMMANDS", "UsageError", "common_parser", "main"]


class UsageError(Exception):
    """Bad input the user can fix; printed as one line, exit code 2."""


#: name -> (module under bridge.commands, one-line help). Only commands that work.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("config_cmd", "show the effective configuration (secrets masked)"),
    "doctor": ("doctor", "check prerequisites: Java, Python packages, services, data directory"),
    "run": ("run", "edge and streaming job together: the embedded default (Ctrl-C stops cleanly)"),
    "demo": ("demo", "publish a realistic workload through the edge and show the tables and forwarding"),
    "process": ("process", "run the streaming job in this process (--once: process what is there, then exit)"),
    "status": ("status", "a failure going on now, the job's last batch and its current lag"),
    "sql": ("sql", "run Spark SQL over the messages, retained and quarantine tables"),
    "compact": ("compact", "expire retained messages, compact small files, vacuum old ones"),
    "edge": ("edge", "run the MQTT edge server until SIGINT/SIGTERM"),
    "passwd": ("passwd", "add, change or delete a user in the edge's password file"),
    "tap": ("tap", "capture from an existing broker through an MQTT 5 subscription"),
    "log": ("log_cmd", "inspect the capture log: partition stats, record dump"),
    "bench": ("bench", "run a benchmark and print what it measured (bench log, ...)"),
}


def common_parser() -> argparse.ArgumentParser:
    """``--config`` and ``--set``, for every (sub)command parser's ``parents``.

    Defaults are SUPPRESS so that nested subparsers do not reset values given
    earlier on the command line.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML configuration file (default: built-in defaults = conf/lakegate.toml)")
    common.add_argument("--set", metavar="KEY=VALUE", action="append", default=argparse.SUPPRESS, dest="overrides",
                        help="override one configuration key (dotted, repeatable), e.g. --set edge.port=1884")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(prog="lakegate", description="MQTT capture, Delta lakehouse and AMQP 1.0 forwarding.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        mod = importlib.import_module(f"bridge.commands.{module}")
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def setup_logging(config: Config) -> None:
    logging.basicConfig(
        level=getattr(logging, config.log_level, logging.INFO),
        format=LOG_FORMAT,
        stream=sys.stderr,
    )
    # py4j logs every gateway call at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # PySpark logs every SQL analysis error with its whole JVM stack before
    # raising it; the command prints the error itself, in one line.
    # py4j.clientserver logs a foreachBatch error with its traceback before
    # Spark fails the query with it; the job logs its root cause in one line.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(getattr(args, "config", None), getattr(args, "overrides", []))
    except ConfigError as exc:
        print(f"lakegate: {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    try:
        return int(args._module.run(args, config) or 0)
    except (UsageError, JavaMissing) as exc:
        msg = str(exc)
        print(msg if msg.startswith("lakegate:") else f"lakegate: {msg}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"lakegate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
