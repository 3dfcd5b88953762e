"""The ``lakegate`` command line.

Every subcommand lives in its own module under ``bridge.commands`` with two
functions: ``add_arguments(parser)`` and ``run(args, config) -> int``. They are
imported lazily so that ``lakegate config show`` does not import pyspark.
Every subcommand accepts ``--config FILE`` and repeatable ``--set KEY=VALUE``.

Exit codes: 0 success, 1 failure, 2 bad usage or configuration (one line on
stderr naming what is wrong).

Start-up failures of the environment, not of the configuration's form (the
edge's port is taken, another process writes the capture log, a TLS or
password file cannot be read), are one line on stderr too, with exit code
1; ``--set log_level=DEBUG`` logs their traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import ssl
import sys
from typing import Callable, Sequence

from bridge.capture.errors import EXIT_UNAVAILABLE, CaptureError, unavailable
from bridge.config import PATH_KEYS, Config, ConfigError, load_config
from bridge.edge.auth import PasswordFileError
from bridge.javacheck import JavaMissing
from bridge.logs import LOG_FORMAT, BoundedFormatter, quiet_third_party

__all__ = ["COMMANDS", "UsageError", "common_parser", "failure_line", "main"]

log = logging.getLogger("bridge.cli")

#: Failures a command reports in one line (exit 1) rather than with a traceback.
ONE_LINE_FAILURES = (OSError, CaptureError, PasswordFileError)


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
    "jvm-archive": ("jvm_archive", "make the local Spark JVM's class archive (sessions start about 2 s sooner)"),
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


def _not_py4j_via_root(record: logging.LogRecord) -> bool:
    """py4j logs some socket errors through the root logger, with tracebacks
    (a dead JVM: one per call); the caller gets the error as an exception."""
    return not (record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname)


def setup_logging(config: Config) -> None:
    logging.basicConfig(
        level=getattr(logging, config.log_level, logging.INFO),
        format=LOG_FORMAT,
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        if _not_py4j_via_root not in handler.filters:
            handler.addFilter(_not_py4j_via_root)
        if getattr(handler, "stream", None) is sys.stderr:  # (ours, not a test's capture)
            handler.setFormatter(BoundedFormatter())  # no record longer than MAX_LINE_CHARS
    # The libraries' own INFO lines (py4j logs every gateway call, proton
    # every connection) are not the command's: WARNING and above only.
    quiet_third_party(config.log_level)
    # PySpark logs every SQL analysis error with its whole JVM stack before
    # raising it; the command prints the error itself, in one line.
    # py4j.clientserver logs a foreachBatch error with its traceback before
    # Spark fails the query with it; the job logs its root cause in one line.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def failure_line(exc: BaseException, config: Config | None = None) -> str:
    """One line naming what is wrong, for a failure in ``ONE_LINE_FAILURES``."""
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL) \
            and exc.filename is None:
        m = re.search(r"\('([^']*)', (\d+)\)", str(exc))
        host, port = (m.group(1), int(m.group(2))) if m else ("?", 0)
        key = "edge.tls_port" if config is not None and port and port == config.edge.tls_port else "edge.port"
        if exc.errno == errno.EADDRINUSE:
            why = ("address already in use: another MQTT broker (a distribution's Mosquitto holds 1883) or "
                   f"another lakegate listens there; stop it or choose another port (--set {key}=N)")
        elif exc.errno == errno.EACCES:
            why = f"permission denied (ports below 1024 need privileges; --set {key}=N)"
        else:
            why = "no such local address (edge.host must be an address of this machine)"
        return f"cannot listen on {host}:{port}: {why}"
    if isinstance(exc, OSError) and config is not None:
        # a file the configuration names (TLS, password): say which key
        files = {k: str(v) for k in sorted(PATH_KEYS - {"data_dir"}) if (v := _value(config, k))}
        for key, path in files.items():
            if exc.filename is not None and os.path.abspath(str(exc.filename)) == os.path.abspath(path):
                return f"{key} {path}: {exc.strerror or exc}"
        if exc.filename is None:
            if isinstance(exc, ssl.SSLError):
                tls = [f"{k} {p}" for k, p in files.items() if k.startswith("edge.tls_")]
                return f"{', '.join(tls) or 'the TLS files'}: not a usable certificate and key ({exc})"
            for key, path in files.items():
                if not os.access(path, os.R_OK):
                    return f"{key} {path}: {exc.strerror or exc}"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _value(config: Config, key: str) -> object:
    section, _, name = key.rpartition(".")
    return getattr(getattr(config, section) if section else config, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(getattr(args, "config", None), getattr(args, "overrides", []))
    except ConfigError as exc:
        print(f"lakegate: {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    return guarded(lambda: args._module.run(args, config), config, args.command)


def guarded(run: Callable[[], int | None], config: Config, what: str) -> int:
    """``run()``'s exit code; a failure the user can mend is one line on
    stderr instead of a traceback: exit 2 for usage and configuration, 1 for
    the ``ONE_LINE_FAILURES`` (a busy port, a locked capture log, a file that
    cannot be read), 75 when the capture log's storage did not answer (Kafka:
    try again later, ``EXIT_UNAVAILABLE``). Also the edge child process's (:mod:`bridge.commands.edge_child`)."""
    from bridge.job.edge_process import EdgeStartFailed

    try:
        return int(run() or 0)
    except (UsageError, JavaMissing) as exc:
        msg = str(exc)
        print(msg if msg.startswith("lakegate:") else f"lakegate: {msg}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"lakegate: {exc}", file=sys.stderr)
        return 2
    except EdgeStartFailed as exc:  # the edge's process said why, in its line
        return exc.exit_code
    except ONE_LINE_FAILURES as exc:
        log.debug("%s failed", what, exc_info=True)
        msg = failure_line(exc, config)
        print(msg if msg.startswith("lakegate:") else f"lakegate: {msg}", file=sys.stderr)
        return EXIT_UNAVAILABLE if unavailable(exc) else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
