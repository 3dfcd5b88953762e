"""Fixtures for edge tests: an in-process edge on an ephemeral loopback port
with a temporary data directory, and a raw MQTT client over a socket."""

from __future__ import annotations

import socket

import pytest

from bridge.config import load_config
from bridge.edge.server import EdgeThread
from bridge.mqtt import encode, frame_length
from tests.edge.util import connect, read_log
from tests.waiting import wait_for

__all__ = ["RawClient", "wait_for", "wait_records"]


class RawClient:
    """A TCP client that sends bytes and reads whole MQTT packets."""

    #: every client made during the current test: closed after it (_close_raw_clients),
    #: whether the test closed it or not (a test process has 1,024 descriptors select() can watch)
    made: list["RawClient"] = []

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        RawClient.made.append(self)

    def send(self, data: bytes) -> RawClient:
        self.sock.sendall(data)
        return self

    def connect(self, level: int = 4, **fields) -> bytes:
        """Send a CONNECT; return the CONNACK."""
        self.send(connect(level, **fields))
        return self.packet()

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, OSError):
            chunk = b""
        self.buf += chunk
        return bool(chunk)

    def packet(self) -> bytes:
        """The next packet; b"" when the edge closed the connection."""
        while True:
            total = frame_length(self.buf, from_client=False) if self.buf else None
            if total is not None and len(self.buf) >= total:
                pkt, self.buf = self.buf[:total], self.buf[total:]
                return pkt
            if not self._fill():
                return b""

    def closed(self) -> bool:
        """True when the edge closes the connection (waits up to the timeout)."""
        try:
            return not self.sock.recv(1)
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def publish(self, level, **kw) -> RawClient:
        from tests.edge.util import publish

        return self.send(publish(level, **kw))

    def send_packet(self, packet, level: int) -> RawClient:
        return self.send(encode(packet, level))


def wait_records(where, predicate, count: int, timeout: float = 10.0) -> list:
    """Poll the capture log until ``count`` records satisfy ``predicate``
    (``where``: a capture directory, or a Config: see ``read_log``)."""
    def ready():
        recs = [r for r in read_log(where) if predicate(r)]
        return recs if len(recs) >= count else None
    return wait_for(ready, timeout, f"{count} capture records")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "local_capture(reason): in a module with CAPTURE_BACKENDS, runs on the local "
        "capture log only (it checks what only local files have)")
    config.addinivalue_line(
        "markers", "no_cluster(reason): in a module whose CAPTURE_BACKENDS has \"cluster\", not "
        "run on the two-edge cluster (it restarts or inspects one edge)")


@pytest.fixture(autouse=True)
def _close_raw_clients():
    yield
    made, RawClient.made = RawClient.made, []
    for c in made:
        c.close()


def pytest_generate_tests(metafunc):
    """A test module that sets ``CAPTURE_BACKENDS = ("local", "kafka")`` runs
    each of its tests that starts an edge on both capture logs (a parameter,
    not copies): ``capture_backend`` below. A test marked
    ``@pytest.mark.local_capture("why")`` runs on ("local",) only."""
    backends = getattr(metafunc.module, "CAPTURE_BACKENDS", None)
    if backends and "capture_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("local_capture")
        if marker is not None:
            if not (marker.args or marker.kwargs.get("reason")):
                raise pytest.UsageError(f"{metafunc.definition.nodeid}: local_capture needs its reason")
            backends = ("local",)
        marker = metafunc.definition.get_closest_marker("no_cluster")
        if marker is not None:
            if not (marker.args or marker.kwargs.get("reason")):
                raise pytest.UsageError(f"{metafunc.definition.nodeid}: no_cluster needs its reason")
            backends = tuple(b for b in backends if b != "cluster")
        metafunc.parametrize("capture_backend", backends, indirect=True)


@pytest.fixture
def capture_backend(request):
    """The capture log the test's edges use: "local" (the default), or
    "kafka" (the real Kafka of scripts/services, a topic of the test's own,
    deleted after it)."""
    backend = getattr(request, "param", "local")
    if backend == "local":
        yield []
        return
    bootstrap = request.getfixturevalue("kafka")
    topic = request.getfixturevalue("kafka_topic")("lg-edge")  # deleted after the test
    extra = ["capture.partitions=4", "cluster.edges=2"] if backend == "cluster" else []
    yield ["capture.backend=kafka", f"kafka.bootstrap_servers={bootstrap}", f"kafka.topic={topic}",
           "kafka.create_topic=true", *extra]


class AlternatingEdge:
    """Two edges of a cluster as one (``capture_backend`` "cluster"): each
    read of ``port`` gives the other edge's, so a test's connections
    alternate between them; the rest is the first edge's."""

    def __init__(self, first: EdgeThread, second: EdgeThread) -> None:
        self.edges = (first, second)
        self._turn = 0

    @property
    def port(self) -> int:
        self._turn += 1
        return self.edges[self._turn % 2].port

    def stop(self) -> None:
        for e in self.edges:
            e.stop()

    def __getattr__(self, name):
        return getattr(self.edges[0], name)


#: readers made by reader_of(log) for each open any_log: closed after the test
_LOG_READERS: dict[int, list] = {}


@pytest.fixture(params=["local", "kafka"])
def any_log(request, tmp_path):
    """A capture log of 3 partitions for sans-IO tests that append through
    real sessions, on each capture log in turn: local files (fsync every
    1 ms), or a Kafka topic of the test's own on the real Kafka of
    scripts/services (deleted after the test). Read it with
    :func:`reader_of` and :func:`log_where`."""
    if request.param == "local":
        from bridge.capture import CaptureLog

        log = CaptureLog.open(tmp_path / "capture", fsync_interval_ms=1, partitions=3)
    else:
        from bridge.capture.kafka_log import KafkaCaptureLog

        topic = request.getfixturevalue("kafka_topic")("lg-edge-log")
        cfg = load_config(None, [f"data_dir={tmp_path / 'data'}", "capture.backend=kafka", "capture.partitions=3",
                                 f"kafka.bootstrap_servers={request.getfixturevalue('kafka')}",
                                 f"kafka.topic={topic}", "kafka.create_topic=true"], env={})
        log = KafkaCaptureLog.open(cfg)
    _LOG_READERS[id(log)] = []
    yield log
    log.close()
    for r in _LOG_READERS.pop(id(log)):
        r.close()


def log_where(log):
    """What :func:`tests.edge.util.read_log` and ``open_reader`` take for
    ``log``: its directory (local) or its Config (Kafka)."""
    from bridge.capture.kafka_log import KafkaCaptureLog

    return log.config if isinstance(log, KafkaCaptureLog) else log.root


def reader_of(log):
    """A reader of ``log`` (an :func:`any_log`), closed after the test."""
    from bridge.capture import LogReader
    from bridge.capture.kafka_log import KafkaCaptureLog

    if isinstance(log, KafkaCaptureLog):
        from bridge.capture.kafka_reader import KafkaLogReader

        r = KafkaLogReader(log.config)
    else:
        r = LogReader(log.root)
    _LOG_READERS.setdefault(id(log), []).append(r)
    return r


@pytest.fixture
def edge_config(tmp_path, capture_backend):
    """A function: overrides -> Config on a fresh data dir, ephemeral port
    (and the test's capture backend)."""
    def make(*overrides: str, data_dir=None):
        d = data_dir or tmp_path / "data"
        return load_config(None, [f"data_dir={d}", "edge.port=0", "capture.fsync_interval_ms=2",
                                  *capture_backend, *overrides], env={})
    return make


@pytest.fixture
def run_edge(edge_config):
    """A function: overrides -> a started EdgeThread (stopped after the test)."""
    started: list[EdgeThread] = []

    def start(*overrides: str, config=None) -> EdgeThread:
        cfg = config or edge_config(*overrides)
        if cfg.cluster.edges > 1 and config is None:  # capture_backend "cluster": two edges, one face
            other = edge_config(*overrides, "cluster.edge_id=1", data_dir=cfg.data_path / "edge1")
            edge = AlternatingEdge(EdgeThread(cfg).start(), EdgeThread(other).start())
        else:
            edge = EdgeThread(cfg).start()
        started.append(edge)
        return edge

    yield start
    for edge in started:
        edge.stop()


@pytest.fixture
def edge(run_edge):
    return run_edge()


@pytest.fixture
def raw(edge):
    clients: list[RawClient] = []

    def open_client(port: int | None = None, timeout: float = 5.0) -> RawClient:
        c = RawClient(port or edge.port, timeout=timeout)
        clients.append(c)
        return c

    yield open_client
    for c in clients:
        c.close()
