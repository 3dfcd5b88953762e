"""The client side: a Spark session for queries, from the endpoint when it answers.

:func:`open_session` returns a Spark Connect session to the endpoint of a
running ``lakegate run`` / ``lakegate process`` (``sql.connect_*``), or,
when none answers, a local Spark session, after one line on stderr saying
so. Either way the caller registers the views with
:func:`bridge.tables.views.register_views` (``lakegate sql`` does not where
the session's catalog has the tables as Delta tables:
:mod:`bridge.sqlserve.catalog`): on a Connect session they are the
session's own temporary views, read at the tables' latest version (or
``as_of``) when the client registers them, so a query sees every batch
committed before it started.

A Connect client fails fast rather than hang: a port that does not answer
within ``probe_timeout_s`` means no endpoint, and the client's gRPC retries
are bounded (:data:`RETRY`), so a query sent while ``lakegate run`` restarts
its Spark session ends in one line (:func:`endpoint_gone`, :func:`one_line_error`).
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from bridge.config import Config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["RETRY", "SqlSession", "endpoint_answers", "endpoint_gone", "open_session", "one_line_error"]

log = logging.getLogger(__name__)

#: gRPC retries of a Connect client: about 1.5 s in all (pyspark's default
#: waits up to 10 minutes for an endpoint that went away).
RETRY = {"max_retries": 4, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 1000, "jitter": 50,
         "min_jitter_threshold": 2000}


@dataclass
class SqlSession:
    spark: "SparkSession"
    #: "endpoint" (Spark Connect) or "local" (a Spark session of this process's own)
    mode: str
    where: str

    def stop(self) -> None:
        self.spark.stop()


def endpoint_answers(config: Config, timeout_s: float = 0.5) -> bool:
    """True when something accepts connections on the endpoint's port."""
    from bridge.sqlserve.endpoint import client_host

    if not config.sql.connect_port:
        return False
    try:
        with socket.create_connection((client_host(config), config.sql.connect_port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _remote(config: Config) -> "SparkSession":
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    from bridge.sqlserve.endpoint import url

    spark = SparkSession.builder.remote(url(config)).getOrCreate()
    spark.client.set_retry_policies([DefaultPolicy(**RETRY)])
    return spark


def open_session(config: Config, app_name: str, say: Callable[[str], None] | None = None,
                 probe_timeout_s: float = 0.5) -> SqlSession:
    """A session for queries: the endpoint's when it answers, else a local one (``say`` tells why)."""
    from bridge.sqlserve.endpoint import url

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    shown = url(config).split("/;")[0]
    if endpoint_answers(config, probe_timeout_s):
        try:
            return SqlSession(_remote(config), "endpoint", shown)
        except Exception as exc:  # a port that answers but is not (or not yet) a Connect server
            why = one_line_error(exc)
            log.debug("sql: endpoint %s refused", shown, exc_info=True)
            say(f"lakegate: the SQL endpoint {shown} did not take the session ({why}); "
                "starting a local Spark session")
    elif config.sql.connect_port:
        say(f"lakegate: no SQL endpoint answers on {shown} (is lakegate run up?); starting a local Spark session")
    from bridge.spark.session import build_session

    return SqlSession(build_session(config, app_name=app_name), "local", "local")


_GONE = ("StatusCode.UNAVAILABLE", "failed to connect", "connection refused", "socket closed",
         "StatusCode.CANCELLED", "INVALID_HANDLE.SESSION_CLOSED")


def endpoint_gone(exc: BaseException) -> bool:
    """True for an error of the transport (the endpoint stopped or restarts), not of the query."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(g.lower() in text for g in _GONE)


def one_line_error(exc: BaseException) -> str:
    """A Spark or gRPC error in one line (no JVM stack, no gRPC debug string)."""
    from bridge.tables.engine import one_line

    if endpoint_gone(exc):
        return "the endpoint stopped answering (lakegate run stopped, or is restarting its Spark session)"
    msg = one_line(exc)
    return msg.split("; line ")[0] if "SQLSTATE" in msg else msg
