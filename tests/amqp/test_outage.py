"""RabbitMQ stopped during a run and started again: every QoS 1 and 2
message arrives, none lost.

Runs against a private RabbitMQ node (tests/amqp/rabbitnode.py), so that
stopping it disturbs no other test. Messages go to a durable queue through
RabbitMQ's ``/amq/queue/<name>`` address (``amqp.address_template =
"/amq/queue/{routing_key}"``); QoS 1 and 2 are durable, so what RabbitMQ
accepted survives its restart, and what it had not accepted the forwarder
sends again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from bridge.amqp.sender import Forwarder
from bridge.config import load_config
from tests.amqp.rabbitnode import RabbitNode, find_rabbitmq
from tests.amqp.rows import row

pytestmark = [pytest.mark.broker, pytest.mark.slow,
              pytest.mark.skipif(find_rabbitmq() is None, reason="needs a RabbitMQ installation to start a private node")]

BATCH = 300


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = RabbitNode(tmp_path_factory.mktemp("rabbit"))
    n.start()
    yield n
    n.close()


def receive_all(url: str, queue: str, want: set[str], timeout: float) -> list[str]:
    """Every lakegate-id in the durable queue, until ``want`` is covered or ``timeout``."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, DurableSubscription

    got: list[str] = []
    left = set(want)  # what is still missing: a linear check (a set of ``got`` per message
    # was quadratic, and at 200,000 messages the receive ran out of time)
    deadline = time.monotonic() + timeout

    class H(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=500)

        def on_start(self, event: Any) -> None:
            host = url.split("@")[-1]
            self.conn = event.container.connect(f"amqp://{host}", user="guest", password="guest", reconnect=False)
            event.container.create_receiver(self.conn, f"/queue/{queue}", options=DurableSubscription())
            self.timer = event.container.schedule(0.2, self)

        def on_message(self, event: Any) -> None:
            lid = event.message.properties["lakegate-id"]
            got.append(lid)
            left.discard(lid)
            if not left:
                self.timer.cancel()
                self.conn.close()

        def on_timer_task(self, event: Any) -> None:
            if time.monotonic() > deadline:
                self.conn.close()
            else:
                self.timer = event.container.schedule(0.2, self)

    Container(H()).run()
    return got


def declare_durable_queue(url: str, queue: str) -> None:
    """Attach (then drop) a durable receiver: RabbitMQ 3.x declares the queue."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, DurableSubscription

    done: list[str] = []

    class H(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=0)

        def on_start(self, event: Any) -> None:
            host = url.split("@")[-1]
            conn = event.container.connect(f"amqp://{host}", user="guest", password="guest", reconnect=False)
            event.container.create_receiver(conn, f"/queue/{queue}", options=DurableSubscription())

        def on_link_opened(self, event: Any) -> None:
            done.append(event.link.remote_source.address)
            event.connection.close()

    Container(H()).run()
    assert done == [f"/queue/{queue}"]


def test_broker_stopped_and_started_during_a_run_loses_nothing(node):
    queue = "lgtest-outage"
    declare_durable_queue(node.url, queue)
    cfg = load_config(None, [f"amqp.url={node.url}", "amqp.address_template=/amq/queue/{routing_key}",
                             "amqp.max_retries=10", "amqp.retry_backoff_s=0.2", "amqp.disposition_timeout_s=5"],
                      env={}).amqp
    sent: list[str] = []
    results: list[Any] = []
    errors: list[BaseException] = []
    progress = threading.Condition()
    stop = threading.Event()

    def run() -> None:
        offset = 0
        with Forwarder(cfg) as fwd:
            while not stop.is_set() and len(results) < 400:
                batch = []
                for i in range(BATCH):
                    qos = 1 + (offset % 2)
                    batch.append(row(queue, offset, qos=qos, packet_id=offset % 65535 + 1, payload=b"m%d" % offset))
                    if qos == 2:
                        batch.append(row(queue, offset + 1, kind="pubrel", packet_id=offset % 65535 + 1))
                        offset += 1
                    offset += 1
                try:
                    res = fwd.forward(batch)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)
                    return
                finally:
                    with progress:
                        progress.notify_all()
                sent.extend(r["stream"] + f"/0/{r['offset']}" for r in batch)
                with progress:
                    results.append(res)
                    progress.notify_all()

    def wait_batches(n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with progress:
            while len(results) < n and not errors:
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(results)} batches within {timeout}s"
                progress.wait(left)

    t = threading.Thread(target=run, name="outage-forwarder")
    t.start()
    try:
        wait_batches(2, 30)
        node.stop()  # rabbitmqctl stop, while batches are being forwarded
        node.start()
        after = len(results)
        wait_batches(after + 2, 60)
    finally:
        stop.set()
        t.join(90)
    assert not errors, errors
    assert sum(r.reconnects for r in results) >= 1
    want = set(sent)
    # the volume follows how long `rabbitmqctl stop` takes (the forwarder
    # runs until then): 166,000 messages took 22 s to receive here, idle;
    # the timeout is a bound, the receive ends once all came
    got = receive_all(node.url, queue, want, timeout=180)
    missing = want - set(got)
    assert not missing, f"{len(missing)} of {len(want)} messages lost, e.g. {sorted(missing)[:5]}"
    assert sum(r.accepted for r in results) == len(want)
