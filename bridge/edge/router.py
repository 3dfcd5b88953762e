"""Which sessions get a message: subscriptions of every session, shared by
all connections of the edge. Pure memory, no I/O.

The :class:`Router` holds the one :class:`~bridge.edge.topics.SubscriptionTree`
and the sessions that have subscriptions (connected ones, and persistent
ones while they are disconnected). :meth:`Router.route` walks the tree once
per message and pushes one :class:`~bridge.edge.delivery.Delivery` per
receiving session into its :class:`~bridge.edge.delivery.Outbox`:

* **Overlapping subscriptions** of one session (MQTT 5.0 section 3.3.4):
  the edge sends **one copy**, at the maximum QoS of the matching
  subscriptions [MQTT-3.3.4-2], carrying the Subscription Identifier of
  every matching subscription that has one [MQTT-3.3.4-3, MQTT-3.3.4-4]; its
  QoS is the lower of the published QoS and that granted QoS
  [MQTT-3.8.4-8]; RETAIN stays set only if a matching subscription has
  Retain As Published [MQTT-3.3.1-13], else it is 0 for live messages
  [MQTT-3.3.1-12; 3.1.1 and the seed: MQTT-3.3.1-9];
* **No Local**: a subscription with No Local does not get the messages its
  own Client Identifier published [MQTT-3.8.3-3];
* **Shared Subscriptions** ``$share/{group}/{filter}``: each message goes to
  one session of the group, round robin, preferring connected sessions
  (MQTT 5.0 section 4.8.2); each chosen shared subscription is a copy of
  its own. On a cluster edge only the members it serves count, and the
  cluster chooses which edge gives each message (``share_choose``,
  ``bridge.edge.cluster``);
* **Disconnected persistent sessions** queue QoS 1 and 2 messages; QoS 0
  messages are not queued for them (MQTT 5.0 section 3.1.2.4: "may");
* **Authorization**: with an ACL, a session whose user may not read the
  topic is skipped (checked at delivery, so a changed ACL file applies to
  existing subscriptions).

Retained messages (issue 23) and AMQP messages (issue 24) are further
producers: anything that builds a :class:`~bridge.edge.message.Message`
can hand it to :meth:`Router.route`, or push into one session's outbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from bridge.edge.delivery import Outbox
from bridge.edge.message import Message
from bridge.edge.subscription import Sub
from bridge.edge.topics import SubscriptionTree

if TYPE_CHECKING:
    from bridge.edge.state import ClientSession

__all__ = ["Router"]


class Router:
    """Subscriptions and fan-out (see the module docstring).

    ``acl``: a callable returning the current ACL (an object with
    ``can_read(username, client_id, topic)``) or None."""

    def __init__(self, *, max_queued_messages: int = 1000, max_queued_bytes: int = 1 << 26,
                 acl: Callable[[], object | None] | None = None) -> None:
        self.tree = SubscriptionTree()
        #: Client Identifier -> session, for every session that may receive
        self.sessions: dict[str, ClientSession] = {}
        self.max_queued_messages = max_queued_messages
        self.max_queued_bytes = max_queued_bytes
        self.acl = acl
        #: deliveries dropped by the queue bound since the start, per client
        self.dropped: dict[str, int] = {}
        #: retained messages served on SUBSCRIBE (bridge.edge.retained.store;
        #: None: none are)
        self.retained = None
        #: called with the Client Identifier when a session ends (its AMQP
        #: link goes, bridge.edge.downlink)
        self.on_drop: Callable[[str], None] | None = None
        #: called with the Client Identifier after a subscription is added
        self.on_subscribe: Callable[[str], None] | None = None
        #: a cluster edge (bridge.edge.cluster): the Shared Subscription members
        #: it serves (Client Identifier -> bool), and whether it gives a
        #: message of a group to one of them, (group, message) -> bool (else the
        #: cluster chose another edge)
        self.share_here: Callable[[str], bool] | None = None
        self.share_choose: Callable[[object, Message], bool] | None = None

    # ------------------------------------------------------------ sessions
    def outbox(self, client: ClientSession) -> Outbox:
        """The session's outbox (created on first use)."""
        box = client.outbox
        if box is None:
            box = client.outbox = Outbox(self.max_queued_messages, self.max_queued_bytes)
        return box

    def attach(self, client: ClientSession) -> None:
        """A connection took the session (it may receive from now on). What
        an ended session of the same client left to sweep goes first."""
        self.tree.settle(client.client_id)
        self.sessions[client.client_id] = client

    def drop(self, client_id: str, defer: bool = False) -> list[Sub]:
        """The session ended (clean session closed, expired, replaced by a
        Clean Start, dropped by a bound): forget its subscriptions and queue.
        ``defer``: many subscriptions leave the tree in later
        ``tree.sweep()`` calls (``SubscriptionTree.remove_client``); the
        caller makes them."""
        s = self.sessions.pop(client_id, None)
        # the downlink detaches the client's own AMQP link first (it gets no
        # more credit; it stays attached until what it left unsettled is
        # settled, bridge.amqp.receiver), then the outbox releases what it
        # held, so the release reaches the peer before the link goes and the
        # message waits for the client's next link: released while the link
        # still had credit, RabbitMQ handed it straight back to that link
        # (seen under load). Whatever either raises, the session's
        # subscriptions go (the caller gets the error once, after, and logs
        # it with the session's id).
        try:
            if self.on_drop is not None:
                self.on_drop(client_id)
        finally:
            try:
                if s is not None and s.outbox is not None:
                    s.outbox.clear()
            finally:
                removed = self.tree.remove_client(client_id, defer)
        return removed

    # ------------------------------------------------------------ subscriptions
    def subscribe(self, client: ClientSession, sub: Sub) -> Sub | None:
        """Add or replace [MQTT-3.8.4-3] a subscription; returns the replaced one."""
        self.sessions[client.client_id] = client
        replaced = self.tree.add(sub)
        if self.on_subscribe is not None:
            self.on_subscribe(client.client_id)
        return replaced

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        return self.tree.remove(client_id, topic_filter) is not None

    def count(self, client_id: str) -> int:
        return self.tree.count(client_id)

    # ------------------------------------------------------------ fan-out
    def route(self, msg: Message, connected: Callable[[str], bool] = lambda cid: True
              ) -> list[ClientSession]:
        """Push ``msg`` to every session that gets it; returns those sessions
        (once each). ``connected(client_id)``: the session has a live
        connection (shared subscriptions prefer those; disconnected
        persistent sessions queue only QoS 1/2)."""
        return self.deliver(msg, self.tree.match(msg.topic), connected)

    def deliver(self, msg: Message, m, connected: Callable[[str], bool] = lambda cid: True,
                shared: bool = True) -> list[ClientSession]:
        """:meth:`route` with the tree's ``m = tree.match(msg.topic)`` done
        already (the server matches before it builds the message).
        ``shared``: False leaves the Shared Subscriptions out (a cluster
        edge's message from another edge: that edge chose their member)."""
        found = m.found
        if not found and not (m.shared and shared):
            return []
        sessions = self.sessions
        acl = self.acl() if self.acl is not None else None
        origin = msg.origin
        mqos = msg.qos
        mretain = msg.retain
        push = self._push
        out: list[ClientSession] = []
        if len(found) == 1:
            # one node's subscriptions (the usual case): each client once,
            # with one matching subscription, no grouping needed
            subs = found[0]
            for sub in ((subs,) if type(subs) is Sub else subs.values()):
                cid = sub.client_id
                s = sessions.get(cid)
                if s is None:
                    continue
                if sub.no_local and cid == origin:  # [MQTT-3.8.3-3]
                    continue
                q = sub.qos
                if push(s, msg, q if q < mqos else mqos, sub.retain_as_published and mretain,
                        () if sub.sub_id is None else (sub.sub_id,), acl, connected):
                    out.append(s)
            if not (m.shared and shared):
                return out
            seen = {s.client_id for s in out}
        else:
            seen = set()
            for cid, subs in m.direct.items():
                s = sessions.get(cid)
                if s is None:
                    continue
                if len(subs) == 1:  # one matching subscription
                    sub = subs[0]
                    if sub.no_local and cid == origin:  # [MQTT-3.8.3-3]
                        continue
                    if push(s, msg, min(sub.qos, mqos), sub.retain_as_published and mretain,
                            () if sub.sub_id is None else (sub.sub_id,), acl, connected):
                        seen.add(cid)
                        out.append(s)
                    continue
                # overlapping subscriptions: one copy at the highest QoS with
                # every Subscription Identifier (MQTT 5.0 section 3.3.4)
                qos = -1
                retain = False
                ids: list[int] = []
                for sub in subs:
                    if sub.no_local and cid == origin:  # [MQTT-3.8.3-3]
                        continue
                    if sub.qos > qos:
                        qos = sub.qos
                    if sub.retain_as_published:
                        retain = True
                    if sub.sub_id is not None:
                        ids.append(sub.sub_id)
                if qos < 0:
                    continue
                if push(s, msg, min(qos, mqos), retain and mretain, tuple(ids), acl, connected):
                    seen.add(cid)
                    out.append(s)
        here = self.share_here
        for group in (m.shared if shared else ()):
            if here is None:
                sub = group.pick(connected)
            elif not self.share_choose(group, msg):
                continue  # a cluster edge: another edge gives it to one of its members
            else:
                sub = group.pick_among(here, connected)
            if sub is None:
                continue
            s = sessions.get(sub.client_id)
            if s is None:
                continue
            ids = () if sub.sub_id is None else (sub.sub_id,)
            if self._push(s, msg, min(sub.qos, msg.qos), sub.retain_as_published and msg.retain,
                          ids, acl, connected):
                if sub.client_id not in seen:
                    seen.add(sub.client_id)
                    out.append(s)
        return out

    def deliver_group(self, msg: Message, group, connected: Callable[[str], bool] = lambda cid: True
                      ) -> ClientSession | None:
        """``msg`` to one member of the shared ``group`` that this edge serves
        (a cluster edge chosen for it, bridge.edge.cluster); the session, or
        None when none took it."""
        here = self.share_here
        sub = group.pick(connected) if here is None else group.pick_among(here, connected)
        if sub is None:
            return None
        s = self.sessions.get(sub.client_id)
        if s is None:
            return None
        acl = self.acl() if self.acl is not None else None
        ids = () if sub.sub_id is None else (sub.sub_id,)
        if self._push(s, msg, min(sub.qos, msg.qos), sub.retain_as_published and msg.retain, ids, acl,
                      connected):
            return s
        return None

    def _push(self, s: ClientSession, msg: Message, qos: int, retain: bool,
              ids: tuple[int, ...], acl, connected: Callable[[str], bool]) -> bool:
        if not s.connected and (qos == 0 or msg.sink is not None):
            # QoS 0 is not queued for a disconnected session, nor a message
            # from the AMQP topic link (bridge.edge.downlink: it would hold
            # the link's credit while the client stays away)
            return False
        if acl is not None and not acl.can_read(s.username, s.client_id, msg.topic):
            return False
        box = s.outbox
        n = (box if box is not None else self.outbox(s)).push(msg, qos, retain, ids)
        if n:
            self.dropped[s.client_id] = self.dropped.get(s.client_id, 0) + n
        return True
