"""What differs between AMQP 1.0 peers, as data: one :class:`Peer` per kind
(``amqp.peer``), read in both directions (forwarding and the downlink).

The forward mapping is the seed's whatever the peer (``bridge.amqp.mapping``);
what a peer changes is where messages go and what an address may hold:

* the address forms: a topic address (``amqp.address_template``), a
  client's own address (``amqp.client_address_template``), the edge's one
  topic link (``amqp.downlink_topic_address``). A key the user did not set
  (not in ``cfg.sources``) takes the peer's value when the configuration is
  loaded (``bridge.config``), so ``amqp.peer = "artemis"`` alone is a
  working setting;
* ``refuse`` (``amqp.address_refuse``): text that a topic must not hold
  once it is part of an address, because the peer gives it a meaning: a
  wildcard, a list of destinations, a queue name. A topic holding one is
  never split or re-routed: forwarding quarantines the message and the
  downlink rejects it [LG-amqp-address-chars] (``bridge.amqp.addresses.refused_in``).
  A ``.`` stays a word separator under ``{routing_key}``, as RabbitMQ's own
  MQTT plugin has it (``a.b`` and ``a/b`` are one routing key);
* ``property_refuse`` (``amqp.property_refuse``): prefixes of User
  Property names the peer reads as orders; such a message is quarantined
  [LG-amqp-reserved-property] (``bridge.amqp.addresses.reserved_property``);
* facts the operator needs and the code reports (rcv-settle-mode second,
  the anonymous relay, what the peer keeps while the edge is away, how it
  reports a rejected message), shown in the peer table of docs/amqp.md
  (:func:`peer_table_markdown`).

This module imports nothing of lakegate: ``bridge.config`` (below every
layer) reads it to fill in the peer's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PEERS", "Peer", "peer_table_markdown"]


@dataclass(frozen=True)
class Peer:
    """One kind of AMQP 1.0 peer (see the module docstring)."""

    name: str
    #: what it is, for the table
    title: str
    address_template: str
    client_address_template: str
    downlink_topic_address: str
    #: space-separated text a topic must not hold in an address (``amqp.address_refuse``)
    refuse: str
    #: rcv-settle-mode second on a sender link (the QoS 2 link of the enmasse profile)
    rcv_settle_second: str
    #: one sending link with each message's address in ``to``
    anonymous_relay: str
    #: what the peer keeps for the edge while it is away
    keeps: str
    #: what a consumer finds in ``to`` (the forward mapping puts the topic there)
    to_on_delivery: str
    #: what becomes of a message the edge rejects
    rejected: str
    #: address prefixes of a topic link the peer makes a subscription for,
    #: attached with a volatile terminus: durable, it would outlive the edge
    #: (Artemis: a durable subscription per link name, never removed)
    subscription_prefixes: tuple[str, ...] = ()
    #: topic links refused at start: they would receive the edge's own
    #: rejections back from the dead-letter address, for ever
    looping_topic_links: tuple[str, ...] = ()
    #: a producer's ``to`` may be an address of ``amqp.address_template``
    #: rather than the topic (the anonymous relay routes by it): read back
    #: through the template when it has the template's form
    to_may_be_address: bool = False
    #: space-separated prefixes of application property names the peer reads as
    #: orders (``amqp.property_refuse``): a User Property so named is refused
    property_refuse: str = ""
    #: what else the operator must know
    note: str = "-"


PEERS: dict[str, Peer] = {
    "rabbitmq": Peer(
        name="rabbitmq",
        title="RabbitMQ 3.x, AMQP 1.0 plugin",
        address_template="/topic/{routing_key}",
        client_address_template="/queue/mqtt.to.{client_id}",
        downlink_topic_address="/topic/#",
        refuse="",
        rcv_settle_second="no: the attach is refused (set amqp.qos2_rcv_settle_mode = \"first\")",
        anonymous_relay="no (RabbitMQ 4 has it): at most `amqp.max_links` links, least recently used closed first",
        keeps=("`/queue/...`: the queue and its messages (durable); `/topic/...`: a receiver's queue "
               "exists while it is attached (3.10 leaves exclusive ones behind)"),
        to_on_delivery="as sent",
        rejected="dropped, or dead-lettered when the queue has a dead-letter exchange (the reason is not kept)",
        subscription_prefixes=("/topic/", "/exchange/"),
    ),
    "artemis": Peer(
        name="artemis",
        title="Apache ActiveMQ Artemis 2.x",
        address_template="topic://{routing_key}",
        client_address_template="queue://mqtt.to.{client_id}",
        downlink_topic_address="",
        refuse="* # ::",
        rcv_settle_second="no: the attach is answered with first (the forwarder logs it and goes on)",
        anonymous_relay="offered; forwarding uses it with `amqp.anonymous_relay = \"on\"` (`to` is then "
                        "the address) or with the template `{topic}` (\"auto\"); a producer's `to` of the "
                        "form of `amqp.address_template` is read back as its topic",
        keeps=("`queue://...` (anycast): the queue and its messages; `topic://...` (multicast): only what "
               "a subscription queue exists for while the receiver is attached"),
        to_on_delivery="as sent (a dead-lettered copy: `DLQ`, the original in `x-opt-ORIG-ADDRESS`)",
        rejected="moved to `DLQ` at once (the edge's rule is not kept: only its log has it)",
        subscription_prefixes=("topic://",),
        looping_topic_links=("topic://#", "#"),
        to_may_be_address=True,
        property_refuse="_AMQ_",
        note=("on the unprefixed address `activemq.management` Artemis runs the operations a message's "
              "application properties name: keep a prefix in `amqp.address_template` and give the edge's "
              "AMQP user no management rights"),
    ),
    "generic": Peer(
        name="generic",
        title="any other AMQP 1.0 broker or router",
        address_template="{topic}",
        client_address_template="$mqtt.to.{client_id}",
        downlink_topic_address="",
        refuse="* # > , ::",
        rcv_settle_second="assumed no: set amqp.qos2_rcv_settle_mode if it has it",
        anonymous_relay="used only when offered in the peer's open frame",
        keeps="whatever the node behind the address keeps: no assumption",
        to_on_delivery="no assumption (a router may rewrite it)",
        rejected="no assumption: lakegate logs each rejection with its rule",
    ),
}


def peer_table_markdown() -> str:
    """The README's peer table, generated from :data:`PEERS`."""
    rows = [
        ("`amqp.address_template`", lambda p: f"`{p.address_template}`"),
        ("`amqp.client_address_template`", lambda p: f"`{p.client_address_template}`"),
        ("`amqp.downlink_topic_address`",
         lambda p: (f"`{p.downlink_topic_address}`" if p.downlink_topic_address else "none: name yours")
         + ("; refused: " + ", ".join(f"`{t}`" for t in p.looping_topic_links) + " (the broker's own "
            "addresses and its dead-letter address, where the edge's rejections would come back from "
            "for ever)" if p.looping_topic_links else "")),
        ("refused in a topic (`amqp.address_refuse`)",
         lambda p: " ".join(f"`{t}`" for t in p.refuse.split()) or "nothing more"),
        ("User Property names refused (`amqp.property_refuse`)",
         lambda p: " ".join(f"`{t}...`" for t in p.property_refuse.split()) + " (read as orders: `_AMQ_DUPL_ID` "
         "drops a later message as a duplicate, `_AMQ_SCHED_DELIVERY` holds it back)"
         if p.property_refuse else "none"),
        ("rcv-settle-mode second", lambda p: p.rcv_settle_second),
        ("anonymous relay", lambda p: p.anonymous_relay),
        ("kept while the edge is away", lambda p: p.keeps),
        ("`to` as a consumer gets it", lambda p: p.to_on_delivery),
        ("a message the edge rejects", lambda p: p.rejected),
        ("also", lambda p: p.note),
    ]
    peers = list(PEERS.values())
    lines = ["| `amqp.peer` | " + " | ".join(f"`{p.name}`: {p.title}" for p in peers) + " |",
             "|---|" + "---|" * len(peers)]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(p) for p in peers) + " |")
    return "\n".join(lines)
