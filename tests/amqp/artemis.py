"""Apache ActiveMQ Artemis for the tests: a second real AMQP 1.0 peer (issue 39).

**The shared broker.** ``scripts/services up`` starts it on 127.0.0.1:5673
(:data:`PORT`, ``ARTEMIS_PORT``) from the distribution ``scripts/bootstrap``
unpacked to ``.jvm/artemis`` (``jvm/pom.xml``): AMQP only, guest/guest or
anonymous, ``topic://<address>`` multicast and ``queue://<address>``
anycast, addresses and queues created on use. :func:`missing` says why
Artemis cannot run on this machine (no distribution, no Java): the tests
that need it skip with that reason. Installed but not answering, they fail
as the other brokers' tests do (tests/conftest.py), unless
``LAKEGATE_SKIP_BROKERS=1``: :func:`need`.

**Private instances** (:class:`ArtemisNode`): for tests that stop the
broker, as ``tests/amqp/rabbitnode.py`` does for RabbitMQ. Each is made by
``scripts/services artemis-instance`` (configured as the shared one) in a
directory of the test's, listens on a free loopback port, runs as a child
process of the test in a session of its own, and only that process is
stopped.

**Management** (:func:`management`): Artemis's management operations over
AMQP (a request to ``activemq.management``, the answer on a temporary
queue), for the tests to see and delete the queues they made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from bridge.ports import free_loopback_port
from tests.amqp.conftest import Consumer

__all__ = ["ArtemisNode", "HOME", "PORT", "TopicConsumer", "URL", "destroy_queues", "management", "message_count",
           "missing", "need", "queue_names", "unique"]

ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("ARTEMIS_HOME") or ROOT / ".jvm" / "artemis")
PORT = int(os.environ.get("ARTEMIS_PORT", "5673"))
URL = f"amqp://guest:guest@127.0.0.1:{PORT}"
SERVICES = ROOT / "scripts" / "services"


def missing() -> str | None:
    """Why Artemis cannot run here, or None when it can."""
    if not os.access(HOME / "bin" / "artemis", os.X_OK):
        return f"Artemis is not installed: no distribution in {HOME} (scripts/bootstrap unpacks it with Maven)"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Artemis is not installed: no Java (it needs Java 17)"
    return None


def answers(port: int = PORT) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def need() -> str:
    """The shared Artemis's URL; skips when Artemis is not installed here,
    fails when it is but does not answer (skips with LAKEGATE_SKIP_BROKERS=1)."""
    why = missing()
    if why:
        pytest.skip(why)
    if not answers():
        msg = f"Artemis does not answer on 127.0.0.1:{PORT}; start it with scripts/services up"
        if os.environ.get("LAKEGATE_SKIP_BROKERS") == "1":
            pytest.skip(msg + " (skipped: LAKEGATE_SKIP_BROKERS=1)")
        pytest.fail(msg)
    return URL


# ------------------------------------------------------------------ management
def management(url: str, operation: str, *args: Any, resource: str = "broker", timeout: float = 10) -> Any:
    """One management operation (``operation`` of ``resource``, the JSON
    ``args``) on the broker at ``url``; returns its result, raises
    RuntimeError when the broker says it failed."""
    from proton import Message
    from proton.utils import BlockingConnection

    host = url.split("@")[-1]
    conn = BlockingConnection(f"amqp://{host}", timeout=timeout, user="guest", password="guest")
    try:
        reply = conn.create_receiver(None, dynamic=True)
        conn.create_sender("activemq.management").send(Message(
            body=json.dumps(list(args)), reply_to=reply.remote_source.address,
            properties={"_AMQ_ResourceName": resource, "_AMQ_OperationName": operation}))
        answer = reply.receive(timeout)
        reply.accept()
    finally:
        conn.close()
    body = json.loads(answer.body) if isinstance(answer.body, str) else answer.body
    if not (answer.properties or {}).get("_AMQ_OperationSucceeded"):
        raise RuntimeError(f"Artemis management {resource}.{operation}{args!r} failed: {body!r}")
    return body[0] if isinstance(body, list) and len(body) == 1 else body


def queue_names(url: str) -> list[str]:
    return list(management(url, "getQueueNames"))


def destroy_queues(url: str, match: Callable[[str], bool]) -> list[str]:
    """Delete every queue whose name ``match``es (with its messages; its
    consumers are disconnected). Best effort: returns what it deleted."""
    gone = []
    for name in queue_names(url):
        if match(name):
            try:
                management(url, "destroyQueue", name, True)
                gone.append(name)
            except RuntimeError:
                pass  # gone meanwhile (auto-deleted)
    return gone


def message_count(url: str, queue: str) -> int:
    return int(management(url, "getMessageCount", resource=f"queue.{queue}"))


# ------------------------------------------------------------------ private instances
class ArtemisNode:
    """One private Artemis instance: :meth:`start`, :meth:`stop` (and start
    again: its journal, and so what it accepted, survives)."""

    def __init__(self, base: Path) -> None:
        why = missing()
        if why:
            raise RuntimeError(why)
        self.base = base
        self.instance = base / "instance"
        self.port = free_loopback_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        r = subprocess.run([str(SERVICES), "artemis-instance", str(self.instance), str(self.port)],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, ARTEMIS_HOME=str(HOME)))
        if r.returncode != 0:
            raise RuntimeError(f"could not make a private Artemis instance: {r.stderr.strip() or r.stdout.strip()}")

    def start(self, timeout: float = 60) -> None:
        with open(self.base / "artemis.out", "ab") as log:
            # a session of its own: nothing sent to the test's process group reaches it
            self.proc = subprocess.Popen([str(self.instance / "bin" / "artemis"), "run"], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not answers(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"private Artemis exited ({self.proc.returncode}); see {self.instance}/log/artemis.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"private Artemis did not answer within {timeout}s")
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to this instance's JVM (Artemis's shutdown hook stops it
        cleanly); SIGKILL if it has not exited after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()


# ------------------------------------------------------------------ a consumer
def TopicConsumer(url: str, prefix: str) -> Consumer:
    """One AMQP 1.0 receiver on ``topic://<prefix>.#`` (a multicast
    subscription on Artemis's wildcard address) for a whole module: the
    RabbitMQ tests' ``Consumer`` (tests/amqp/conftest.py) on Artemis's
    address form; messages kept by ``to`` (the MQTT topic, which Artemis
    delivers as it was sent)."""
    return Consumer(url, prefix, source=f"topic://{prefix}.#")


def unique(prefix: str = "lgtest") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"
