"""Fixtures for the AMQP forwarding tests.

``consumer``: one AMQP 1.0 receiver on the real RabbitMQ for the whole test
session, on ``/topic/<prefix>.#``: RabbitMQ 3.x binds a new queue to
``amq.topic`` with that binding key, so it gets every message a test sends
under a topic from :meth:`Consumer.topic` (unique per test). RabbitMQ 3.x
keeps that queue after the receiver detaches; the fixture deletes it at the
end (``rabbitmqctl delete_queue``, found through its binding).

``make_config``: an :class:`AmqpConfig` for the broker, with short retries.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from typing import Any, Callable

import pytest

from bridge.config import AmqpConfig, load_config

log = logging.getLogger("tests.amqp")


def rabbitmqctl() -> str | None:
    return shutil.which("rabbitmqctl") or next(
        (p for p in ("/usr/sbin/rabbitmqctl", "/usr/lib/rabbitmq/bin/rabbitmqctl") if os.path.exists(p)), None)


class Consumer:
    """Collects every message under ``<prefix>/`` topics, by topic (``to``),
    from one receiver on ``source``: RabbitMQ's ``/topic/<prefix>.#`` by
    default; tests/amqp/artemis.py gives Artemis's ``topic://<prefix>.#``."""

    def __init__(self, url: str, prefix: str, source: str | None = None) -> None:
        from proton.handlers import MessagingHandler
        from proton.reactor import EventInjector

        from bridge.amqp.reactor import container

        self.prefix = prefix
        self.binding = f"{prefix}.#"
        self.source = source or f"/topic/{self.binding}"
        self.cond = threading.Condition()
        self.by_topic: dict[str, list[Any]] = {}
        self.error: str | None = None
        self.ready = threading.Event()
        self.injector = EventInjector()
        self.conn: Any = None
        consumer = self

        class H(MessagingHandler):
            def __init__(self) -> None:
                super().__init__(prefetch=1000)

            def on_start(self, event: Any) -> None:
                event.container.selectable(consumer.injector)
                host = url.split("@")[-1]
                conn = event.container.connect(f"amqp://{host}", user="guest", password="guest", reconnect=False)
                event.container.create_receiver(conn, consumer.source)

            def on_link_opened(self, event: Any) -> None:
                consumer.conn = event.connection
                consumer.ready.set()

            def on_lg_stop(self, event: Any) -> None:
                consumer.conn.close()
                consumer.injector.close()

            def on_message(self, event: Any) -> None:
                m = event.message
                with consumer.cond:
                    consumer.by_topic.setdefault(m.address, []).append(m)
                    consumer.cond.notify_all()

            def on_transport_error(self, event: Any) -> None:
                consumer.error = str(event.transport.condition)
                consumer.ready.set()

            def on_session_error(self, event: Any) -> None:
                consumer.error = str(event.session.remote_condition)
                consumer.ready.set()

            def on_link_error(self, event: Any) -> None:  # (Artemis refuses a link, not the session)
                consumer.error = str(event.link.remote_condition)
                consumer.ready.set()

        self.handler = H()
        self.container = container(self.handler)
        self.thread = threading.Thread(target=self.container.run, daemon=True, name="test-consumer")
        self.thread.start()
        if not self.ready.wait(15) or self.error:
            raise RuntimeError(f"test consumer could not attach to {self.source}: {self.error or 'timeout'}")

    def topic(self, name: str = "") -> str:
        """A fresh MQTT topic under the consumer's prefix."""
        return f"{self.prefix}/{name or 't'}-{uuid.uuid4().hex[:8]}"

    def wait(self, topic: str, n: int, timeout: float = 15.0) -> list[Any]:
        """The first ``n`` messages sent to ``topic``; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.by_topic.get(topic, [])) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    got = len(self.by_topic.get(topic, []))
                    pytest.fail(f"consumer got {got} of {n} messages on {topic!r} within {timeout}s")
                self.cond.wait(left)
            return list(self.by_topic[topic])

    def close(self) -> None:
        from proton.reactor import ApplicationEvent

        self.injector.trigger(ApplicationEvent("lg_stop"))
        self.thread.join(10)


@pytest.fixture(scope="session")
def consumer(rabbitmq: str):
    prefix = f"lgtest{uuid.uuid4().hex[:8]}"
    c = Consumer(rabbitmq, prefix)
    yield c
    c.close()
    delete_queue(c)


def delete_queue(c: "Consumer") -> None:
    """Delete the queue RabbitMQ bound for consumer ``c`` (a /topic receiver's
    queue outlives a test that ends without detaching). Best effort."""
    ctl = rabbitmqctl()
    if ctl is None:
        log.warning("rabbitmqctl not found: the test queue bound to %s stays", c.binding)
        return
    try:
        out = subprocess.run([ctl, "-q", "list_bindings", "destination_name", "routing_key"],
                             capture_output=True, text=True, timeout=60).stdout
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 and parts[1] == c.binding:
                subprocess.run([ctl, "-q", "delete_queue", parts[0]], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:  # cleanup is best effort
        log.warning("could not delete the test queue: %s", exc)


@pytest.fixture
def make_config(rabbitmq: str) -> Callable[..., AmqpConfig]:
    """AmqpConfig for the real broker; keyword overrides are amqp keys."""

    def make(**overrides: Any) -> AmqpConfig:
        sets = [f"amqp.url={rabbitmq}", "amqp.max_retries=2", "amqp.retry_backoff_s=0.05",
                "amqp.disposition_timeout_s=10"]
        sets += [f"amqp.{k}={v}" for k, v in overrides.items()]
        return load_config(None, sets, env={}).amqp

    return make
