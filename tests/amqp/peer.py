"""A scriptable AMQP 1.0 peer for tests: a proton acceptor on loopback.

It receives on whatever address a sender attaches to, records the attach
frames (address, settle modes), the messages and the detaches, and answers
each delivery as ``policy(peer, address, message, n)`` says (``n``: how many
times a message with that ``lakegate-id`` arrived so far):

* ``"accept"``, ``"reject"``, ``"release"``, ``"modify"`` -- that outcome
  (``"reject"`` with the condition ``amqp:internal-error``;
  ``"reject:NAME"``, e.g. ``"reject:amqp:decode-error"``, with NAME);
* ``"ignore"`` -- no disposition at all (the sender's time-out);
* ``"hold"`` -- no disposition until :meth:`FakePeer.release_held` is called.

A receiver link in rcv-settle-mode *second* sends its outcome unsettled and
settles only once the sender has settled, as the AMQP spec says; the peer
records which deliveries went through that second step.

Addresses in ``refuse`` are refused at link level: the attach is answered
with a null target and then a detach carrying ``amqp:not-found``.
``max_message_size`` (bytes, 0: none) is advertised in the peer's attach.
``offer``: connection capabilities offered in the peer's open frame (e.g.
``("ANONYMOUS-RELAY",)``: a link with a null target address is then taken,
its messages recorded under their ``to``; ``None`` in ``refuse`` refuses it).
``end_session``: address -> how many times an attach to it ends the whole
session with ``amqp:not-found`` (what RabbitMQ 3.x does over an unusable
address), at once; attaches that arrive on the session after its end are
not answered. ``attach_delay_s``: every other attach is answered that much
later (so that several are still attaching when a session ends).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from proton import Condition, Delivery, Handler, Link, Message, Terminus, symbol
from proton.reactor import ApplicationEvent, EventInjector

from bridge.amqp.reactor import container
from bridge.ports import free_loopback_port as free_port

__all__ = ["FakePeer", "free_port"]


class _Later(Handler):
    """A link attach answered later (``attach_delay_s``)."""

    def __init__(self, handler: "_Handler", event: Any) -> None:
        super().__init__()
        self.handler, self.link = handler, event.link

    def on_timer_task(self, event: Any) -> None:
        if self.link.session in self.handler.peer.ended:
            return
        self.handler.on_link_remote_open(type("E", (), {"link": self.link, "container": event.container})())


class _Handler(Handler):
    def __init__(self, peer: "FakePeer") -> None:
        super().__init__()
        self.peer = peer

    def on_reactor_init(self, event: Any) -> None:
        p = self.peer
        p.acceptor = event.container.listen(f"{p.scheme}://127.0.0.1:{p.port}", ssl_domain=p.ssl_domain)
        event.container.selectable(p.injector)
        p.ready.set()

    def on_connection_remote_open(self, event: Any) -> None:
        c = event.connection
        self.peer.open_connections.append(c)
        with self.peer.cond:
            self.peer.connections.append({"user": event.transport.user, "container": c.remote_container})
            self.peer.cond.notify_all()
        if self.peer.offer:
            c.offered_capabilities = [symbol(x) for x in self.peer.offer]
        c.open()

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()

    def on_session_remote_open(self, event: Any) -> None:
        event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        event.session.close()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        p = self.peer
        address = link.remote_target.address
        if not getattr(link, "lg_delayed", False):  # (a delayed one was recorded when it came)
            with p.cond:
                p.attaches.append({
                    "name": link.name,
                    "address": address,
                    "snd_settle_mode": link.remote_snd_settle_mode,
                    "rcv_settle_mode": link.remote_rcv_settle_mode,
                })
                p.cond.notify_all()
        if link.session in p.ended:
            return  # the session is ending: its end frame answers this attach
        if p.end_session.get(address, 0) > 0:
            p.end_session[address] -= 1
            p.ended.append(link.session)
            link.session.condition = Condition("amqp:not-found", f"no such node: {address}")
            link.session.close()
            return
        if p.attach_delay_s and not getattr(link, "lg_delayed", False):
            link.lg_delayed = True
            event.container.schedule(p.attach_delay_s, _Later(self, event))
            return
        if address in p.refuse:
            link.target.type = Terminus.UNSPECIFIED
            link.open()
            link.condition = Condition("amqp:not-found", f"no such node: {address}")
            link.close()
            return
        link.target.address = address
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if p.max_message_size:
            link.max_message_size = p.max_message_size
        link.open()
        link.flow(p.credit)

    def on_link_remote_close(self, event: Any) -> None:
        with self.peer.cond:
            self.peer.detaches.append(event.link.name)
            self.peer.cond.notify_all()
        event.link.close()

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = dlv.link
        p = self.peer
        if link.is_sender:
            return
        if getattr(dlv, "lg_seen", False):
            # a later update: the sender settled (rcv-settle-mode second)
            if dlv.settled and getattr(dlv, "lg_answered", False) and not getattr(dlv, "lg_done", False):
                dlv.lg_done = True
                with p.cond:
                    p.second_step += 1
                    p.cond.notify_all()
                dlv.settle()
            return
        if not dlv.readable or dlv.partial:
            return
        data = link.recv(dlv.pending)
        link.advance()
        dlv.lg_seen = True
        msg = Message()
        msg.decode(data)
        key = (msg.properties or {}).get("lakegate-id")
        with p.cond:
            p.counts[key] = n = p.counts.get(key, 0) + 1
            p.messages.append({"address": link.target.address or msg.address, "message": msg, "settled": dlv.settled,
                               "link": link.name, "rcv_settle_mode": link.rcv_settle_mode})
            p.cond.notify_all()
        link.flow(1)
        if dlv.settled:  # pre-settled by the sender: nothing to answer
            dlv.settle()
            return
        action = p.policy(p, link.target.address or msg.address, msg, n)
        if action == "ignore":
            return
        if action == "hold":
            p.held.append(dlv)
            return
        self.answer(dlv, action)

    def answer(self, dlv: Any, action: str) -> None:
        if action == "accept":
            dlv.update(Delivery.ACCEPTED)
        elif action == "reject" or action.startswith("reject:"):
            name = action.partition(":")[2] or "amqp:internal-error"
            dlv.local.condition = Condition(name, "test peer rejects")
            dlv.update(Delivery.REJECTED)
        elif action == "release":
            dlv.update(Delivery.RELEASED)
        elif action == "modify":
            dlv.local.failed = True
            dlv.local.undeliverable = False
            dlv.update(Delivery.MODIFIED)
        else:  # pragma: no cover - a test error
            raise ValueError(action)
        dlv.lg_answered = True
        if dlv.link.rcv_settle_mode == Link.RCV_FIRST:
            dlv.settle()

    def on_lg_release(self, event: Any) -> None:
        held, self.peer.held = self.peer.held, []
        for dlv in held:
            self.answer(dlv, "accept")

    def on_lg_stop(self, event: Any) -> None:
        # like a broker shutting down: close every connection, then stop
        p = self.peer
        p.acceptor.close()
        p.injector.close()
        p.stopping = True
        for c in p.open_connections:
            c.close()
        if not p.open_connections:
            p.container.stop()

    def on_transport_closed(self, event: Any) -> None:
        p = self.peer
        p.open_connections = [c for c in p.open_connections if c != event.connection]
        if p.stopping and not p.open_connections:
            p.container.stop()


class FakePeer:
    """See the module docstring. Use as a context manager."""

    def __init__(self, policy: Callable[..., str] | None = None, refuse: tuple[str, ...] = (),
                 ssl_domain: Any = None, credit: int = 10000, max_message_size: int = 0,
                 offer: tuple[str, ...] = (), end_session: dict[str, int] | None = None,
                 attach_delay_s: float = 0.0) -> None:
        self.policy = policy or (lambda peer, address, msg, n: "accept")
        self.refuse = set(refuse)
        self.ssl_domain = ssl_domain
        self.scheme = "amqps" if ssl_domain is not None else "amqp"
        self.credit = credit
        self.max_message_size = max_message_size
        self.offer = offer
        self.end_session = dict(end_session or {})
        self.attach_delay_s = attach_delay_s
        self.ended: list[Any] = []  # sessions ended here (end_session)
        self.port = free_port()
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.cond = threading.Condition()
        self.attaches: list[dict] = []
        self.detaches: list[str] = []
        self.messages: list[dict] = []
        self.connections: list[dict] = []
        self.counts: dict[Any, int] = {}
        self.held: list[Any] = []
        self.open_connections: list[Any] = []
        self.stopping = False
        self.second_step = 0
        self.ready = threading.Event()
        self.injector = EventInjector()
        self.acceptor: Any = None
        self.container = container(_Handler(self))
        self.thread = threading.Thread(target=self.container.run, daemon=True, name="fake-amqp-peer")

    def __enter__(self) -> "FakePeer":
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("fake AMQP peer did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.injector.trigger(ApplicationEvent("lg_stop"))
        self.thread.join(10)

    def release_held(self) -> None:
        self.injector.trigger(ApplicationEvent("lg_release"))

    def wait(self, predicate: Callable[["FakePeer"], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True
