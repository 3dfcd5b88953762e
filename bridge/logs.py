"""The log line format, the same in every process: the command line, the
spark-submit driver and the Python workers that run tasks on executors.

Every line carries a timestamp, the level and the logger
(:data:`LOG_FORMAT`; ``bridge.cli.setup_logging`` configures a command's
process with it). :func:`ensure_worker_logging` is for code that runs on
executors: a Python worker has no logging configured, so Python's
last-resort handler would print its warnings bare, without a time.

A command prints what it means to say, and its log lines are lakegate's:
:func:`quiet_third_party` keeps the libraries' own INFO lines
(python-qpid-proton's ``Connecting to Url(...)``, ``Disconnected, already
closed``; py4j's every gateway call) out of them, their warnings and errors
in; with ``log_level = "DEBUG"`` their INFO lines come back (py4j's never).
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "MAX_LINE_CHARS", "THIRD_PARTY_LOGGERS", "BoundedFormatter", "ensure_worker_logging",
           "quiet_third_party"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the most characters one log record prints (its traceback included): a
#: record built from what a client sent (one SUBSCRIBE of 250,000 filters
#: once made a 29.5 MB line) must not flood the log [LG-log-line-bound]
MAX_LINE_CHARS = 16_384
_TAIL = 2_048
#: the loggers of the libraries lakegate runs (and their children): their
#: INFO lines narrate the library's own work, not the command's
THIRD_PARTY_LOGGERS = ("proton", "py4j", "urllib3", "grpc", "paho", "deltalake", "pyspark", "matplotlib",
                       "asyncio")
#: those whose INFO lines stay out even at DEBUG (py4j logs every gateway call)
_ALWAYS_QUIET = ("py4j",)


class BoundedFormatter(logging.Formatter):
    """:data:`LOG_FORMAT`, each record cut to :data:`MAX_LINE_CHARS`: its
    start and its end (a traceback's last frames) are kept, and the cut says
    how much went."""

    def __init__(self, fmt: str = LOG_FORMAT, limit: int = MAX_LINE_CHARS) -> None:
        super().__init__(fmt)
        self.limit = limit

    def format(self, record: logging.LogRecord) -> str:
        s = super().format(record)
        if len(s) <= self.limit:
            return s
        tail = min(_TAIL, self.limit // 4)
        cut = len(s) - self.limit + 80
        return (f"{s[:self.limit - tail - 80]} ... [{cut} characters cut: "
                f"LG-log-line-bound] ... {s[-tail:]}")


def ensure_worker_logging(level: str = "INFO") -> None:
    """Give lakegate's loggers (``bridge.*``) a timestamped stderr handler in
    a process that has none (a Python worker on an executor); runs on
    executors. Does nothing where the root logger or ``bridge`` already has a
    handler (the driver, tests)."""
    bridge = logging.getLogger("bridge")
    if logging.getLogger().handlers or bridge.handlers:
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(BoundedFormatter())
    bridge.addHandler(h)
    bridge.setLevel(getattr(logging, level.upper(), logging.INFO))
    bridge.propagate = False


def quiet_third_party(log_level: str = "INFO") -> None:
    """The third-party loggers (:data:`THIRD_PARTY_LOGGERS`) at WARNING, so
    that a command's output and log hold lakegate's lines; at ``DEBUG``
    (``--set log_level=DEBUG``) at INFO, but py4j's still at WARNING."""
    debug = str(log_level).upper() == "DEBUG"
    for name in THIRD_PARTY_LOGGERS:
        level = logging.INFO if debug and name not in _ALWAYS_QUIET else logging.WARNING
        logging.getLogger(name).setLevel(level)
