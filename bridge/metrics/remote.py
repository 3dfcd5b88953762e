"""The edge's metrics and checks when it runs in a process of its own.

``lakegate run`` with ``edge.own_process`` (:mod:`bridge.job.edge_process`):
the edge's child serves its own ``/metrics`` and ``/healthz`` on a
loopback port the kernel picked; the run's endpoint stays the one users
scrape. At each scrape :class:`RemoteEdge` reads the child's families and
yields them with the run's own (the families the run has itself, the
capture log's size on disk, are not repeated); the run's ``edge`` and
``capture_log`` checks are the child's. While the child is down (being
restarted), its families are absent and the checks fail, saying so.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["RemoteEdge"]

#: families the run's own collector yields (the same value read from the same files)
_OWN = frozenset({"lakegate_capture_disk_bytes"})
TIMEOUT_S = 2.0


class RemoteEdge:
    """A prometheus_client collector over the edge process's endpoint (module doc)."""

    def __init__(self, edge: Any) -> None:
        #: an EdgeProcess: ``alive``, ``pid``, ``metrics_address``, ``failed``
        self.edge = edge

    def _get(self, path: str) -> tuple[int, bytes] | None:
        addr = self.edge.metrics_address
        if addr is None or not self.edge.alive:
            return None
        try:
            with urllib.request.urlopen(f"http://{addr[0]}:{addr[1]}{path}", timeout=TIMEOUT_S) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:  # /healthz answers 503 with its body
            return exc.code, exc.read()
        except OSError:
            return None

    def collect(self) -> Iterable[Any]:
        got = self._get("/metrics")
        if got is None:
            return
        for family in text_string_to_metric_families(got[1].decode()):
            if family.name not in _OWN:
                yield family

    def check(self, name: str) -> tuple[bool, str]:
        """The child's ``/healthz`` check ``name`` (``edge``, ``capture_log``)."""
        if not self.edge.alive:
            why = self.edge.failed or "its process is not running"
            return False, f"the edge's process has stopped: {why}"
        got = self._get("/healthz")
        if got is None:
            return False, f"the edge's process (pid {self.edge.pid}) does not answer"
        try:
            check = json.loads(got[1])["checks"][name]
        except (ValueError, KeyError, TypeError):
            return False, f"the edge's process (pid {self.edge.pid}) answered without a {name} check"
        return bool(check["ok"]), f"{check['detail']} (pid {self.edge.pid})"
