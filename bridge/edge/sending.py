"""A connected client as a receiver of messages: the acknowledgements of
what the edge sends it, and sending. Sans-IO.

* **PUBACK, PUBREC, PUBCOMP** from the client end or advance the deliveries
  of its :class:`~bridge.edge.delivery.Outbox` (the PUBREC gets PUBREL); the
  frame is captured with ``ack_ref`` (partition:offset of the message's
  record), the journal of what the subscriber has acknowledged. An
  acknowledgement of the wrong kind is a Protocol Error
  [LG-edge-ack-mismatch]. A run of 4-byte PUBACKs read together is one
  capture record (``ack_refs``).
* **Sending**: :meth:`SendingFlows.deliver` returns the PUBLISH frames the
  outbox allows now; on accepting a connection for an existing session the
  unacknowledged ones go first, DUP 1, with the PUBRELs [MQTT-4.4.0-1].

:class:`SendingFlows` is a part of :class:`bridge.edge.session.Session` and
works on its attributes (``client``, ``level``, ``_pump_due``, ...);
SUBSCRIBE and UNSUBSCRIBE are :mod:`bridge.edge.subscribing`'s.
"""

from __future__ import annotations

import struct

from bridge.edge import rules as edge_rules
from bridge.edge.actions import Action, Capture, Send
from bridge.edge.delivery import RELEASED, AckMismatch, Receiver
from bridge.edge.handshake import CONNECTED
from bridge.edge.subscribing import _plus
from bridge.mqtt import PubAck, PubRec
from bridge.mqtt.fixed_header import PacketType

__all__ = ["SendingFlows"]

_ACK = struct.Struct(">BBH")
_ACK_RC = struct.Struct(">BBHB")
_RUN_PID = struct.Struct(">2xH")  # the Packet Identifier of each 4-byte PUBACK in a run


class SendingFlows:
    """The subscriber's acknowledgements and sending for a
    :class:`~bridge.edge.session.Session`."""

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
        when not connected, nor while a SUBSCRIBE is applied in slices: its
        SUBACK goes first)."""
        client = self.client
        if self.state != CONNECTED or client is None or client.outbox is None:
            return []
        if self._applying:
            self._pump_due = True
            return []
        journal = [] if self.journal_sends and client.persistent else None
        frames = client.outbox.pump(self.receiver(), now, journal)
        if not frames:
            return []
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        if journal:
            # a cluster edge: the Packet Identifiers are journaled before the
            # PUBLISHes leave, so that any edge can resume the session
            # (bridge.edge.applier); the frames go once the record is durable
            refs = b" ".join(b"%d:%d:%d" % (ref[0], ref[1], pid) for ref, pid in journal)
            return [Capture(b"", _plus(self._headers, [("edge", b"sent"), ("edge_refs", refs)]), data)]
        return [Send(data)]

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
