"""``/metrics`` and ``/healthz`` over HTTP, on a daemon thread of their own.

``/healthz`` answers 200 when every check passes and 503 otherwise, with a
JSON body naming each check, so that a load balancer or a systemd watchdog
can act on the status alone and a person can read why:

* ``edge``: the edge (its thread, or under ``lakegate run`` its process) is alive and listening;
* ``capture_log``: the capture log accepts appends (not failed on a write
  or fsync error; on Kafka, no record waiting for Kafka's confirmation for
  more than a few seconds);
* ``job``: the streaming query is running and, when records wait in the log
  (lag > 0), its last batch is younger than ``max_batch_age_s`` (an idle
  job runs no batches: an old batch is not a fault then);
* ``amqp``: the AMQP peer accepts TCP connections (checked at most every
  5 s; absent when forwarding is off).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bridge.metrics.collect import Metrics

__all__ = ["HealthChecks", "MetricsServer"]

log = logging.getLogger(__name__)


class HealthChecks:
    """The checks of ``/healthz``: each a callable returning (ok, detail)."""

    def __init__(self) -> None:
        self.checks: dict[str, Callable[[], tuple[bool, str]]] = {}

    def add(self, name: str, check: Callable[[], tuple[bool, str]]) -> None:
        self.checks[name] = check

    def run(self) -> tuple[bool, dict[str, Any]]:
        out: dict[str, Any] = {}
        healthy = True
        for name, check in self.checks.items():
            try:
                ok, detail = check()
            except Exception as exc:  # a check that fails to run is a failed check
                ok, detail = False, f"check failed: {type(exc).__name__}: {exc}"
            out[name] = {"ok": ok, "detail": detail}
            healthy = healthy and ok
        return healthy, out


class Cached:
    """``fn()`` at most every ``ttl_s`` seconds (a TCP probe per scrape would be rude)."""

    def __init__(self, fn: Callable[[], tuple[bool, str]], ttl_s: float = 5.0) -> None:
        self.fn, self.ttl_s = fn, ttl_s
        self._at, self._value = 0.0, (False, "not checked yet")
        self._lock = threading.Lock()

    def __call__(self) -> tuple[bool, str]:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                self._value, self._at = self.fn(), time.monotonic()
            return self._value


class MetricsServer:
    """``ThreadingHTTPServer`` for /metrics and /healthz (``port`` 0 in tests picks a free one)."""

    def __init__(self, metrics: Metrics, health: HealthChecks, host: str, port: int) -> None:
        metrics_ref, health_ref = metrics, health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics_ref.registry))
                elif path == "/healthz":
                    ok, checks = health_ref.run()
                    body = json.dumps({"status": "ok" if ok else "failing", "checks": checks}, indent=1)
                    self._send(200 if ok else 503, "application/json", body.encode())
                else:
                    self._send(404, "text/plain", b"not found: /metrics, /healthz\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:  # scrapes every 15 s: DEBUG only
                log.debug("metrics http: " + fmt, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.address = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="lakegate-metrics", daemon=True)

    def start(self, announce: bool = True) -> "MetricsServer":
        """``announce``: one INFO line with the address (the run's edge
        process's own endpoint, which only the run reads, logs at DEBUG)."""
        self.thread.start()
        (log.info if announce else log.debug)("metrics: http://%s:%d/metrics and /healthz", *self.address)
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
