"""The log line format, the same in every process: the command line, the
spark-submit driver and the Python workers that run tasks on executors.

Every line carries a timestamp, the level and the logger
(:data:`LOG_FORMAT`; ``bridge.cli.setup_logging`` configures a command's
process with it). :func:`ensure_worker_logging` is for code that runs on
executors: a Python worker has no logging configured, so Python's
last-resort handler would print its warnings bare, without a time.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "ensure_worker_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def ensure_worker_logging(level: str = "INFO") -> None:
    """Give lakegate's loggers (``bridge.*``) a timestamped stderr handler in
    a process that has none (a Python worker on an executor); runs on
    executors. Does nothing where the root logger or ``bridge`` already has a
    handler (the driver, tests)."""
    bridge = logging.getLogger("bridge")
    if logging.getLogger().handlers or bridge.handlers:
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(LOG_FORMAT))
    bridge.addHandler(h)
    bridge.setLevel(getattr(logging, level.upper(), logging.INFO))
    bridge.propagate = False
