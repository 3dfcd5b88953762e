"""A back end that speaks AMQP 1.0 itself, with no broker in between: it
listens on loopback, the edge connects to it (``amqp.url``) and attaches
its receiver links, and it sends on them. Unlike a producer behind
RabbitMQ, it sees the edge's own dispositions: the seed's flows as the
AMQP network sees them ("From AMQP network to MQTT client").

It is a real python-qpid-proton peer, the way an AMQP 1.0 back end that
does not use a broker talks to lakegate; nothing of the edge is replaced.
"""

from __future__ import annotations

import collections
import queue
import socket
import threading
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, EventInjector

from bridge.amqp.reactor import container

__all__ = ["DirectPeer"]


class DirectPeer(MessagingHandler):
    """:meth:`start`, :meth:`send` (any thread), :attr:`outcomes`
    (name -> (outcome, monotonic time)), :attr:`conditions` (of rejections),
    :attr:`links` (addresses the edge
    receives from), :meth:`stop`."""

    def __init__(self) -> None:
        super().__init__(auto_accept=False, auto_settle=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"amqp://127.0.0.1:{self.port}"
        self.links: dict[str, Any] = {}
        #: every connection the edge made (closed at :meth:`stop`)
        self.connections: list[Any] = []
        self.pending: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.names: dict[Any, str] = {}
        self.outcomes: dict[str, tuple[str, float]] = {}
        #: name -> (condition, description) of a rejected delivery
        self.conditions: dict[str, tuple[str, str]] = {}
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.injector = EventInjector()
        self.container = container(self)
        self.container.allowed_mechs = "ANONYMOUS"
        self.thread = threading.Thread(target=self.container.run, name="direct-peer", daemon=True)
        self.listening = threading.Event()

    def start(self) -> DirectPeer:
        self.thread.start()
        assert self.listening.wait(10), "the peer did not listen"
        return self

    def send(self, address: str, message: Message, name: str) -> None:
        self.commands.put((address, message, name))
        self.injector.trigger(ApplicationEvent("peer_send"))

    def stop(self) -> None:
        self.commands.put(None)
        self.injector.trigger(ApplicationEvent("peer_send"))
        self.thread.join(10)

    # ------------------------------------------------------------ the thread
    def on_start(self, event: Any) -> None:
        event.container.selectable(self.injector)
        self.acceptor = event.container.listen(f"127.0.0.1:{self.port}")
        self.listening.set()

    def on_connection_opening(self, event: Any) -> None:
        self.connections.append(event.connection)

    def on_link_opening(self, event: Any) -> None:
        link = event.link
        if link.is_sender and link.remote_source and link.remote_source.address:
            address = link.remote_source.address
            link.source.address = address
            self.links[address] = link

    def on_link_closing(self, event: Any) -> None:
        link = event.link
        # == (the C link), not `is`: proton hands out a new wrapper per event
        if link.is_sender and self.links.get(link.source.address) == link:
            del self.links[link.source.address]

    def on_sendable(self, event: Any) -> None:
        self._flush(event.link)

    def _flush(self, link: Any) -> None:
        q = self.pending[link.source.address]
        while q and link.credit:
            message, name = q.popleft()
            self.names[link.send(message)] = name

    def on_peer_send(self, event: Any) -> None:
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if cmd is None:
                self.acceptor.close()
                for conn in self.connections:
                    conn.close()
                self.injector.close()
                return
            address, message, name = cmd
            self.pending[address].append((message, name))
            if address in self.links:
                self._flush(self.links[address])

    def _outcome(self, event: Any, outcome: str) -> None:
        name = self.names.pop(event.delivery, None)
        if name is not None:
            self.outcomes[name] = (outcome, time.monotonic())

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        cond = event.delivery.remote.condition
        name = self.names.get(event.delivery)
        if name is not None and cond is not None:
            self.conditions[name] = (cond.name, cond.description or "")
        self._outcome(event, "rejected")

    def on_released(self, event: Any) -> None:  # proton calls it for modified too
        self._outcome(event, "released" if event.delivery.remote_state == event.delivery.RELEASED
                      else "modified")
