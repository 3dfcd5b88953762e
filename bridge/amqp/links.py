"""Links of the forwarding engine: per target address, the seed's two
sender links, ``qos01`` (QoS 0 and 1) and ``qos2`` (QoS 2 PUBLISH and its
PUBREL), as :class:`AddressLink` (its proton sender, state, queue of
messages not yet sent and those in flight).

:class:`LinkEvents` attaches them (snd-settle-mode *unsettled*;
rcv-settle-mode *first*, or *second* for the QoS 2 link when
:func:`qos2_rcv_second` says so), hears the peer attach, refuse or detach
them, and retries a refused attach with backoff (one at a time while the
engine is *careful*, after the peer ended a session over a bad address)
until it attaches or fails its batches with the peer's error.

:class:`LinkEvents` is a part of :class:`~bridge.amqp.engine.Engine` and works on
its attributes; it runs only on the Forwarder's thread.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any

from proton import Link, Terminus

from bridge.amqp.mapping import LINK_QOS2, PROFILES
from bridge.amqp.results import ForwardError
from bridge.amqp.retry import PERMANENT_CONDITIONS, backoff, condition_text
from bridge.config import AmqpConfig

if TYPE_CHECKING:  # pragma: no cover
    from bridge.amqp.batches import Item

__all__ = ["AddressLink", "LinkEvents", "qos2_rcv_second", "rcv_mode_name", "snd_mode_name"]

log = logging.getLogger("bridge.amqp")


def qos2_rcv_second(config: AmqpConfig) -> bool:
    """Whether the QoS 2 link attaches with rcv-settle-mode *second*:
    ``amqp.qos2_rcv_settle_mode`` when it names a mode, else the profile's."""
    mode = config.qos2_rcv_settle_mode
    if mode == "profile":
        return bool(PROFILES[config.profile].qos2_rcv_settle_mode)
    return mode == "second"


class AddressLink:
    __slots__ = ("key", "address", "cls", "sender", "impl", "max_size", "state", "queue", "inflight", "last_used",
                 "not_before", "attach_failures", "attach_started", "last_condition", "name")

    def __init__(self, address: str, cls: str) -> None:
        self.key = (address, cls)
        self.address = address
        self.cls = cls
        self.sender: Any = None
        self.impl: Any = None  # the sender's pn_link_t * (reactor.send)
        self.max_size = 0  # the peer's max-message-size for the link (0: none), from its attach
        self.state = "idle"  # idle | attaching | up
        self.queue: collections.deque[Item] = collections.deque()
        self.inflight: dict[int, Item] = {}  # item.seq -> item
        self.last_used = time.monotonic()
        self.not_before = 0.0
        self.attach_failures = 0
        self.attach_started = 0.0
        self.last_condition = ""
        self.name = ""


class LinkEvents:
    """Attach, refusal, detach and flow of the engine's links (:class:`AddressLink`)."""

    def _attach(self, link: AddressLink) -> None:
        ssn = self._ensure_session()
        link.name = f"lakegate-{link.cls}-{next(self.link_seq)}:{link.address}"
        s = ssn.sender(link.name)
        s.target.address = link.address
        s.source.address = self.container_id
        s.snd_settle_mode = Link.SND_UNSETTLED
        s.rcv_settle_mode = Link.RCV_SECOND if (link.cls == LINK_QOS2 and self.qos2_rcv) else Link.RCV_FIRST
        s.open()
        link.sender = s
        link.impl = s._impl
        link.state = "attaching"
        link.attach_started = time.monotonic()
        self.by_name[link.name] = link

    def _drop_sender(self, link: AddressLink) -> None:
        if link.name:
            self.by_name.pop(link.name, None)
        link.sender = None
        link.impl = None
        link.state = "idle"
        link.name = ""

    def on_link_remote_open(self, event: Any) -> None:
        link = self.by_name.get(event.link.name)
        if link is None or link.sender is None:
            return
        s = event.link
        if s.remote_target.type == Terminus.UNSPECIFIED:
            # refused at link level (a null target): a detach with the reason follows
            return
        link.state = "up"
        link.max_size = s.remote_max_message_size or 0
        link.attach_failures = 0
        self.good.add(link.key)
        if s.rcv_settle_mode != s.remote_rcv_settle_mode:
            log.warning("AMQP peer attached %s link to %r with rcv-settle-mode %s, not %s",
                        link.cls, link.address, rcv_mode_name(s.remote_rcv_settle_mode), rcv_mode_name(s.rcv_settle_mode))
        if self.careful and not any(lk.state == "attaching" for lk in self.links.values()) \
                and all(lk.key in self.good or not lk.queue for lk in self.links.values()):
            self.careful = False
        self.dirty.add(link)

    def on_link_remote_close(self, event: Any) -> None:
        self._link_ended(event)

    def on_link_remote_detach(self, event: Any) -> None:
        self._link_ended(event)

    def _link_ended(self, event: Any) -> None:
        s = event.link
        link = self.by_name.get(s.name)
        s.close()
        if link is None:
            return
        condition = condition_text(s.remote_condition)
        was_attaching = link.state == "attaching"
        items = list(link.inflight.values())
        link.inflight.clear()
        self._drop_sender(link)
        if was_attaching:
            self._attach_failed(link, condition)
        else:
            log.warning("AMQP peer detached %s link to %r: %s", link.cls, link.address, condition)
        for item in items:
            self._fail_item(item, link, f"link detached by the peer: {condition}", requeue=False)
        self._requeue(link, [i for i in items if not i.done and i.batch.error is None])
        self.dirty.add(link)

    def _attach_failed(self, link: AddressLink, condition: str) -> None:
        link.attach_failures += 1
        link.last_condition = condition
        name = condition.split(":", 2)
        cname = ":".join(name[:2]) if len(name) >= 2 else condition
        hint = ""
        if "rcv-settle-mode" in condition or "rcv_settle_mode" in condition:
            hint = ' (this peer cannot do rcv-settle-mode second: set amqp.qos2_rcv_settle_mode = "first")'
        if cname in PERMANENT_CONDITIONS or link.attach_failures > self.cfg.max_retries:
            err = ForwardError(
                f"AMQP peer refused the {link.cls} link to address {link.address!r}: {condition}{hint} "
                f"({link.attach_failures} attempt{'s' if link.attach_failures != 1 else ''})",
                address=link.address, outcome=condition, attempts=link.attach_failures)
            for b in {i.batch for i in link.queue} | {i.batch for i in link.inflight.values()}:
                self._fail_batch(b, err)
            return
        delay = backoff(self.cfg, link.attach_failures)
        link.not_before = time.monotonic() + delay
        for b in {i.batch for i in link.queue}:
            self._trouble(b, f"the peer refused the {link.cls} link to {link.address!r}: {condition}")
        log.info("AMQP peer refused the %s link to %r: %s; retry %d/%d in %.2fs",
                 link.cls, link.address, condition, link.attach_failures, self.cfg.max_retries, delay)

    def on_link_flow(self, event: Any) -> None:
        link = self.by_name.get(event.link.name)
        if link is not None:
            self.dirty.add(link)
            self.pump()


def rcv_mode_name(m: int) -> str:
    return "second" if m == Link.RCV_SECOND else "first"


def snd_mode_name(m: int) -> str:
    return {Link.SND_UNSETTLED: "unsettled", Link.SND_SETTLED: "settled"}.get(m, "mixed")
