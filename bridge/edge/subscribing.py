"""A connected client as a subscriber: SUBSCRIBE and UNSUBSCRIBE. Sans-IO.

* **SUBSCRIBE** (MQTT 5.0 section 3.8, 3.1.1 section 3.8): the codec has
  checked each Topic Filter and its options (an invalid one is a Malformed
  Packet or Protocol Error and closes the connection, see
  ``bridge/mqtt/subscribe.py``). Each filter is then handled as if it came
  in its own SUBSCRIBE [MQTT-3.8.4-4 in 3.1.1 terms]: refused when the ACL
  does not allow it (0x87 Not authorized; 3.x 0x80) or when the client
  already holds ``edge.max_subscriptions_per_client`` other subscriptions
  (0x97 Quota exceeded; 3.x 0x80) [LG-edge-subscription-quota] or when it
  has more than ``edge.max_topic_levels`` levels or ``edge.max_topic_length``
  characters (0x8F Topic Filter invalid; 3.x 0x80) [LG-edge-topic-levels,
  LG-edge-topic-length], otherwise
  granted at the requested QoS (the edge supports QoS 2) and added to the
  router, replacing the client's subscription with the same filter
  [MQTT-3.8.4-3]. The SUBACK has one code per filter, in order
  [MQTT-3.8.4-6], and leaves once the SUBSCRIBE is durable in the capture
  log; the SUBSCRIBE is captured with a ``granted`` header (the codes, hex)
  so that a replay of the log rebuilds the same subscriptions.
* **UNSUBSCRIBE**: each filter removed; MQTT 5 UNSUBACK says per filter
  0x00 Success or 0x11 No subscription existed [MQTT-3.11.3-1] (0x8F for
  a filter beyond those bounds); 3.x UNSUBACK has no codes.

:class:`SubscriberFlows` is a part of :class:`bridge.edge.session.Session`
and works on its attributes (``router``, ``client``, ``level``, ...). The
acknowledgements of what the edge sends the client, and sending:
:mod:`bridge.edge.sending`.
"""

from __future__ import annotations

import struct

from bridge.capture.record import Headers
from bridge.edge import rules as edge_rules
from bridge.edge.actions import Action, Capture, Notice
from bridge.edge.handshake import CONNECTED
from bridge.edge.subscription import Sub, split_share
from bridge.mqtt import MqttError, Subscribe, Unsubscribe
from bridge.mqtt.fixed_header import PacketType, encode_fixed_header
from bridge.mqtt.subscribe import FilterDecoder

__all__ = ["SubscriberFlows"]

_U16 = struct.Struct(">H")
_ACK = struct.Struct(">BBH")


def _plus(headers: list, extra: list) -> list:
    """``headers + extra``, keeping a connection's encoded headers (the
    capture log encodes a :class:`Headers` once)."""
    return headers.plus(extra) if type(headers) is Headers else headers + extra


def _sends_retained(level: int, sub: Sub, old: Sub | None) -> bool:
    """Whether a SUBSCRIBE that made ``sub`` (replacing ``old``, or new)
    gets the matching retained messages: always in MQTT 3.x (3.1.1 section
    3.3.1.3); in MQTT 5 by Retain Handling: 0 yes [MQTT-3.3.1-9], 1 only for
    a new subscription [MQTT-3.3.1-10], 2 no [MQTT-3.3.1-11]. A Shared
    Subscription gets none (MQTT 5.0 sections 3.3.1.3 and 4.8.2: they go to
    a new *Non-shared* Subscription; no numbered statement, so the edge names
    it [LG-retained-shared]): the caller leaves ``$share`` filters out."""
    if level != 5:
        return True
    rh = sub.retain_handling
    return rh == 0 or (rh == 1 and old is None)


#: a SUBSCRIBE / UNSUBSCRIBE frame larger than this is handled in slices
#: (Session._process; about 1,000 short filters)
SLICE_BYTES = 16 * 1024
#: Topic Filters decoded and decided, or applied, per slice: about 1-2 ms of
#: the event loop...
SLICE_FILTERS = 512
#: ...and bytes of them at most (512 filters of 100 levels are 460 kB)
SLICE_FILTER_BYTES = 64 * 1024
#: retained replays of one SUBSCRIBE whose matching is done at once (each
#: bounded: bridge.edge.retained.scan.EAGER_NODES); the others match as they go
EAGER_REPLAYS = 8
#: refusal reasons a log line names one by one (the rest are counted)
_NOTICE_REASONS = 4
_UNSET = object()


class FilterWork:
    """What a SUBSCRIBE / UNSUBSCRIBE decided so far: a code per filter
    (``codes``), what changes once it is done (``plan``: filter -> Sub to
    add, or None to remove), refusals counted by rule id."""

    __slots__ = ("frame", "packet_id", "properties", "subscribe", "codes", "plan", "refused",
                 "acl", "held", "new", "sub_id", "todo", "at", "granted", "reserved", "replays")

    def __init__(self, frame: bytes, packet_id: int, properties, subscribe: bool) -> None:
        self.frame = frame
        self.packet_id = packet_id
        self.properties = properties
        self.subscribe = subscribe
        self.codes: list[int] = []
        self.plan: dict = {}
        #: rule id -> [count, why, the first such filter's size]
        self.refused: dict[str, list] = {}
        self.acl = _UNSET  # the ACL as the first slice found it
        self.held = 0      # subscriptions the client held before this packet
        self.new = 0       # filters this packet adds
        self.sub_id = None
        self.todo: list | None = None  # the plan's items while they are applied in slices
        self.at = 0        # ...applied so far
        self.granted: list[Sub] = []
        self.reserved = 0  # Packet Identifiers the retained replays took
        self.replays = 0   # retained replays queued

    def refuse(self, rule: str, why: str, tf: str) -> None:
        r = self.refused.get(rule)
        if r is None:
            self.refused[rule] = [1, why, f"a {len(tf)}-character filter of "
                                          f"{tf.count('/') + 1} levels"]
        else:
            r[0] += 1

    def summary(self, what: str, total: int) -> str:
        """One log line of bounded size: refusals by rule id, with counts."""
        n = sum(r[0] for r in self.refused.values())
        parts = [f"{c} {why} [{rule}] (first: {first})"
                 for rule, (c, why, first) in list(self.refused.items())[:_NOTICE_REASONS]]
        return f"{what} packet id {self.packet_id}: {n} of {total} filters refused: " \
            + "; ".join(parts)


class SubscriberFlows:
    """SUBSCRIBE / UNSUBSCRIBE and delivery for a :class:`~bridge.edge.session.Session`."""

    # -------------------------------------------------------------- SUBSCRIBE
    def _on_subscribe(self, p: Subscribe, frame: bytes, actions: list[Action]) -> None:
        """A SUBSCRIBE decoded whole (a small one): decided and applied now."""
        work = FilterWork(frame, p.packet_id, p.properties, True)
        self._decide_subscribe(work, p.subscriptions)
        self._finish_subscribe(work, actions)

    def _on_unsubscribe(self, p: Unsubscribe, frame: bytes, actions: list[Action]) -> None:
        work = FilterWork(frame, p.packet_id, p.properties, False)
        self._decide_unsubscribe(work, p.topic_filters)
        self._finish_unsubscribe(work, actions)

    # ------------------------------------------------ large ones, in slices
    def _begin_filters(self, frame: bytes, decoder: FilterDecoder, actions: list[Action]) -> None:
        """A large SUBSCRIBE / UNSUBSCRIBE (over :data:`SLICE_BYTES`): its
        filters are decoded and decided :data:`SLICE_FILTERS` (or
        :data:`SLICE_FILTER_BYTES`) at a time, one slice per :meth:`work`
        call, so no client holds the event loop more than a few
        milliseconds; bytes that arrive meanwhile wait. Nothing changes
        until every filter is decided (if a later filter is malformed, the
        connection is closed as for a small packet). Then:

        * a **persistent** session's subscriptions change and the packet is
          captured in one step: a replay of the capture log
          (:mod:`bridge.edge.journal`) must meet the same state at the
          record, with no message routed to part of the packet before it;
        * any other session's (it ends with its connection, nothing of it
          is recovered) are applied a slice at a time as well
          [LG-edge-turn-budget], each filter once (the plan is by filter),
          and the packet is captured and answered once all are. Messages
          may match the new subscriptions before the SUBACK, as MQTT allows
          (3.1.1 and 5.0 section 3.8.4); nothing is sent to the client
          until the SUBACK is queued, so it still comes first."""
        self._work = (FilterWork(frame, decoder.packet_id, decoder.properties,
                                 decoder.ptype == PacketType.SUBSCRIBE), decoder)
        self._work_slice(actions)

    def open_gate(self) -> None:
        """The SUBSCRIBE waiting at a cluster edge's fence may pass: it is
        handled by the next :meth:`work` call (``work_pending``)."""
        if self._gated:
            self._gated = False
            self._gate_open = True
            self._held = True

    @property
    def work_pending(self) -> bool:
        """A large SUBSCRIBE / UNSUBSCRIBE is being handled, or received
        frames wait for the next turn (``session.TURN_BUDGET``): call
        :meth:`work` soon (in the next turn of the event loop)."""
        return self._work is not None or self._held

    def work(self, now: float) -> list[Action]:
        """The next slice of the pending SUBSCRIBE / UNSUBSCRIBE, or (once it
        is done, in the next call) the next turn's share of the frames that
        waited for it or for the last turn's budget."""
        actions: list[Action] = []
        if self._work is None and not self._held:
            return actions
        if self.state != CONNECTED:  # closed, taken over: nothing more to do
            self._work = None
            self._held = False
            self._applying = False
            return actions
        if self._work is None:
            self._held = False
            return self._process_buffer()
        self._work_slice(actions)
        if self._work is None and self._buf:
            self._held = True  # what waited behind it: next turn
        if self._pump_due:
            self._pump_if_due(actions)
        return actions

    def _work_slice(self, actions: list[Action]) -> None:
        work, decoder = self._work
        if work.todo is not None:  # decided: applying, a slice at a time
            if self._apply_subscribe(work, True):
                self._work = None
                self._applying = False
                self._answer_subscribe(work, actions)
                self._pump_due = True  # what waited for the SUBACK
            return
        try:
            items = decoder.step(SLICE_FILTERS, SLICE_FILTER_BYTES)
        except MqttError as err:
            self._work = None
            self._reject(memoryview(work.frame), err, actions)
            return
        if work.subscribe:
            self._decide_subscribe(work, items)
        else:
            self._decide_unsubscribe(work, items)
        if decoder.done:
            if work.subscribe and work.plan and (self.client is None
                                                 or not self.client.persistent):
                work.todo = list(work.plan.items())  # applied from the next slice on
                self._applying = True
                return
            self._work = None
            if work.subscribe:
                self._finish_subscribe(work, actions)
            else:
                self._finish_unsubscribe(work, actions)

    # ------------------------------------------------ deciding, applying
    def _decide_subscribe(self, work: FilterWork, subs) -> None:
        """Decide each filter as if it came in its own SUBSCRIBE
        [MQTT-3.8.4-4 in 3.1.1 terms], changing nothing yet: the quota
        counts what this packet grants before it is applied. A filter the
        packet repeats is granted once with its last options (the later
        would replace the earlier [MQTT-3.8.4-3]); its retained messages go
        once."""
        level = self.level
        router = self.router
        cid = self.client_id
        if work.acl is _UNSET:
            work.acl = router.acl() if router.acl is not None else None
            work.held = router.count(cid)
            if level == 5 and work.properties.subscription_identifiers:
                work.sub_id = work.properties.subscription_identifiers[0]
        acl = work.acl
        limit = self.limits.max_subscriptions_per_client
        deep = self.limits.max_topic_levels
        longest = self.limits.max_topic_length
        tree = router.tree
        plan = work.plan
        codes = work.codes
        v5 = level == 5
        for s in subs:
            tf = s.topic_filter
            if tf.count("/") >= deep:  # as subscribed, $share/g/ too
                codes.append(0x8F if v5 else 0x80)
                work.refuse(edge_rules.TOPIC_LEVELS, f"more than {deep} levels "
                            f"(edge.max_topic_levels)", tf)
                continue
            if len(tf) > longest:
                codes.append(0x8F if v5 else 0x80)
                work.refuse(edge_rules.TOPIC_LENGTH, f"more than {longest} characters "
                            f"(edge.max_topic_length)", tf)
                continue
            # a filter that is not $share/{ShareName}/{filter} is an ordinary
            # one: in 3.x always (no Shared Subscriptions there; MQTT 5's codec
            # refused such a filter already [MQTT-4.8.2-1, MQTT-4.8.2-2])
            inner = split_share(tf)[1]
            if acl is not None and not acl.can_subscribe(self.username, cid, inner):
                codes.append(0x87 if v5 else 0x80)
                work.refuse(edge_rules.ACL_SUBSCRIBE, "not authorized", tf)
                continue
            if tf not in plan and tree.get(cid, tf) is None:
                if work.held + work.new >= limit:
                    codes.append(0x97 if v5 else 0x80)
                    work.refuse(edge_rules.SUBSCRIPTION_QUOTA, f"the client holds {limit} "
                                f"subscriptions (edge.max_subscriptions_per_client)", tf)
                    continue
                work.new += 1
            qos = s.qos if s.qos <= 2 else 2
            plan[tf] = Sub(cid, tf, qos, s.no_local, s.retain_as_published, s.retain_handling,
                           work.sub_id)
            codes.append(qos)

    def _finish_subscribe(self, work: FilterWork, actions: list[Action]) -> None:
        """Apply what was decided, all at once, and answer."""
        self._apply_subscribe(work, False)
        self._answer_subscribe(work, actions)

    def _apply_subscribe(self, work: FilterWork, sliced: bool) -> bool:
        """Apply what was decided: every filter, or (``sliced``) the next
        :data:`SLICE_FILTERS` / :data:`SLICE_FILTER_BYTES` of them; True
        once all are."""
        items = work.todo
        if items is None:
            items = work.todo = list(work.plan.items())
        level = self.level
        router = self.router
        client = self.client
        retained = router.retained
        i = start = work.at
        n = len(items)
        spent = 0
        while i < n:
            if sliced and (i - start >= SLICE_FILTERS or spent >= SLICE_FILTER_BYTES):
                break
            tf, sub = items[i]
            i += 1
            spent += len(tf)
            old = router.subscribe(client, sub)  # replaces one with the same filter [MQTT-3.8.4-3]
            work.granted.append(sub)
            if retained is not None and split_share(tf)[0] is None \
                    and _sends_retained(level, sub, old):
                # the first few matched now, the others as their replays go:
                # the step that changes a persistent session's subscriptions
                # captures the packet too, so it must stay short however
                # many filters it has
                work.reserved += self._retained_on_subscribe(sub, work.replays < EAGER_REPLAYS)
                work.replays += 1
        work.at = i
        return i >= n

    def _answer_subscribe(self, work: FilterWork, actions: list[Action]) -> None:
        """Answer with one code per filter, in order [MQTT-3.8.4-6], once the
        SUBSCRIBE is durable."""
        level = self.level
        granted = work.granted
        reserved = work.reserved
        codes = bytes(work.codes)
        body = _U16.pack(work.packet_id) + (b"\x00" if level == 5 else b"") + codes
        suback = encode_fixed_header(0x90, len(body)) + body
        extra = [("granted", codes.hex().encode())]
        if reserved:
            extra.append(("retained_k", b"%d" % reserved))
        actions.append(Capture(work.frame, _plus(self._headers, extra), suback))
        if work.refused:
            actions.append(Notice(work.summary("SUBSCRIBE", len(codes))))
        #: what the last SUBSCRIBE granted (retained messages plug in here)
        self.granted = granted

    def _decide_unsubscribe(self, work: FilterWork, filters) -> None:
        tree = self.router.tree
        cid = self.client_id
        deep = self.limits.max_topic_levels
        gone = work.plan
        codes = work.codes
        for tf in filters:
            if tf not in gone and tree.get(cid, tf) is not None:
                gone[tf] = None
                codes.append(0x00)
            else:
                # a filter beyond edge.max_topic_levels was never granted (unless
                # under a larger setting: then it is removed): 0x8F [LG-edge-topic-levels]
                codes.append(0x8F if tf not in gone and (
                    tf.count("/") >= deep or len(tf) > self.limits.max_topic_length) else 0x11)

    def _finish_unsubscribe(self, work: FilterWork, actions: list[Action]) -> None:
        router = self.router
        cid = self.client_id
        for tf in work.plan:
            router.unsubscribe(cid, tf)
        if self.level == 5:
            body = _U16.pack(work.packet_id) + b"\x00" + bytes(work.codes)  # [MQTT-3.11.3-1]
            reply = encode_fixed_header(0xB0, len(body)) + body
        else:
            reply = _ACK.pack(0xB0, 2, work.packet_id)
        actions.append(Capture(work.frame, self._headers, reply))

    def _retained_on_subscribe(self, sub: Sub, eager: bool = True) -> int:
        """Queue the retained messages ``sub`` matches (bridge.edge.retained)
        behind what the session has queued; they leave after the SUBACK
        (the connection's queue is ordered) and before any live message of
        the new subscription (live ones queue behind the replay). Returns
        the Packet Identifiers the replay reserved (``retained_k``)."""
        router = self.router
        allowed = None
        if router.acl is not None:  # checked again at delivery, as live messages are
            acl = router.acl()
            if acl is not None:
                user, cid = self.username, self.client_id
                allowed = lambda topic: acl.can_read(user, cid, topic)  # noqa: E731
        replay = router.retained.replay(
            sub.topic_filter, sub.qos, () if sub.sub_id is None else (sub.sub_id,),
            self._last_rx, allowed, eager)
        if replay is None:
            return 0
        router.outbox(self.client).add_replay(replay)
        self._pump_due = True
        return replay.count
