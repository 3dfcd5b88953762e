"""What ``/metrics`` shows: read from the running parts at scrape time.

Names follow Prometheus conventions: the ``lakegate_`` prefix, the unit in
the name, ``_total`` for counters. The edge, the capture log and the job are
given as callables returning the live objects (None while a part is not up:
its metrics are then absent, not zero).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from bridge.mqtt.fixed_header import PacketType

__all__ = ["BATCH_BUCKETS_S", "LakegateCollector", "Metrics"]

#: batch duration buckets (seconds): a warm batch here is 0.2-0.5 s
BATCH_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_VERSION = {3: "3.1", 4: "3.1.1", 5: "5"}


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:  # removed by retention meanwhile
                pass
    return total


def _snapshot(items: Any) -> list:
    """``list(items)`` of a set the edge's event loop may change meanwhile (a scrape runs on its own
    thread): copying can meet a change in the middle; try again, it is short."""
    for _ in range(10):
        try:
            return list(items)
        except RuntimeError:  # "Set changed size during iteration"
            continue
    return []


def _histogram(name: str, doc: str, series: list[tuple[tuple[str, ...], Any]],
               labels: tuple[str, ...] = ()) -> HistogramMetricFamily:
    h = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, b in series:
        h.add_metric(list(values), b.cumulative(), sum_value=b.sum)
    return h


def _edge_traffic(server: Any) -> Iterable[Any]:
    """Bytes and packets in and out by type (open connections plus those that ended), ack
    latency, frames rejected by rule."""
    tot = server.closed_totals
    pin, pout = list(tot["packets_in"]), list(tot["packets_out"])
    bin_, bout = tot["bytes_in"], tot["bytes_out"]
    for conn in _snapshot(server.conns):
        session = conn.session
        if session is not None:
            bin_ += session.bytes_in
            for i, n in enumerate(session.packets_in):
                pin[i] += n
        bout += conn.bytes_out
        for i, n in enumerate(conn.packets_out):
            pout[i] += n
    for direction, counts, nbytes in (("received", pin, bin_), ("sent", pout, bout)):
        fam = CounterMetricFamily(f"lakegate_edge_packets_{direction}_total", f"MQTT packets {direction} by type",
                                  labels=["type"])
        for t in PacketType:
            fam.add_metric([t.name], counts[t.value])
        yield fam
        yield CounterMetricFamily(f"lakegate_edge_{direction}_bytes_total", f"bytes {direction} on MQTT connections",
                                  value=nbytes)
    if server.ack_latency is not None:
        yield _histogram("lakegate_edge_ack_latency_seconds",
                         "QoS 1/2 acknowledgement: queued at the PUBLISH until written, once the frame is durable",
                         [(("1",), server.ack_latency[PacketType.PUBACK]), (("2",), server.ack_latency[PacketType.PUBREC])],
                         labels=("qos",))
    rej = CounterMetricFamily("lakegate_edge_rejected_frames_total", "frames a connection was ended for, by rule id",
                              labels=["rule"])
    for rule, n in sorted(dict(server.rejected).items()):
        rej.add_metric([rule], n)
    yield rej


def _cluster(st: dict) -> Iterable[Any]:
    """A cluster edge's view of the cluster (``EdgeServer.cluster_status``)."""
    alive = GaugeMetricFamily("lakegate_cluster_edge_alive", "1 while the edge beats (its lease holds), by edge id",
                              labels=["edge"])
    conns = GaugeMetricFamily("lakegate_cluster_edge_connections", "MQTT connections of each edge (its last beat)",
                              labels=["edge"])
    lag = GaugeMetricFamily("lakegate_cluster_edge_lag_records", "records of the other edges' partitions each edge "
                            "has not applied yet (its last beat)", labels=["edge"])
    for e, m in sorted(st["members"].items()):
        alive.add_metric([str(e)], 1 if m["alive"] else 0)
        if "connections" in m:
            conns.add_metric([str(e)], m["connections"])
        if "lag" in m:
            lag.add_metric([str(e)], m["lag"])
    yield alive
    yield conns
    yield lag
    yield GaugeMetricFamily("lakegate_cluster_sessions_elsewhere", "persistent sessions kept here that are "
                            "connected through another edge", value=st["sessions_elsewhere"])
    moves = CounterMetricFamily("lakegate_cluster_session_moves_total", "sessions moved between this edge and "
                                "another, by direction", labels=["direction"])
    moves.add_metric(["in"], st["moves_in"])
    moves.add_metric(["out"], st["moves_out"])
    yield moves
    yield CounterMetricFamily("lakegate_cluster_records_applied_total", "records of the other edges applied here",
                              value=st["records"])
    yield CounterMetricFamily("lakegate_cluster_dead_edges_total", "edges this edge declared dead",
                              value=st["dead_edges"])


def _live_forwarding(st: Any) -> Iterable[Any]:
    """The live forwarder's counters (``bridge.amqp.live.LiveStats``)."""
    for name, doc, value in (
            ("forwarded", "messages the live forwarder forwarded (accepted, or QoS 0 handed over)", st.forwarded),
            ("records", "capture records the live forwarder passed (forwarded or not meant for it)", st.records),
            ("expired", "messages not sent: their Message Expiry Interval had passed", st.expired),
            ("unforwardable", "rows set aside and quarantined (LG-amqp-unforwardable, LG-amqp-rejected)",
             st.unforwardable),
            ("failed_ranges", "ranges the peer did not take, sent again after a pause", st.failed_attempts)):
        yield CounterMetricFamily(f"lakegate_live_forward_{name}_total", doc, value=value)
    g = GaugeMetricFamily("lakegate_live_forward_lag_records", "durable records not forwarded yet, by partition "
                          "(at the live forwarder's last look)", labels=["partition"])
    for p, n in sorted(dict(st.lag).items()):
        g.add_metric([str(p)], n)
    yield g
    yield GaugeMetricFamily("lakegate_live_forward_failing", "1 while the live forwarder's attempts fail",
                            value=0 if st.failure is None else 1)


def _live_links(links: dict | None) -> Iterable[Any]:
    """The live forwarder's AMQP sender links (``Forwarder.link_stats``; absent before its first range)."""
    if not links:
        return
    yield GaugeMetricFamily("lakegate_live_forward_links", "AMQP sender links open (attaching or attached; at most "
                            "amqp.max_links; 2 on the anonymous relay)", value=links["open"])
    yield CounterMetricFamily("lakegate_live_forward_link_attaches_total", "AMQP sender links attached",
                              value=links["attaches"])
    yield CounterMetricFamily("lakegate_live_forward_link_detaches_total", "AMQP sender links ended (detached by "
                              "either side, or gone with their session or connection)", value=links["detaches"])
    yield CounterMetricFamily("lakegate_live_forward_link_evictions_total", "AMQP sender links detached to make "
                              "room under amqp.max_links (least recently used idle first)", value=links["evictions"])
    yield GaugeMetricFamily("lakegate_live_forward_links_waiting", "addresses waiting for an AMQP sender link "
                            "(amqp.max_links reached, none idle)", value=links["waiting"])
    yield GaugeMetricFamily("lakegate_live_forward_anonymous_relay", "1 while forwarding rides the peer's "
                            "anonymous relay (amqp.anonymous_relay)", value=1 if links["relay"] else 0)


class LakegateCollector:
    """A prometheus_client collector over the edge, the capture log and the job's totals."""

    def __init__(self, edge: Callable[[], Any], capture: Callable[[], Any], job: Callable[[], dict | None],
                 capture_dir: Path, log_end: Callable[[], list[int] | None],
                 live: Callable[[], Any] | None = None) -> None:
        self.edge, self.capture, self.job, self.capture_dir = edge, capture, job, capture_dir
        #: the capture log's end offsets per partition (None: unknown)
        self.log_end = log_end
        #: the live forwarder (``bridge.amqp.live.LiveForwarder``) of this process, or None
        self.live = live or (lambda: None)

    def collect(self) -> Iterable[Any]:
        server = self.edge()
        if server is not None:
            by_version: dict[str, int] = {v: 0 for v in _VERSION.values()}
            for conn in _snapshot(server.conns):
                level = getattr(getattr(conn, "session", None), "level", None)  # set by the CONNECT
                if level in _VERSION:
                    by_version[_VERSION[level]] += 1
            g = GaugeMetricFamily("lakegate_edge_connections", "open MQTT connections by protocol version "
                                  "(after CONNECT)", labels=["protocol"])
            for v, n in by_version.items():
                g.add_metric([v], n)
            yield g
            by_kind = {"tcp": 0, "tls": 0, "ws": 0, "wss": 0}
            for conn in _snapshot(server.conns):
                kind = getattr(conn, "kind", "tcp")
                by_kind[kind] = by_kind.get(kind, 0) + 1
            g = GaugeMetricFamily("lakegate_edge_connections_by_transport", "open MQTT connections by transport "
                                  "(tcp, tls, ws: WebSockets, wss: WebSockets over TLS)", labels=["transport"])
            for kind, n in by_kind.items():
                g.add_metric([kind], n)
            yield g
            yield GaugeMetricFamily("lakegate_edge_ws_handshakes", "WebSocket connections whose HTTP upgrade is "
                                    "not over yet", value=getattr(server, "ws_handshakes", 0))
            yield CounterMetricFamily("lakegate_edge_accepted_connections_total", "TCP connections accepted",
                                      value=server.stats.get("connections", 0))
            yield CounterMetricFamily("lakegate_edge_refused_connections_total",
                                      "connections refused (limits, authentication back-pressure)",
                                      value=server.stats.get("refused", 0))
            yield from _edge_traffic(server)
            cluster = server.cluster_status() if hasattr(server, "cluster_status") else None
            if cluster is not None:
                yield from _cluster(cluster)
        log = self.capture()
        if log is not None:
            st = dict(log.stats)
            yield CounterMetricFamily("lakegate_capture_appends_total", "records appended to the capture log",
                                      value=st.get("appends", 0))
            yield CounterMetricFamily("lakegate_capture_commits_total", "group commits (one fsync round each; on Kafka, "
                                      "poller turns that confirmed records)",
                                      value=st.get("commits", 0))
            yield CounterMetricFamily("lakegate_capture_fsyncs_total", "fdatasync calls", value=st.get("fsyncs", 0))
            yield CounterMetricFamily("lakegate_capture_written_bytes_total", "bytes written to the capture log",
                                      value=st.get("bytes", 0))
            yield GaugeMetricFamily("lakegate_capture_writable", "1 while the capture log accepts appends",
                                    value=0 if log.failed is not None else 1)
            if log.fsync_latency is not None:
                yield _histogram("lakegate_capture_fsync_seconds", "one group commit's fdatasync calls (on Kafka: "
                                 "a group's first record produced to its last confirmed)",
                                 [((), log.fsync_latency)])
        if self.capture_dir.is_dir():
            yield GaugeMetricFamily("lakegate_capture_disk_bytes", "bytes the capture log holds on disk",
                                    value=_dir_bytes(self.capture_dir))
        live = self.live()
        if live is not None:
            yield from _live_forwarding(live.stats)
            link_stats = getattr(live, "link_stats", None)
            yield from _live_links(link_stats() if link_stats is not None else None)
        status = self.job()
        if status:
            totals = status.get("totals") or {}
            yield CounterMetricFamily("lakegate_job_batches_total", "micro-batches completed (this process)",
                                      value=totals.get("batches", 0))
            rows = CounterMetricFamily("lakegate_job_rows_total", "rows written by table (this process)",
                                       labels=["table"])
            rows.add_metric(["messages"], totals.get("messages", 0))
            rows.add_metric(["retained"], totals.get("retained_upserts", 0) + totals.get("retained_deletes", 0))
            rows.add_metric(["quarantine"], totals.get("quarantined", 0))
            yield rows
            yield CounterMetricFamily("lakegate_job_forwarded_total", "messages forwarded to AMQP (this process)",
                                      value=totals.get("forwarded", 0))
            yield CounterMetricFamily("lakegate_job_forward_failures_total",
                                      "rows no AMQP message could be made of, or the peer refused for their own "
                                      "sake (quarantined, never retried; this process)",
                                      value=totals.get("forward_unforwardable", 0))
            q = CounterMetricFamily("lakegate_job_quarantined_total", "rows quarantined by rule id (this process)",
                                    labels=["rule"])
            for rule, n in sorted((status.get("totals_quarantined_by_rule") or {}).items()):
                q.add_metric([rule], n)
            yield q
            end = status.get("end_offsets") or {}
            log_end = self.log_end()
            if log_end is not None:
                g = GaugeMetricFamily("lakegate_job_lag_records", "capture records after the last batch's end, by "
                                      "partition", labels=["partition"])
                for p, n in enumerate(log_end):
                    g.add_metric([str(p)], max(0, int(n) - int(end.get(str(p), 0))))
                yield g
            if status.get("time"):
                yield GaugeMetricFamily("lakegate_job_last_batch_age_seconds", "seconds since the last batch",
                                        value=max(0.0, time.time() - float(status["time"])))


class Metrics:
    """The registry ``/metrics`` serves: the collector plus the batch duration histogram."""

    def __init__(self, job: bool = True) -> None:
        """``job``: this process runs the streaming job (else no job metrics at all)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.batch_duration = Histogram("lakegate_job_batch_duration_seconds", "micro-batch wall time",
                                        buckets=BATCH_BUCKETS_S, registry=self.registry) if job else None
        self._lock = threading.Lock()
        self._collector: LakegateCollector | None = None

    def attach(self, collector: LakegateCollector) -> None:
        with self._lock:
            if self._collector is None:
                self.registry.register(collector)
                self._collector = collector

    def observe_batch(self, status: dict) -> None:
        """Called by the job's progress listener once per batch."""
        ms = status.get("duration_ms")
        if ms is not None and self.batch_duration is not None:
            self.batch_duration.observe(ms / 1000.0)
