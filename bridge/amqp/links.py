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

**Links bounded (issue 39).** A link per topic does not scale: 200,000
retained topics opened 200,000 links, RabbitMQ stopped answering attaches
and stopping took 54 s. At most ``amqp.max_links`` sender links are open
(attaching or attached) on the connection. An :class:`AddressLink` is then
a *lane*: the queue and the messages in flight of one (address, class),
which keeps the order guarantees as before (per address, across its two
classes); only a lane with a proton link of its own counts. A lane that
needs a link when the bound is reached takes the slot of the least
recently used link that is idle (nothing queued, nothing in flight), which
is detached first (``Engine.idle``: links in the order they went idle, i.e.
their last message was settled; one that is used again goes to the end
when it is idle again). When
none is idle the lane *waits* (``Engine.waiting``, first come first
served): its messages stay queued, nothing is dropped or reordered, and it
gets the next link that becomes idle. One exception keeps this free of
deadlock: a link with messages queued but none in flight whose next message
waits for its address's other lane, and that lane waits for a slot, counts
as idle (its messages stay queued in its lane; it attaches again later).
After the peer ended a session with several links attaching (the engine is
*careful*), the lanes waiting are still served, one link not known good
attaching at a time, the suspects first; careful ends once each suspect
attached alone or gave up. There is no unbounded setting (``amqp.max_links`` >= 2: an address's two
links must fit together): unbounded is the failure the bound is for.

**The anonymous relay.** A peer that offers ``ANONYMOUS-RELAY`` in its open
frame takes messages on a link with a null target address and routes each
by its ``to`` (AMQP 1.0 part 2.6.7 and the Anonymous Terminus for Message
Routing extension). Then every lane of a class rides one relay link
(:attr:`AddressLink.via`): two links in all, whatever the number of topics.
The seed's mapping sets ``to`` to the MQTT topic *verbatim*
(``bridge.amqp.mapping``), while the link's target is the address made by
``amqp.address_template``; on the relay the ``to`` *is* the address, so the
two may only differ on a named link. Hence ``amqp.anonymous_relay``:

* ``"auto"`` (default): the relay only when the peer offers it **and** the
  template is ``{topic}``, i.e. when ``to`` already is the address. The
  messages are then the same bytes on either path; a consumer never sees a
  difference. With any other template (RabbitMQ's ``/topic/{routing_key}``,
  Artemis' ``topic://{routing_key}``) it uses bounded links, because
  routing by a ``to`` holding the topic would deliver to the wrong node.
* ``"on"``: the relay whenever the peer offers it, whatever the template;
  on it each message's ``to`` is set to its target address (the spec's
  meaning of ``to``), *not* the topic: a consumer then reads the address
  there (for ``{routing_key}`` templates the topic's ``/`` become ``.``).
  The operator opts into that difference from the seed's mapping.
* ``"off"``: never; a link per address, bounded.

A peer that does not offer the relay (RabbitMQ 3.x) gets bounded links in
every mode (``"on"`` logs a WARNING once per connection). A peer that
offered it but refuses the relay's attach is used with links until the
next connection.

:class:`LinkEvents` is a part of :class:`~bridge.amqp.engine.Engine` and works on
its attributes; it runs only on the Forwarder's thread.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Any

from proton import Link, Terminus, symbol

from bridge.amqp.mapping import LINK_QOS01, LINK_QOS2, PROFILES
from bridge.amqp.reactor import release
from bridge.amqp.results import ForwardError
from bridge.amqp.retry import PERMANENT_CONDITIONS, backoff, condition_text
from bridge.config import AmqpConfig

if TYPE_CHECKING:  # pragma: no cover
    from bridge.amqp.batches import Item

__all__ = ["ANONYMOUS_RELAY", "AddressLink", "LinkEvents", "qos2_rcv_second", "rcv_mode_name", "relay_choice",
           "snd_mode_name"]

log = logging.getLogger("bridge.amqp")


#: The connection capability of a peer that routes messages sent on a link with a null target by their ``to``.
ANONYMOUS_RELAY = symbol("ANONYMOUS-RELAY")


def relay_choice(config: AmqpConfig, offered: Any) -> tuple[bool, bool, str]:
    """(use the anonymous relay, set each message's ``to`` to its address on
    it, why) for a peer that offered the connection capabilities ``offered``
    (its open frame's, None: none), by ``amqp.anonymous_relay`` (module doc)."""
    mode = config.anonymous_relay
    verbatim = config.address_template == "{topic}"
    has = bool(offered) and ANONYMOUS_RELAY in list(offered)
    if mode == "off":
        return False, False, "amqp.anonymous_relay is off"
    if not has:
        return False, False, "the peer does not offer ANONYMOUS-RELAY"
    if mode == "auto" and not verbatim:
        return False, False, (f"the peer offers ANONYMOUS-RELAY, but amqp.address_template is "
                              f"{config.address_template!r}, not '{{topic}}': on the relay a message's 'to' "
                              "must be its address and the mapping's 'to' is the topic "
                              '(amqp.anonymous_relay = "on" sets it to the address)')
    why = "the peer offers ANONYMOUS-RELAY"
    if not verbatim:
        why += "; each message's 'to' is its address (amqp.anonymous_relay = on)"
    return True, not verbatim, why


def qos2_rcv_second(config: AmqpConfig) -> bool:
    """Whether the QoS 2 link attaches with rcv-settle-mode *second*:
    ``amqp.qos2_rcv_settle_mode`` when it names a mode, else the profile's."""
    mode = config.qos2_rcv_settle_mode
    if mode == "profile":
        return bool(PROFILES[config.profile].qos2_rcv_settle_mode)
    return mode == "second"


class AddressLink:
    """One (address, class): its queue and messages in flight (a *lane*), and
    its own sender link, or the anonymous relay's (:attr:`via`). A relay link
    is an AddressLink too, with address ``""`` (a null target) and the lanes
    it carries in :attr:`lanes`."""

    __slots__ = ("key", "address", "cls", "sender", "impl", "max_size", "state", "queue", "inflight", "last_used",
                 "not_before", "attach_failures", "attach_started", "last_condition", "name", "via", "lanes",
                 "blocked", "pending0")

    def __init__(self, address: str, cls: str, relay: bool = False) -> None:
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
        #: a lane on the anonymous relay: the relay link carrying it (its sender, state, credit)
        self.via: AddressLink | None = None
        #: a relay link: the lanes it carries (None: not a relay)
        self.lanes: set[AddressLink] | None = set() if relay else None
        #: a relay link: lanes that stopped for its credit or its attach (woken by its flow)
        self.blocked: set[AddressLink] | None = set() if relay else None
        #: QoS 0 deliveries sent on it whose disposition has not come (keys into Engine.deliveries)
        self.pending0: set[int] = set()


class LinkEvents:
    """Attach, refusal, detach and flow of the engine's links (:class:`AddressLink`)."""

    def _attach(self, link: AddressLink) -> None:
        ssn = self._ensure_session()
        relay = link.lanes is not None
        link.name = f"lakegate-{link.cls}-{next(self.link_seq)}:{'(anonymous relay)' if relay else link.address}"
        s = ssn.sender(link.name)
        s.target.address = None if relay else link.address  # the relay: a target with no address
        s.source.address = self.container_id
        s.snd_settle_mode = Link.SND_UNSETTLED
        s.rcv_settle_mode = Link.RCV_SECOND if (link.cls == LINK_QOS2 and self.qos2_rcv) else Link.RCV_FIRST
        s.open()
        link.sender = s
        link.impl = s._impl
        link.state = "attaching"
        link.attach_started = time.monotonic()
        self.by_name[link.name] = link
        self.attaches += 1
        self.open_links += 1
        if self.open_links > self.peak_links:
            self.peak_links = self.open_links

    def _drop_sender(self, link: AddressLink, ended: bool = True) -> None:
        """``link`` has no sender any more: ``ended`` (closed by the peer, or
        gone with its session or connection), or detached here and counted
        open until the peer's detach comes (``Engine.closing``: the peer never
        holds more than ``amqp.max_links`` of ours, those it is tearing down
        included); a lane on the relay leaves it. QoS 0 deliveries still held
        for it are let go (their disposition will not come)."""
        if link.name:
            self.by_name.pop(link.name, None)
        if link.sender is not None:
            if ended:
                self.open_links -= 1
                self.detaches += 1
            else:
                self.closing[link.name] = time.monotonic()
            self.idle.pop(link, None)
        if link.pending0:
            deliveries = self.deliveries
            for key in link.pending0:
                entry = deliveries.pop(key, None)
                if entry is not None:
                    release(entry[0])
            link.pending0.clear()
        via = link.via
        if via is not None:
            via.lanes.discard(link)
            via.blocked.discard(link)
            link.via = None
        link.sender = None
        link.impl = None
        link.state = "idle"
        link.name = ""

    # ---------------------------------------------------------- the bound
    def _close_link(self, link: AddressLink, why: str) -> None:
        """Detach ``link`` (its own sender) and forget its sender; it counts
        as open until the peer's detach comes."""
        log.debug("AMQP detaching %s %s link to %r", why, link.cls, link.address)
        s = link.sender
        self._drop_sender(link, ended=False)
        if s is not None:
            s.close()

    def _forget_closing(self) -> None:
        """The session or connection is gone, and with it the links detached
        here whose detach the peer had not answered."""
        n = len(self.closing)
        self.open_links -= n
        self.detaches += n
        self.closing.clear()

    def _sibling(self, link: AddressLink) -> "AddressLink | None":
        return self.links.get((link.address, LINK_QOS2 if link.cls == LINK_QOS01 else LINK_QOS01))

    def _evictable(self, link: AddressLink) -> bool:
        """Idle (nothing queued, nothing in flight), or nothing in flight and
        its next message waits for its address's other lane, which has no
        link (the module doc: so that a full bound never deadlocks)."""
        if link.inflight or link.state != "up":  # (QoS 0 not settled yet does not keep it: never awaited)
            return False
        head = self._head(link)
        if head is None:
            return True
        sib = self._sibling(link)
        if sib is None or sib.sender is not None or sib.via is not None:
            return False
        sh = self._head(sib)
        return sh is not None and sh.seq < head.seq

    def _went_idle(self, link: AddressLink) -> None:
        """``link`` has nothing in flight now: the most recently used of the
        idle links (``Engine.idle``; whether it is evictable is checked when
        one is needed)."""
        if link.sender is not None and link.via is None and link.lanes is None:  # not the relay
            idle = self.idle
            idle[link] = None
            idle.move_to_end(link)

    def _evict_one(self) -> bool:
        """Detach the least recently used evictable link (``Engine.idle``,
        the order links went idle in; an entry busy again or gone is let go:
        it comes back when it is idle again); False when none is."""
        idle = self.idle
        victim = None
        while idle:
            link, _ = idle.popitem(last=False)
            if link.sender is not None and link.via is None and self._evictable(link):
                victim = link
                break
        if victim is None:
            return False
        self.evictions += 1
        self._close_link(victim, "least recently used")
        if victim.queue:  # waited for its other lane: waits for a link in turn
            self._wait_for_link(victim)
        elif self.links.get(victim.key) is victim:
            del self.links[victim.key]
        return True

    def _serve_waiting(self, dirty: set[AddressLink], now: float) -> None:
        """Give the lanes waiting for a link (first come first served) the
        slots free now; for those still waiting, detach as many idle links
        (least recently used first) as the detaches under way do not cover
        already: a slot is free once the peer answered the detach."""
        waiting = self.waiting
        later = 0  # lanes moved to the end (an attach backing off): each looked at once
        while waiting and later < len(waiting):
            lane = next(iter(waiting))
            if self.links.get(lane.key) is not lane or self._head(lane) is None or lane.sender is not None \
                    or lane.via is not None:
                waiting.popitem(last=False)
                continue
            if self.relay_on:
                waiting.popitem(last=False)
                dirty.add(lane)
                continue
            if self.careful and lane.key not in self.good and self._attaching():
                break  # careful: one link not known good attaching at a time (it may be the bad one)
            if now < lane.not_before:
                waiting.move_to_end(lane)
                later += 1
                continue
            if self.open_links >= self.max_links:
                break
            waiting.popitem(last=False)
            self._attach(lane)
            dirty.add(lane)
        need = min(len(waiting), 1 if self.careful else self.max_links) - len(self.closing)
        while need > 0 and self._evict_one():
            need -= 1

    def _attaching(self) -> bool:
        """A link of its own is attaching (careful mode's one at a time)."""
        return any(lk.state == "attaching" and lk.via is None for lk in self.links.values())

    def _careful_check(self) -> None:
        """Careful mode ends once no suspect is left to try: each attached
        alone (good) or has nothing left to send (its batch failed, or its
        messages went)."""
        links = self.links
        for key in self.suspects:
            lane = links.get(key)
            if key not in self.good and lane is not None and self._head(lane) is not None:
                return
        log.info("AMQP every link suspected when the peer ended the session attached again or gave up: "
                 "links attach in parallel again")
        self.careful = False
        self.suspects = set()
        self.dirty.update(lk for lk in links.values() if lk.queue and lk not in self.waiting)

    def _wait_for_link(self, lane: AddressLink) -> None:
        """No slot for ``lane`` now: it waits for one (its messages stay queued)."""
        if lane not in self.waiting:
            self.waiting[lane] = None
            sib = self._sibling(lane)
            if sib is not None and sib.sender is not None and not sib.inflight:
                self._went_idle(sib)  # it may be waiting for this lane: evictable then

    # ---------------------------------------------------------- the anonymous relay
    def _bind(self, lane: AddressLink) -> None:
        """Carry ``lane`` on the relay link of its class (attached now if needed)."""
        relay = self.relays.get(lane.cls)
        if relay is None:
            relay = self.relays[lane.cls] = AddressLink("", lane.cls, relay=True)
        if relay.sender is None:
            self._attach(relay)
        lane.via = relay
        lane.state = "relay"  # its sender's state is the relay's
        relay.lanes.add(lane)

    def _relay_ended(self, relay: AddressLink, condition: str, refused: bool) -> None:
        """The relay link ``relay`` is gone: its lanes leave it; what they had
        in flight goes again (a failed attempt unless ``refused``: then the
        peer would not have the relay at all, and this connection uses links
        from now on)."""
        lanes = list(relay.lanes)
        self._drop_sender(relay)
        if self.relays.get(relay.cls) is relay:
            del self.relays[relay.cls]
        if refused and self.relay_on:
            self.relay_on = False
            log.warning("AMQP peer refused the anonymous relay link (%s): %s; using a link per address "
                        "(at most amqp.max_links = %d) on this connection", relay.cls, condition, self.max_links)
        for lane in lanes:
            items = list(lane.inflight.values())
            lane.inflight.clear()
            self._drop_sender(lane)
            for item in items:
                if refused:
                    self._forget(item)
                else:
                    self._fail_item(item, lane, f"anonymous relay link ended: {condition}", requeue=False)
            self._requeue(lane, [i for i in items if not i.done and i.batch.error is None])
            self.dirty.add(lane)

    def _drop_relays(self) -> None:
        """The connection or session is gone: so are the relay links (their
        lanes' messages in flight are the caller's to requeue)."""
        for relay in list(self.relays.values()):
            for lane in list(relay.lanes):
                self._drop_sender(lane)
            self._drop_sender(relay)
        self.relays.clear()

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
        if not link.inflight:
            self._went_idle(link)  # its batch may have ended while it attached, or it waits for its other lane
        if link.lanes is not None:  # the relay: its lanes may send now
            log.info("AMQP anonymous relay link (%s) attached: every address of the class goes over it", link.cls)
            self.dirty.update(link.lanes)
            link.blocked.clear()
            return
        self.good.add(link.key)
        if s.rcv_settle_mode != s.remote_rcv_settle_mode:
            log.warning("AMQP peer attached %s link to %r with rcv-settle-mode %s, not %s",
                        link.cls, link.address, rcv_mode_name(s.remote_rcv_settle_mode), rcv_mode_name(s.rcv_settle_mode))
        if self.careful:
            self._careful_check()
        self.dirty.add(link)

    def on_link_remote_close(self, event: Any) -> None:
        self._link_ended(event)

    def on_link_remote_detach(self, event: Any) -> None:
        self._link_ended(event)

    def _link_ended(self, event: Any) -> None:
        s = event.link
        name = s.name
        link = self.by_name.get(name)
        s.close()
        condition = condition_text(s.remote_condition)
        # closed at both ends now: proton lets go of it. Kept, every link ever attached stayed in its
        # session, and each attach the peer answered was looked up among them by name: with a link per
        # topic, each 20,000 topics more cost 6 s more CPU per 20,000 messages
        s.free()
        if link is None:
            if name in self.closing:  # the peer's answer to our detach: the slot is free now
                del self.closing[name]
                self.open_links -= 1
                self.detaches += 1
                if self.waiting:
                    self.pump()
            return
        if link.lanes is not None:
            refused = link.state == "attaching"
            if not refused:
                log.warning("AMQP peer detached the anonymous relay link (%s): %s", link.cls, condition)
            self._relay_ended(link, condition, refused)
            return
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
            if link.lanes is not None:  # the relay: the lanes that stopped for its credit go on
                if link.blocked:
                    self.dirty.update(link.blocked)
                    link.blocked.clear()
            else:
                self.dirty.add(link)
            self.pump()


def rcv_mode_name(m: int) -> str:
    return "second" if m == Link.RCV_SECOND else "first"


def snd_mode_name(m: int) -> str:
    return {Link.SND_UNSETTLED: "unsettled", Link.SND_SETTLED: "settled"}.get(m, "mixed")
