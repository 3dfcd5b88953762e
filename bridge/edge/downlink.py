"""AMQP -> MQTT at the edge (issue 24): messages the AMQP network sends reach
the edge's subscribers, with the seed's dispositions
(``../shared/seeds/001_4f7e894452682fb7.txt``, "From AMQP network to MQTT
client").

One :class:`~bridge.amqp.receiver.DownlinkReceiver` (its own proton
thread) receives on

* **each connected client's own address**, ``amqp.client_address_template``
  (the seed's ``$mqtt.to.{client_id}``; ``/queue/mqtt.to.{client_id}`` on
  RabbitMQ 3.x), attached when the client connects with credit = its
  in-flight window (MQTT 5 Receive Maximum, else
  ``edge.max_inflight_messages``), with a durable terminus for every
  session (RabbitMQ 3.x declares the queue at the first attach with that
  durability and then refuses an attach that differs, so a client seen
  first with a clean session could never have its persistent one's link;
  and a durable queue keeps a command across a restart of the peer). A
  persistent session keeps its link while the client is away (what arrives
  on the remaining credit waits in its queue, QoS 1/2 only, and what is
  beyond the credit waits at the peer); a clean session's link is detached
  when the connection ends, and whatever of it is unsettled is released
  (the peer delivers it again to the next link). A message there goes to
  the client if one of its subscriptions matches its topic (QoS = min(the
  message's, the granted), the subscriptions' identifiers, RETAIN per
  Retain As Published), else it is rejected (``LG-amqp-no-subscription``):
  the edge never sends a client a PUBLISH it did not subscribe to;
* **one topic link per edge**, ``amqp.downlink_topic_address`` (RabbitMQ:
  ``/topic/#``, every message sent to ``amq.topic``), credit
  ``amqp.downlink_credit``: a message goes to every *connected* session
  whose subscriptions match, through the same :class:`~bridge.edge.router.Router`
  rules as a captured PUBLISH (overlapping subscriptions, No Local does not
  apply: the origin is not an MQTT client, Shared Subscriptions, ACL). No
  match: rejected (``LG-amqp-no-subscription``; released would make
  RabbitMQ hand it straight back). Why one link and matching at the edge,
  not one link per filter: see ARCHITECTURE.md.

**Dispositions** (the seed): QoS 0 -- accepted once routed (the sender
usually pre-settles it); QoS 1 -- accepted when every copy's PUBACK came;
QoS 2 -- accepted when every copy's PUBREC came, then the AMQP side sends
AMQP_PUBREL (``subject`` "pubrel", the same ``message-id``), the edge sends
PUBREL to each client, and accepts the AMQP_PUBREL when every PUBCOMP came
(``amqp.downlink_pubrel = "edge"``: the edge sends PUBREL at PUBREC itself,
for producers that never send AMQP_PUBREL; a QoS 2 message without a
``message-id`` is handled so too, nothing could name it). A copy that ends
without its acknowledgement (the client's clean session ended, the queue
bound dropped it) **releases** the delivery: the peer delivers it again,
never accepted for what was not delivered. An expired message (its ``ttl``
passed, [MQTT-3.3.2-5]) and one larger than a client's Maximum Packet Size
[MQTT-3.1.2-25] end as the standard ends them, and count as done. A
message lakegate forwarded itself (it carries ``lakegate-id``) is accepted
and dropped: the edge delivered it from its capture log already. A message
no MQTT PUBLISH can be made of is rejected with the rule that says why
(``LG-amqp-no-topic``, ``LG-amqp-body``, ``LG-amqp-qos``); the link stays.

None of this is captured: the AMQP peer holds a message until it is
accepted, so an edge crash loses nothing (what was unsettled is delivered
again). Packet Identifiers of these deliveries are taken outside the
captured numbering (:mod:`bridge.edge.delivery`).
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

from bridge.amqp.receiver import DownlinkReceiver
from bridge.amqp.reverse import OWN, Downlink, ReverseMappingError, text_of
from bridge.config import AmqpConfig
from bridge.edge.actions import Send
from bridge.edge.delivery import RECEIVED
from bridge.edge.message import Message
from bridge.edge.subscription import split_share
from bridge.mqtt.properties import Properties, Scope, encode_properties
from bridge.peers import PEERS
from bridge.topic_filter import matches

if TYPE_CHECKING:
    from bridge.edge.connection import Connection

__all__ = ["DownlinkHub", "NO_SUBSCRIPTION", "PUBREL_UNKNOWN", "Pending"]

log = logging.getLogger("bridge.edge.downlink")

NO_SUBSCRIPTION = "LG-amqp-no-subscription"
#: an AMQP_PUBREL whose message-id no QoS 2 message delivered here awaits
PUBREL_UNKNOWN = "LG-amqp-pubrel-unknown"
#: QoS 2 messages remembered for their AMQP_PUBREL, at most (the oldest go)
_MAX_AWAITING = 100_000


def _id_text(message_id: Any) -> str:
    """A message-id for a log line or a description: its value, not a repr."""
    return "none" if message_id is None else repr(text_of(message_id)[:128])


class Pending:
    """One AMQP delivery on its way to MQTT: settled once every QoS 1/2 copy
    ended (``end`` is called by the outboxes, ``bridge.edge.delivery``)."""

    __slots__ = ("hub", "token", "copies", "failed", "routed", "peer_pubrel", "clients", "msg",
                 "key", "settled")

    def __init__(self, hub: DownlinkHub, token: Any, peer_pubrel: bool = False,
                 key: str | None = None) -> None:
        self.hub = hub
        self.token = token
        self.copies = 0
        self.failed = False
        self.routed = False
        self.peer_pubrel = peer_pubrel
        self.clients: list[str] = []
        self.msg: Message | None = None
        self.key = key
        self.settled = False

    def end(self, d, ok: bool) -> None:
        self.copies -= 1
        if not ok:
            self.failed = True
        if self.copies <= 0 and self.routed:
            self.hub.finish(self)


def _props_block(dl: Downlink) -> bytes:
    """The MQTT 5 property block (without its length) of a downlink message."""
    props = Properties(payload_format_indicator=dl.payload_format_indicator,
                       message_expiry_interval=dl.expiry, content_type=dl.content_type,
                       response_topic=dl.response_topic, correlation_data=dl.correlation_data,
                       user_properties=dl.user_properties)
    if not props:
        return b""
    raw = encode_properties(props, Scope.PUBLISH)
    pos = 0
    while raw[pos] & 0x80:  # skip the Property Length
        pos += 1
    return raw[pos + 1:]


class DownlinkHub:
    """The edge's AMQP -> MQTT side (see the module docstring). Every method
    runs on the server's event loop; the receiver's thread hands over."""

    def __init__(self, server, config: AmqpConfig) -> None:
        self.server = server
        self.cfg = config
        self.loop = server.loop
        self.rx = DownlinkReceiver(config, self._from_thread,
                                   container_id=f"{config.container_id}-downlink")
        #: client address -> Client Identifier (links attached)
        self.client_of: dict[str, str] = {}
        #: QoS 2 message-id -> its Pending, awaiting AMQP_PUBREL (seed flow)
        self.awaiting: dict[str, Pending] = {}
        #: received on the receiver's thread, not yet handled on the loop
        self._inbox: collections.deque = collections.deque()
        self.stats = {"delivered": 0, "rejected": 0, "released": 0, "own": 0, "expired": 0,
                      "pubrel": 0}

    # ------------------------------------------------------------ life
    def start(self) -> None:
        self.rx.start()
        address = self.cfg.downlink_topic_address
        if address:
            # a queue of the operator's own is durable; a subscription the peer
            # makes for the link (RabbitMQ's /topic/ and /exchange/ queues,
            # server-named; Artemis's topic:// subscriptions, named by the
            # link) is not: durable, it would outlive the edge as litter
            made = PEERS[self.cfg.peer].subscription_prefixes
            self.rx.attach(address, credit=self.cfg.downlink_credit, durable=not address.startswith(made))
        log.info("AMQP downlink: receiving from %s (topic link %s, client addresses %s)",
                 self.rx.url, self.cfg.downlink_topic_address or "none",
                 self.cfg.client_address_template or "none")

    def stop(self) -> None:
        self.rx.stop()

    def address_of(self, client_id: str) -> str:
        return self.cfg.client_address_template.format(client_id=client_id)

    def connected(self, conn: Connection) -> None:
        """A client's connection was accepted: receive on its own address
        once it has a subscription (a persistent session's link may still
        be attached)."""
        if self.server.router.count(conn.session.client_id):
            self._attach(conn)

    def subscribed(self, client_id: str) -> None:
        """A subscription was added: a connected client's address is received from."""
        conn = self.server.clients.get(client_id)
        if conn is not None:
            self._attach(conn)

    def _attach(self, conn: Connection) -> None:
        if not self.cfg.client_address_template:
            return
        cid = conn.session.client_id
        address = self.address_of(cid)
        if self.client_of.get(address) == cid:
            return  # a persistent session's link, kept while it was away
        self.client_of[address] = cid
        window = conn.session.receiver().receive_maximum
        # durable for clean sessions too: see the module docstring
        self.rx.attach(address, credit=window, durable=True)

    def session_ended(self, client_id: str) -> None:
        """The session ended: stop receiving on its address. Called before
        its outbox is cleared, so the link gets no more credit before what
        it left unsettled is released; the receiver keeps it attached until
        those releases are sent, then detaches it (a disposition cannot
        follow the detach: the peer would never see them,
        ``DownlinkReceiver``, "Detach"). What arrives on it meanwhile is
        released."""
        if not self.cfg.client_address_template:
            return
        address = self.address_of(client_id)
        if self.client_of.pop(address, None) is not None:
            self.rx.detach(address)

    # ------------------------------------------------------------ messages
    def _from_thread(self, address: str, result: Any, token: Any) -> None:
        # one hand-over to the loop per burst, not per message
        inbox = self._inbox
        inbox.append((address, result, token))
        if len(inbox) == 1:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        inbox = self._inbox
        touched: dict = {}
        while inbox:
            address, result, token = inbox.popleft()
            self._on_message(address, result, token, touched)
        self.server._pump_all(touched.values())

    def _settle(self, token: Any, outcome: str, condition: str | None = None,
                description: str | None = None) -> None:
        self.rx.settle(token, outcome, condition, description)

    def _on_message(self, address: str, result: Any, token: Any, touched: dict) -> None:
        if result is OWN:
            self.stats["own"] += 1
            self._settle(token, "accepted")  # delivered from the capture log already
            return
        if isinstance(result, ReverseMappingError):
            self.stats["rejected"] += 1
            log.warning("AMQP downlink: message on %s rejected [%s]: %s", address, result.rule,
                        str(result)[:512])
            self._settle(token, "rejected", "amqp:decode-error", str(result))
            return
        dl: Downlink = result
        if dl.pubrel:
            self._pubrel(address, dl, token)
            return
        if dl.expired:
            self.stats["expired"] += 1  # consumed, and dropped as MQTT drops it [MQTT-3.3.2-5]
            self._settle(token, "accepted")
            return
        cid = self.client_of.get(address)
        if cid is None and address != self.cfg.downlink_topic_address:
            # a client address whose link is going (the client left): the
            # peer keeps it for the next link on that address
            self.stats["released"] += 1
            self._settle(token, "released")
            return
        key = None if dl.message_id is None else str(dl.message_id)
        peer = dl.qos == 2 and self.cfg.downlink_pubrel == "peer" and key is not None
        p = Pending(self, token, peer, key)
        msg = Message.from_properties(dl.topic, dl.qos, dl.retain, dl.payload, _props_block(dl),
                                      origin="", received=self.loop.time(), ready=True)
        msg.sink = p
        p.msg = msg
        if cid is not None:
            targets = self._to_client(cid, msg)
        else:
            targets = self._to_topic(msg)
        p.routed = True
        if not targets:
            self.stats["rejected"] += 1
            where = f"client {cid}" if cid is not None else "this edge"
            # brokers that dead-letter a rejected message drop its reason:
            # the operator sees it here, once per rejection (no payload)
            log.warning("AMQP downlink: message on %s rejected [%s]: no subscription of %s matches "
                        "topic %r (QoS %d, %d bytes, message-id %s)", address, NO_SUBSCRIPTION, where,
                        dl.topic, dl.qos, len(dl.payload), _id_text(dl.message_id))
            self._settle(token, "rejected", "amqp:not-found",
                         f"[{NO_SUBSCRIPTION}] no subscription of {where} matches topic "
                         f"{dl.topic!r}")
            return
        p.clients = [s.client_id for s in targets]
        self.stats["delivered"] += 1
        if p.copies <= 0:
            self.finish(p)  # QoS 0 copies only: done once routed
        for t in targets:
            touched[id(t)] = t

    def _to_client(self, cid: str, msg: Message) -> list:
        """Push ``msg`` to client ``cid`` per its matching subscriptions."""
        router = self.server.router
        s = router.sessions.get(cid)
        if s is None:
            return []
        qos = -1
        rap = False
        ids = []
        for sub in router.tree.subscriptions(cid):
            if matches(split_share(sub.topic_filter)[1], msg.topic):
                qos = max(qos, sub.qos)
                rap = rap or sub.retain_as_published
                if sub.sub_id is not None:
                    ids.append(sub.sub_id)
        if qos < 0:
            return []
        if not s.connected and min(qos, msg.qos) == 0:
            return []  # QoS 0 is not queued for a disconnected session
        acl = router.acl() if router.acl is not None else None
        if acl is not None and not acl.can_read(s.username, cid, msg.topic):
            return []
        n = router.outbox(s).push(msg, min(qos, msg.qos), rap and msg.retain, tuple(ids))
        if n:
            router.dropped[cid] = router.dropped.get(cid, 0) + n
        return [s]

    def _to_topic(self, msg: Message) -> list:
        router = self.server.router
        m = router.tree.match(msg.topic)
        if not m:
            return []
        # connected sessions only: an offline session would hold the topic
        # link's credit for as long as it stays away (its own address keeps
        # what is meant for it)
        return router.deliver(msg, m, self.server._connected)

    def finish(self, p: Pending) -> None:
        """Every copy of ``p`` ended: settle its AMQP delivery."""
        if p.settled:
            return
        p.settled = True
        if log.isEnabledFor(logging.DEBUG):
            log.debug("AMQP downlink: delivery %s, topic %s, %d bytes, to %s",
                      "released" if p.failed else "accepted",
                      p.msg.topic if p.msg is not None else "-",
                      p.msg.size if p.msg is not None else 0, ",".join(p.clients) or "-")
        if p.failed:
            self.stats["released"] += 1
            self._settle(p.token, "released")
            return
        self._settle(p.token, "accepted")
        if p.peer_pubrel and p.key is not None and p.msg is not None:
            self.awaiting[p.key] = p
            if len(self.awaiting) > _MAX_AWAITING:
                self.awaiting.pop(next(iter(self.awaiting)))

    # ------------------------------------------------------------ QoS 2
    def _pubrel(self, address: str, dl: Downlink, token: Any) -> None:
        """AMQP_PUBREL: PUBREL to every client whose copy of that message
        got its PUBREC; accepted when every PUBCOMP came."""
        key = None if dl.message_id is None else str(dl.message_id)
        first = self.awaiting.pop(key, None) if key is not None else None
        if first is None:
            self.stats["rejected"] += 1
            log.warning("AMQP downlink: AMQP_PUBREL on %s rejected [%s]: no QoS 2 message with "
                        "message-id %s awaits it here (topic %r)", address, PUBREL_UNKNOWN,
                        _id_text(dl.message_id), dl.topic)
            self._settle(token, "rejected", "amqp:not-found",
                         f"[{PUBREL_UNKNOWN}] no QoS 2 message with message-id "
                         f"{_id_text(dl.message_id)} awaits AMQP_PUBREL here")
            return
        self.stats["pubrel"] += 1
        p = Pending(self, token)
        msg = first.msg
        msg.sink = p
        router = self.server.router
        for cid in first.clients:
            s = router.sessions.get(cid)
            box = s.outbox if s is not None else None
            if box is None:
                continue
            for pid, d in list(box.inflight.items()):
                if d.msg is msg and d.state == RECEIVED:
                    box.release(pid)
                    p.copies += 1
                    conn = self.server.clients.get(cid)
                    if conn is not None and conn.transport is not None:
                        self.server.perform(conn, [Send(bytes((0x62, 2)) + pid.to_bytes(2, "big"))])
        p.routed = True
        if p.copies <= 0:
            self.finish(p)

