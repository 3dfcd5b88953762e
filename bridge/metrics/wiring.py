"""``lakegate run``'s metrics endpoint: the collector and health checks over its parts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from bridge.config import Config, ConfigError
from bridge.metrics.collect import LakegateCollector, Metrics
from bridge.metrics.http import Cached, HealthChecks, MetricsServer

if TYPE_CHECKING:
    from bridge.job.edge_process import EdgeProcess
    from bridge.job.run_edge import EdgeThread

__all__ = ["EdgeRef", "metrics_server"]


class EdgeRef:
    """An EdgeServer run on this thread's event loop (``lakegate edge``), seen as an EdgeThread."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.error = None

    @property
    def alive(self) -> bool:
        return not self.server.stopping


def metrics_server(config: Config, edge: "EdgeThread | EdgeRef | EdgeProcess | None",
                   query_running: Callable[[], bool] | None,
                   live: Callable[[], Any] | None = None,
                   bind: tuple[str, int] | None = None) -> MetricsServer | None:
    """Bind ``metrics.host:metrics.port`` (ConfigError, one line, when taken); None when the port is 0.
    ``edge``: None for ``lakegate process`` (the job alone: its metrics, the capture log's end read
    from its files); ``query_running``: None for ``lakegate edge`` (no job: no job check). Call
    ``start()`` on what it returns once the parts run. ``live``: the process's
    live forwarder (``bridge.amqp.live``), read at scrape time (None: none).
    ``edge`` may be the run's edge in a process of its own
    (``bridge.job.edge_process``): its endpoint's families and checks are
    served with this one's (:mod:`bridge.metrics.remote`). ``bind``: this
    address instead of ``metrics.host:metrics.port`` (the edge's child process)."""
    if not config.metrics.port and bind is None:
        return None
    from bridge.job import progress
    from bridge.amqp.reachable import amqp_reachable
    from bridge.buckets import ACK_BUCKETS_S, Buckets

    metrics = Metrics(job=query_running is not None)
    remote = None
    if edge is not None and not hasattr(edge, "server"):  # the edge's own process
        from bridge.metrics.remote import RemoteEdge

        remote = RemoteEdge(edge)
        metrics.registry.register(remote)
        edge = None
    if edge is not None:
        server_of = lambda: edge.server if edge.alive else None  # noqa: E731
        log_of = lambda: getattr(edge.server, "log", None)  # noqa: E731
        log_end = lambda: (log_of().next_offsets() if log_of() is not None else None)  # noqa: E731
    else:
        from bridge.capture import open_reader

        server_of = log_of = lambda: None  # noqa: E731

        readers: list = []  # one reader, opened once the log is there (on Kafka: one consumer)

        def log_end() -> list[int] | None:
            try:
                if not readers:
                    readers.append(open_reader(config))
                return readers[0].durable_offsets()
            except Exception:  # no log yet, or one being created
                return None
    status_of = lambda: progress.latest_status(config.data_path)  # noqa: E731
    metrics.attach(LakegateCollector(server_of, log_of, status_of, config.capture_dir, log_end, live))
    progress.BATCH_OBSERVERS[:] = [metrics.observe_batch]  # one run per process: the newest wins

    health = HealthChecks()
    if remote is not None:
        health.add("edge", lambda: remote.check("edge"))
        health.add("capture_log", lambda: remote.check("capture_log"))
    if edge is not None:
        health.add("edge", lambda: (edge.alive and edge.error is None and not edge.server.failed,
                                    "accepting connections" if edge.alive else "the edge's thread has stopped"))

        def capture_log() -> tuple[bool, str]:
            log = log_of()
            if log is None:
                return False, "not open"
            failed = log.failed
            if failed is not None:
                return False, f"failed: {failed}"
            stalled = getattr(log, "stalled", None)  # on Kafka: records waiting for it too long
            why = stalled() if stalled is not None else None
            return (why is None, "writable" if why is None else why)

        health.add("capture_log", capture_log)

    def job() -> tuple[bool, str]:
        if not query_running():
            return False, "the streaming query is not running"
        st = status_of()
        if not st:
            return True, "running, no batch yet"
        age = time.time() - float(st.get("time", time.time()))
        lag = st.get("lag", -1)
        if lag and lag > 0 and age > config.metrics.max_batch_age_s:
            return False, f"{lag} records wait and the last batch was {age:.0f} s ago"
        return True, f"last batch {age:.0f} s ago, lag {lag}"

    if query_running is not None:
        health.add("job", job)
    if live is not None:
        def forwarding() -> tuple[bool, str]:
            fwd = live()
            if fwd is None:
                return True, "not forwarding live"
            if not fwd.alive:
                return False, "the live forwarder's thread has stopped"
            failure = fwd.stats.failure
            if failure is not None:
                return False, f"failing for {time.time() - failure['since']:.0f} s: {failure['cause']}"
            return True, f"{sum(fwd.stats.lag.values())} durable records not forwarded yet"

        health.add("live_forwarding", forwarding)
    if config.amqp.url and (query_running is not None or config.amqp.downlink or live is not None):  # talks AMQP
        url = config.amqp.url

        def amqp() -> tuple[bool, str]:
            ok = amqp_reachable(url)
            return ok, "reachable" if ok else "the AMQP peer does not accept connections"

        health.add("amqp", Cached(amqp))
    try:
        server = MetricsServer(metrics, health, *(bind or (config.metrics.host, config.metrics.port)))
    except OSError as exc:
        raise ConfigError("metrics.port", config.sources.get("metrics.port", "default"),
                          f"{config.metrics.host}:{config.metrics.port} cannot be bound ({exc.strerror}); set "
                          "metrics.port to a free port, or 0 for no metrics endpoint") from None
    if edge is not None:
        edge.server.ack_latency = [Buckets(ACK_BUCKETS_S) for _ in range(16)]  # the edge times acks, counts frames out
    return server
