"""A connected client as a subscriber: SUBSCRIBE, UNSUBSCRIBE, the
acknowledgements of what the edge sends it, and sending. Sans-IO.

* **SUBSCRIBE** (MQTT 5.0 section 3.8, 3.1.1 section 3.8): the codec has
  checked each Topic Filter and its options (an invalid one is a Malformed
  Packet or Protocol Error and closes the connection, see
  ``bridge/mqtt/subscribe.py``). Each filter is then handled as if it came
  in its own SUBSCRIBE [MQTT-3.8.4-4 in 3.1.1 terms]: refused when the ACL
  does not allow it (0x87 Not authorized; 3.x 0x80) or when the client
  already holds ``edge.max_subscriptions_per_client`` other subscriptions
  (0x97 Quota exceeded; 3.x 0x80) [LG-edge-subscription-quota], otherwise
  granted at the requested QoS (the edge supports QoS 2) and added to the
  router, replacing the client's subscription with the same filter
  [MQTT-3.8.4-3]. The SUBACK has one code per filter, in order
  [MQTT-3.8.4-6], and leaves once the SUBSCRIBE is durable in the capture
  log; the SUBSCRIBE is captured with a ``granted`` header (the codes, hex)
  so that a replay of the log rebuilds the same subscriptions.
* **UNSUBSCRIBE**: each filter removed; MQTT 5 UNSUBACK says per filter
  0x00 Success or 0x11 No subscription existed [MQTT-3.11.3-1]; 3.x UNSUBACK
  has no codes.
* **PUBACK, PUBREC, PUBCOMP** from the client end or advance the deliveries
  of its :class:`~bridge.edge.delivery.Outbox` (the PUBREC gets PUBREL); the
  frame is captured with ``ack_ref`` (partition:offset of the message's
  record), the journal of what the subscriber has acknowledged. An
  acknowledgement of the wrong kind is a Protocol Error
  [LG-edge-ack-mismatch].
* **Sending**: :meth:`SubscriberFlows.deliver` returns the PUBLISH frames the
  outbox allows now; on accepting a connection for an existing session the
  unacknowledged ones go first, DUP 1, with the PUBRELs [MQTT-4.4.0-1].

:class:`SubscriberFlows` is a part of :class:`bridge.edge.session.Session`
and works on its attributes (``router``, ``client``, ``level``, ...).
"""

from __future__ import annotations

import struct

from bridge.capture.record import Headers
from bridge.edge import rules as edge_rules
from bridge.edge.actions import Action, Capture, Notice, Send
from bridge.edge.delivery import RELEASED, AckMismatch, Receiver
from bridge.edge.handshake import CONNECTED
from bridge.edge.topics import Sub
from bridge.mqtt import PubAck, PubRec, Subscribe, Unsubscribe
from bridge.mqtt.fixed_header import PacketType, encode_fixed_header

__all__ = ["SubscriberFlows"]

_U16 = struct.Struct(">H")
_ACK = struct.Struct(">BBH")
_ACK_RC = struct.Struct(">BBHB")
_RUN_PID = struct.Struct(">2xH")  # the Packet Identifier of each 4-byte PUBACK in a run


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


class SubscriberFlows:
    """SUBSCRIBE / UNSUBSCRIBE and delivery for a :class:`~bridge.edge.session.Session`."""

    # -------------------------------------------------------------- SUBSCRIBE
    def _on_subscribe(self, p: Subscribe, frame: bytes, actions: list[Action]) -> None:
        level = self.level
        router = self.router
        client = self.client
        cid = self.client_id
        acl = router.acl() if router.acl is not None else None
        sub_id = None
        if level == 5 and p.properties.subscription_identifiers:
            sub_id = p.properties.subscription_identifiers[0]
        limit = self.limits.max_subscriptions_per_client
        codes = []
        refused = []
        granted: list[Sub] = []
        reserved = 0  # Packet Identifiers the retained replays took
        for s in p.subscriptions:
            tf = s.topic_filter
            inner = tf.split("/", 2)[2] if tf.startswith("$share/") else tf
            if acl is not None and not acl.can_subscribe(self.username, cid, inner):
                codes.append(0x87 if level == 5 else 0x80)
                refused.append(f"{len(tf)}-character filter: not authorized "
                               f"[{edge_rules.ACL_SUBSCRIBE}]")
                continue
            if router.count(cid) >= limit and not any(
                    x.topic_filter == tf for x in router.tree.subscriptions(cid)):
                codes.append(0x97 if level == 5 else 0x80)
                refused.append(f"{len(tf)}-character filter: client holds {limit} subscriptions "
                               f"(edge.max_subscriptions_per_client) "
                               f"[{edge_rules.SUBSCRIPTION_QUOTA}]")
                continue
            qos = s.qos if s.qos <= 2 else 2
            sub = Sub(cid, tf, qos, s.no_local, s.retain_as_published, s.retain_handling, sub_id)
            old = router.subscribe(client, sub)  # replaces one with the same filter [MQTT-3.8.4-3]
            granted.append(sub)
            codes.append(qos)
            if router.retained is not None and inner == tf and _sends_retained(level, sub, old):
                reserved += self._retained_on_subscribe(sub)
        body = _U16.pack(p.packet_id) + (b"\x00" if level == 5 else b"") + bytes(codes)
        suback = encode_fixed_header(0x90, len(body)) + body
        extra = [("granted", bytes(codes).hex().encode())]
        if reserved:
            extra.append(("retained_k", b"%d" % reserved))
        actions.append(Capture(frame, _plus(self._headers, extra), suback))
        if refused:
            actions.append(Notice(f"SUBSCRIBE packet id {p.packet_id}: {len(refused)} of "
                                  f"{len(codes)} filters refused: " + "; ".join(refused)))
        #: what the last SUBSCRIBE granted (retained messages plug in here)
        self.granted = granted

    def _retained_on_subscribe(self, sub: Sub) -> int:
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
            self._last_rx, allowed)
        if replay is None:
            return 0
        router.outbox(self.client).add_replay(replay)
        self._pump_due = True
        return replay.count

    def _on_unsubscribe(self, p: Unsubscribe, frame: bytes, actions: list[Action]) -> None:
        router = self.router
        cid = self.client_id
        codes = bytes(0x00 if router.unsubscribe(cid, tf) else 0x11 for tf in p.topic_filters)
        if self.level == 5:
            body = _U16.pack(p.packet_id) + b"\x00" + codes  # [MQTT-3.11.3-1]
            reply = encode_fixed_header(0xB0, len(body)) + body
        else:
            reply = _ACK.pack(0xB0, 2, p.packet_id)
        actions.append(Capture(frame, self._headers, reply))

    # -------------------------------------------------------------- acks
    def _on_subscriber_ack(self, p, frame: bytes, actions: list[Action]) -> None:
        """PUBACK / PUBREC / PUBCOMP from the client (decoded by the codec)."""
        self._subscriber_ack(type(p), p.packet_id, p.reason_code, frame, actions)

    def _subscriber_ack(self, t, pid: int, reason_code: int, frame: bytes,
                        actions: list[Action]) -> None:
        """An answer to the edge's PUBLISH or PUBREL (``t``: PubAck, PubRec
        or PubComp): the frame is captured; sending what the freed window
        allows is left to the end of the received chunk (one pump per
        chunk, not per acknowledgement)."""
        box = self.client.outbox if self.client is not None else None
        level = self.level
        d = None
        if box is not None:
            try:
                if t is PubAck:
                    d = box.puback(pid)
                elif t is PubRec:
                    d = box.pubrec(pid, reason_code)
                else:
                    d = box.pubcomp(pid)
            except AckMismatch as exc:
                raise edge_rules.edge_violation(
                    edge_rules.ACK_MISMATCH, str(exc), protocol_level=level,
                    packet_type=PacketType(t.packet_type)) from None
        headers = self._headers
        if d is not None and d.msg.ref is not None:
            headers = _plus(headers, [("ack_ref", d.msg.ref_header)])
        reply = None
        if t is PubRec:
            if d is not None:
                if reason_code < 0x80 and d.state == RELEASED:  # (RECEIVED: AMQP_PUBREL first)
                    reply = _ACK.pack(0x62, 2, pid)
            elif reason_code < 0x80:
                # answers nothing the edge sent; a sender must still answer
                # PUBREC < 0x80 with PUBREL [MQTT-4.3.3-4]: 0x92 in MQTT 5
                reply = _ACK_RC.pack(0x62, 3, pid, 0x92) if level == 5 else _ACK.pack(0x62, 2, pid)
        actions.append(Capture(frame, headers, reply))
        if d is not None and (t is not PubRec or reason_code >= 0x80):
            self._pump_due = True  # the window has room again

    def _subscriber_puback_run(self, run: bytes, actions: list[Action]) -> int:
        """A run of 4-byte PUBACKs (``run``: two or more, back to back, as
        one read received them) is captured as **one record**: the frames
        byte for byte, with ``ack_refs`` naming each one's message (see
        ``schemas/capture.py``). Returns the bytes handled: less than the
        run when a PUBACK names a QoS 2 delivery, which the caller hands to
        :meth:`_subscriber_ack` (a Protocol Error [LG-edge-ack-mismatch])."""
        box = self.client.outbox if self.client is not None else None
        refs: list[bytes] = []
        pids = [t[0] for t in _RUN_PID.iter_unpack(run)]
        if box is None:
            n = len(pids)
            refs = [b"-"] * n
        else:
            n = box.puback_run(pids, refs)
            if n:
                self._pump_due = True
        if n == 1:
            headers = self._headers if refs[0] == b"-" else _plus(self._headers,
                                                                 [("ack_ref", refs[0])])
            actions.append(Capture(run[:4], headers, None))
        elif n:
            actions.append(Capture(run[:4 * n] if 4 * n < len(run) else run,
                                   _plus(self._headers, [("ack_refs", b" ".join(refs))]), None))
        return 4 * n

    def _pump_if_due(self, actions: list[Action]) -> None:
        """End of a received chunk: send what acknowledgements made room for."""
        if self._pump_due:
            self._pump_due = False
            actions.extend(self.deliver(self._last_rx))

    # -------------------------------------------------------------- sending
    def receiver(self) -> Receiver:
        """The subscriber's limits: Receive Maximum (MQTT 5; at most
        ``edge.max_inflight_messages``), Maximum Packet Size. Fixed by the
        CONNECT, so kept once connected."""
        rx = self._rx
        if rx is not None:
            return rx
        window = self.limits.max_inflight_messages
        if self.level == 5 and self._connect is not None:
            rm = self._connect.properties.receive_maximum
            if rm is not None and rm < window:
                window = rm
        rx = Receiver(self.level, window, self.client_max_packet)
        if self.state == CONNECTED:
            self._rx = rx
        return rx

    def deliver(self, now: float) -> list[Action]:
        """The PUBLISH frames the outbox allows now, as one Send (nothing
        when not connected)."""
        client = self.client
        if self.state != CONNECTED or client is None or client.outbox is None:
            return []
        frames = client.outbox.pump(self.receiver(), now)
        if not frames:
            return []
        return [Send(frames[0] if len(frames) == 1 else b"".join(frames))]

    def _resume_deliveries(self, now: float) -> list[Action]:
        """On accepting the connection: the re-sends, then what is queued."""
        client = self.client
        if client is None or client.outbox is None:
            return []
        out: list[Action] = []
        again = client.outbox.resend(self.receiver(), now)
        if again:
            out.append(Send(b"".join(again)))
        out.extend(self.deliver(now))
        return out
