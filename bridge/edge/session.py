"""The edge's per-connection MQTT session state machine. Sans-IO.

No sockets, no event loop, no clock, no files: bytes and times go in,
*actions* come out, and the server (:mod:`bridge.edge.server`) performs them
in order. Tests drive it with bytes alone.

API
---
``Session(conn_id, remote, limits, now)`` for each new network connection,
then:

* ``receive_data(data, now) -> list[action]``: feed bytes as they arrive.
  Partial frames are kept until complete; nothing is an error for being short.
* ``accept(client, session_present, now) / refuse(rule, reason, detail)``:
  the server's answer to a :class:`ConnectRequest` (after authentication
  and take-over of an existing connection; the session never blocks).
  Bytes that arrive meanwhile are buffered and processed on ``accept``.
* ``tick(now) -> list[action]`` once ``now >= session.deadline``: connect
  timeout, keep-alive timeout (1.5 x Keep Alive).
* ``connection_lost(now)``, ``shutdown()``, ``take_over()``: the connection
  ended, the server is shutting down (DISCONNECT 0x8B in MQTT 5), a new
  connection took the Client Identifier (0x8E). These publish the Will.
* ``quota_released(n)``: the server wrote ``n`` PUBACK / PUBCOMP (or refusing
  PUBREC) packets, so the client may send that many more QoS>0 PUBLISH packets
  under Receive Maximum [MQTT-3.3.4-7]. Called right when the bytes are
  handed to the transport, which is before the client can have seen them.

Actions, performed strictly in list order (and across calls, in call order):

* :class:`Capture`: append ``frame`` with ``headers`` to the capture log
  (partition key: the connection id, key: the client id). When ``reply`` is
  set, send it once the record is durable (and, with ``ack_after =
  "forward"``, once ``forward`` -- this record, or the QoS 2 entry it
  re-acknowledges -- has been forwarded). ``qos2`` / ``release`` link the
  record to QoS 2 state (see :meth:`Capture.captured`).
* :class:`Send`: write bytes, after everything queued before them.
* :class:`ConnectRequest`: authenticate and attach the client's session.
* :class:`WillMessage`: capture the Will as a PUBLISH (origin ``will``), after
  ``delay_s`` unless the session resumes first.
* :class:`Close`: close the network connection once everything queued before
  it has been written (and every record captured before it is durable).
* :class:`Notice`: a line for the server's log (ids and sizes only).

What is captured: every frame the client sends that the edge accepts, raw,
except PINGREQ (no content; keep-alive traffic of idle devices would
dominate the log), and the CONNECT with its password removed (header
``redacted=password``). A frame the edge rejects is captured too, with
``reject`` (rule id), ``reject_code`` (the MQTT 5 reason code) and
``reject_error`` before the connection is closed; see :func:`reject_record`
for oversized and malformed-CONNECT frames. A PUBLISH refused with the
connection kept (PUBACK/PUBREC 0x97 or 0x99, or a QoS 0 one whose payload
breaks its Payload Format Indicator) carries the same headers, so the job
quarantines every frame the edge did not take.

Modules, along the data flow (this one holds the byte intake, the timers,
the endings, the Will and the rejects; the others are parts of
:class:`Session` or what it returns):

* :mod:`bridge.edge.handshake` -- the CONNECT, ``accept`` / ``refuse``, the
  CONNACK; :class:`Limits`; the connection states;
* :mod:`bridge.edge.inbound` -- PUBLISH and its QoS 1 / 2 flows, PUBREL and
  the other packets of a connected client, DISCONNECT;
* :mod:`bridge.edge.subscribing` -- SUBSCRIBE and UNSUBSCRIBE, large ones in
  slices;
* :mod:`bridge.edge.sending` -- the subscriber's PUBACK, PUBREC and PUBCOMP,
  and what the session sends it;
* :mod:`bridge.edge.actions` -- the actions, and the PUBLISH a Will becomes;
* :mod:`bridge.edge.records` -- what is recorded of a rejected or redacted
  frame.

Every name this module exported before the split is still importable here.

One piece: what each packet does lives in the parts above; what is left
is the frame loop (``Session._process``, one iteration per frame) and the
ways out of it, which the loop and the parts share. A frame the codec or a
part refuses ends in ``_reject`` (from the loop's error paths and from
:mod:`~bridge.edge.subscribing`'s slices); the keep-alive timer, shutdown
and take-over end in ``_server_disconnect``; a connected session's Will
goes out through ``_will_into`` (from those and from
:mod:`~bridge.edge.inbound`'s DISCONNECT); the headers of a rejected frame
or a Will come from ``_base_headers``, which the handshake uses too. Every
exit sets ``state`` to CLOSED, which the loop checks before each frame, and
``close_reason``: the loop and its exits are one state machine, kept in
one file.
"""

from __future__ import annotations

import re

from bridge.edge import rules as edge_rules
from bridge.edge.actions import (
    Action, Capture, Close, ConnectRequest, Notice, Send, WillMessage, will_publish,
)
from bridge.edge.handshake import (  # MQTT_MAX_PACKET, CONNECTING...: importable from here too
    AWAIT_CONNECT, CLOSED, CONNECTED, CONNECTING, MQTT_MAX_PACKET, ConnectHandshake, Limits,
    version_name,
)
from bridge.edge.inbound import InboundFlows
from bridge.edge.records import REJECT_RECORD_BYTES, redact_password, reject_record
from bridge.edge.router import Router
from bridge.edge.sending import SendingFlows
from bridge.edge.state import ClientSession
from bridge.edge.subscribing import SLICE_BYTES, SubscriberFlows
from bridge.mqtt import Connect, IncompleteData, MqttError, PubAck, Publish
from bridge.mqtt.codec import begin_filters, decode_packet
from bridge.mqtt.fixed_header import PacketType, frame_length
from bridge.mqtt.rules import SECOND_CONNECT, violation

__all__ = [
    "Action",
    "Capture",
    "Close",
    "ConnectRequest",
    "Limits",
    "Notice",
    "REJECT_RECORD_BYTES",
    "Send",
    "Session",
    "WillMessage",
    "will_publish",
    "redact_password",
    "reject_record",
    "version_name",
]

_KEEPALIVE_FACTOR = 1.5


def _large_frame(view: memoryview, pos: int, end: int, limit: int | None) -> int:
    """The length of the complete frame at ``pos`` when it is larger than
    :data:`~bridge.edge.subscribing.SLICE_BYTES` (and within ``limit``);
    else 0 (the codec decides the rest, errors included)."""
    try:
        total = frame_length(view[pos:min(end, pos + 5)], max_packet_bytes=limit)
    except MqttError:
        return 0
    return total if total is not None and SLICE_BYTES < total <= end - pos else 0


#: a run of 4-byte PUBACKs with non-zero Packet Identifiers
_PUBACK_RUN = re.compile(rb"(?:\x40\x02(?:[^\x00][\x00-\xff]|\x00[^\x00]))+")

#: The work one call of :meth:`Session.receive_data` or :meth:`Session.work`
#: (one turn of the server's event loop) does at most, in units of about one
#: delivery: the frames it handles cost a unit each, an accepted PUBLISH
#: :data:`PUBLISH_COST` plus one per subscription it matches (its fan-out:
#: 200 subscribers to ``#`` make a PUBLISH cost 208), a SUBSCRIBE /
#: UNSUBSCRIBE a unit per 16 bytes, a large one (handled in slices) the rest
#: of the turn. Once it is spent the frames left wait, read but not handled,
#: for the next call of :meth:`Session.work` (``work_pending``; the server
#: stops reading the connection meanwhile), so a publisher whose messages fan
#: out to many sessions, or a read of 256 KiB of small frames, does not hold
#: the event loop (and every other client's acknowledgement) for long: about
#: 2-4 ms a turn. [LG-edge-turn-budget]
TURN_BUDGET = 1024
#: the units of an accepted PUBLISH before its fan-out (decoding, capture)
PUBLISH_COST = 8


class Session(ConnectHandshake, InboundFlows, SubscriberFlows, SendingFlows):
    """One network connection's MQTT session (see the module docstring)."""

    def __init__(self, conn_id: str, remote: str, limits: Limits, now: float, *,
                 busy: bool = False, router: Router | None = None) -> None:
        self.conn_id = conn_id
        #: the subscriptions of every session (shared by all connections of a server)
        self.router = router if router is not None else Router()
        self.granted = []
        self._pump_due = False
        self._rx = None  # the subscriber's Receiver, once connected
        #: a large SUBSCRIBE / UNSUBSCRIBE handled in slices (SubscriberFlows.work)
        self._work = None
        #: the turn's work was spent with frames left in the buffer (TURN_BUDGET)
        self._held = False
        #: a cluster edge's fence before a SUBSCRIBE (bridge.edge.cluster): called
        #: with the session, True when it may go on now; else the server opens
        #: the gate (``open_gate``) once this edge has read what the others
        #: had captured by then
        self.subscribe_gate = None
        #: a cluster edge journals the Packet Identifiers it sends a persistent
        #: session (bridge.edge.sending.deliver)
        self.journal_sends = False
        self._gated = False     # a SUBSCRIBE waits at the gate
        self._gate_open = False  # ...and may pass now
        #: a large SUBSCRIBE's filters are being applied (sends wait for its SUBACK)
        self._applying = False
        self.remote = remote
        self.limits = limits
        self._receive_maximum = limits.receive_maximum
        self._retain_ok = limits.retain_available
        #: refuse the CONNECT with Server busy (the server is at max_connections)
        self.busy = busy
        self.state = AWAIT_CONNECT
        self.level: int | None = None
        self.client_id = ""
        self.key = b""
        self.username: str | None = None
        self.keepalive = 0
        self.clean_start = True
        self.expiry_s = 0
        self.client: ClientSession | None = None
        self.session_present = False
        self.will = None
        self._owed: tuple[int, WillMessage] | None = None
        self.close_reason: str | None = None
        #: MQTT 5 Maximum Packet Size the client accepts (None: no limit)
        self.client_max_packet: int | None = None
        self.frames_in = 0
        self.bytes_in = 0
        #: frames received by packet type (index: the fixed header's type, 0-15)
        self.packets_in = [0] * 16
        #: the rule id of the frame this session was ended for (None: none)
        self.rejected_rule: str | None = None
        self._buf = bytearray()
        self._need = 0
        self._connect: Connect | None = None
        self._connect_frame = b""
        self._assigned = False
        self._aliases: dict[int, str] = {}
        self._inflight = 0
        self._qos2_here: set[int] = set()
        self._started = now
        self._last_rx = now
        self._headers: list[tuple[str, bytes]] = []
        self._conn_b = conn_id.encode()
        self._remote_b = remote.encode()

    @property
    def buffered(self) -> int:
        """Bytes received and held: an incomplete frame (or, while the CONNECT
        is being checked, whatever arrived after it)."""
        return len(self._buf)

    # -------------------------------------------------------------- timers
    @property
    def deadline(self) -> float | None:
        """When :meth:`tick` must be called next (None: no timer)."""
        if self.state in (AWAIT_CONNECT, CONNECTING):
            return self._started + self.limits.connect_timeout_s
        if self.state == CONNECTED and self.keepalive:
            return self._last_rx + _KEEPALIVE_FACTOR * self.keepalive
        return None

    def tick(self, now: float) -> list[Action]:
        """Fire the timers that are due at ``now``."""
        if self.state in (AWAIT_CONNECT, CONNECTING):
            if now >= self._started + self.limits.connect_timeout_s:
                self.state = CLOSED
                why = (f"connect timeout [{edge_rules.CONNECT_TIMEOUT}] (no CONNECT accepted "
                       f"within edge.connect_timeout_s = {self.limits.connect_timeout_s:g} s, "
                       f"{len(self._buf)} bytes buffered)")
                self.close_reason = why
                return [Close(why)]
        elif self.state == CONNECTED and self.keepalive:
            if now >= self._last_rx + _KEEPALIVE_FACTOR * self.keepalive:
                return self._server_disconnect(
                    0x8D, f"keep alive timeout [{edge_rules.KEEP_ALIVE_TIMEOUT}] "
                    f"(no packet for {_KEEPALIVE_FACTOR * self.keepalive:g} s)")
        return []

    # -------------------------------------------------------------- input
    def receive_data(self, data: bytes, now: float) -> list[Action]:
        """Feed bytes from the network; returns the actions they cause."""
        if self.state == CLOSED:
            return []
        self._last_rx = now
        self.bytes_in += len(data)
        buf = self._buf
        if buf or self.state == CONNECTING or self._work is not None or self._held:
            buf += data
            if len(buf) < self._need or self.state == CONNECTING or self._work is not None \
                    or self._held or self._gated:
                return []
            return self._process_buffer()
        actions: list[Action] = []
        used = self._process(memoryview(data), actions)
        if used < len(data) and self.state != CLOSED:
            buf += data[used:]
        if self._pump_due:
            self._pump_if_due(actions)
        return actions

    def _process_buffer(self) -> list[Action]:
        actions: list[Action] = []
        buf = self._buf
        view = memoryview(buf)
        try:
            used = self._process(view, actions)
        finally:
            view.release()
        if self.state == CLOSED:
            buf.clear()
        else:
            del buf[:used]
        if self._pump_due:
            self._pump_if_due(actions)
        return actions

    def _process(self, view: memoryview, actions: list[Action]) -> int:
        """Handle the complete frames at the start of ``view``, as many as
        :data:`TURN_BUDGET` allows (then ``_held``: the rest waits for
        :meth:`work`); returns the number of bytes consumed. (The hot path:
        one iteration per frame.)"""
        pos = 0
        end = len(view)
        self._need = 0
        limit = self.limits.max_packet_bytes
        decode = decode_packet
        on_publish = self._publish
        frames = 0
        by_type = self.packets_in
        budget = TURN_BUDGET
        tree = self.router.tree
        try:
            while pos < end:
                state = self.state
                if state is not CONNECTED and state is not AWAIT_CONNECT:
                    break
                if budget <= 0:  # the rest in the next turn [LG-edge-turn-budget]
                    self._held = True
                    return pos
                level = self.level
                b0 = view[pos]
                if b0 == 0x40 and state is CONNECTED and end - pos >= 4 and view[pos + 1] == 2:
                    # the 4-byte PUBACK of a subscriber (the commonest frame at
                    # QoS 1 fan-out): no codec call; Packet Identifier 0 is
                    # left to the codec's error [MQTT-2.2.1-5]. A run of them
                    # is one capture record.
                    run = _PUBACK_RUN.match(view, pos)
                    if run is not None and run.end() - pos > 4:
                        used = self._subscriber_puback_run(view[pos:run.end()].tobytes(),
                                                           actions)
                        pos += used
                        frames += used >> 2
                        by_type[4] += used >> 2
                        budget -= 1 + (used >> 5)
                        if pos == run.end():
                            continue
                        # else a PUBACK for a QoS 2 delivery: the single path says so
                    pid = (view[pos + 2] << 8) | view[pos + 3]
                    if pid:
                        frame = view[pos:pos + 4].tobytes()
                        pos += 4
                        frames += 1
                        by_type[4] += 1
                        budget -= 1
                        try:
                            self._subscriber_ack(PubAck, pid, 0, frame, actions)
                        except MqttError as err:
                            self._reject(memoryview(frame), err, actions)
                            return end
                        continue
                if level == 5 and b0 >> 4 == 15:
                    # The edge accepts no Authentication Method, so any AUTH
                    # is a session fault, whatever its content [MQTT-4.12.0-7].
                    self._reject(view[pos:], violation(
                        "MQTT-4.12.0-7", "AUTH from a Client whose CONNECT had no "
                        "Authentication Method", packet_type=PacketType.AUTH, protocol_level=5),
                        actions)
                    return end
                if b0 == 0x82 and self.subscribe_gate is not None and state is CONNECTED:
                    if self._gate_open:
                        self._gate_open = False
                    elif not self.subscribe_gate(self):
                        self._gated = True  # the server opens the gate (open_gate)
                        return pos
                if (b0 == 0x82 or b0 == 0xA2) and state is CONNECTED:
                    total = _large_frame(view, pos, end, limit)
                    if total:  # a large SUBSCRIBE / UNSUBSCRIBE: in slices
                        frame = view[pos:pos + total].tobytes()
                        pos += total
                        frames += 1
                        by_type[b0 >> 4] += 1
                        try:
                            decoder, _ = begin_filters(frame, level, max_packet_bytes=limit)
                        except MqttError as err:
                            self._reject(memoryview(frame), err, actions)
                            return end
                        self._begin_filters(frame, decoder, actions)
                        if self._work is not None or self.state is not CONNECTED:
                            return pos if self.state is CONNECTED else end
                        budget = 0  # decided and applied: that was the turn's work
                        continue
                try:
                    packet, used = decode(view[pos:], level, max_packet_bytes=limit)
                except IncompleteData as inc:
                    self._need = inc.needed or 0  # counted from the frame's start
                    return pos
                except MqttError as err:
                    self._reject(view[pos:], err, actions)
                    return end
                nxt = pos + used
                frame = view[pos:nxt].tobytes()
                pos = nxt
                frames += 1
                by_type[b0 >> 4] += 1
                try:
                    if type(packet) is Publish:
                        n = len(actions)
                        on_publish(packet, frame, actions)
                        budget -= PUBLISH_COST
                        if len(actions) > n and tree:
                            a = actions[-1]
                            if type(a) is Capture and a.deliver is not None:
                                # its fan-out, weighed now; the server routes with it
                                m = a.matched = tree.match(a.deliver)
                                budget -= m.width()
                    else:
                        self._other(packet, frame, actions)
                        # a SUBSCRIBE / UNSUBSCRIBE by its size
                        budget -= 1 + (used >> 4) if b0 >> 4 in (8, 10) else 1
                except MqttError as err:
                    self._reject(memoryview(frame), err, actions)
                    return end
            return pos
        finally:
            self.frames_in += frames


    # -------------------------------------------------------------- endings
    def connection_lost(self, now: float) -> list[Action]:
        """The network connection ended (peer closed, I/O error)."""
        if self.state == CLOSED:
            return []
        actions: list[Action] = []
        if self.state == CONNECTED:
            self._will_into(actions)
        self.state = CLOSED
        self.close_reason = self.close_reason or "connection lost"
        return actions

    def shutdown(self) -> list[Action]:
        """The server is shutting down: DISCONNECT 0x8B (MQTT 5), Will, close."""
        if self.state == CLOSED:
            return []
        # a close the edge had already decided on (a resource limit, a failed
        # capture log) keeps its reason
        why = self.close_reason or f"server shutting down [{edge_rules.SERVER_SHUTDOWN}]"
        if self.state != CONNECTED:
            self.state = CLOSED
            self.close_reason = why
            return [Close(why)]
        return self._server_disconnect(0x8B, why)

    def take_over(self) -> list[Action]:
        """Another connection took this Client Identifier [MQTT-3.1.4-3]."""
        why = f"session taken over [{edge_rules.SESSION_TAKEN_OVER}]"
        if self.state != CONNECTED:
            self.state = CLOSED
            self.close_reason = why
            return [Close(why)]
        return self._server_disconnect(0x8E, why)

    def lease_lost(self) -> list[Action]:
        """A cluster edge lost its lease (bridge.edge.cluster): DISCONNECT 0x9C
        Use another server (MQTT 5), close; no Will here: once the edge is
        declared dead another edge publishes it, once."""
        why = f"cluster lease lost, use another edge [{edge_rules.CLUSTER_LEASE}]"
        if self.state != CONNECTED:
            self.state = CLOSED
            self.close_reason = why
            return [Close(why)]
        actions: list[Action] = []
        if self.level == 5:
            actions.append(Send(bytes((0xE0, 1, 0x9C))))
        self.will = None
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))
        return actions

    def _server_disconnect(self, reason: int, why: str) -> list[Action]:
        actions: list[Action] = []
        if self.level == 5:
            actions.append(Send(bytes((0xE0, 1, reason))))
        self._will_into(actions)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))
        return actions

    # -------------------------------------------------------------- will
    def owed_will(self) -> WillMessage | None:
        """The Will this connection would leave if it ended now without a
        normal DISCONNECT (None: it has none, or is not connected)."""
        if self.will is None or self.state not in (CONNECTED, CLOSED) or self.client is None:
            return None
        cached = self._owed
        if cached is None or cached[0] != self.expiry_s:  # snapshots ask every few seconds
            frame, delay = will_publish(self._connect, self.expiry_s)  # self.will is the CONNECT's
            cached = self._owed = (self.expiry_s, WillMessage(
                self.client_id, self.key, self.conn_id, frame, self._base_headers(b"will"), delay))
        return cached[1]

    def _will_into(self, actions: list[Action]) -> None:
        w = self.owed_will()
        if w is not None:
            self.will = None
            actions.append(w)

    # -------------------------------------------------------------- rejects
    def _base_headers(self, origin: bytes) -> list[tuple[str, bytes]]:
        h = [("conn_id", self._conn_b)]
        if self.level is not None:
            h.append(("proto", str(self.level).encode()))
        h.append(("remote", self._remote_b))
        if self.username is not None:
            h.append(("username", self.username.encode()))
        h.append(("origin", origin))
        return h

    def _reject_headers(self, err: MqttError, note: str = "") -> list[tuple[str, bytes]]:
        self.rejected_rule = err.rule
        headers = self._headers or self._base_headers(b"client")
        return headers + [("reject", err.rule.encode()),
                          ("reject_code", str(err.reason_code).encode()),
                          ("reject_error", (str(err) + note).encode())]

    def _reject(self, view, err: MqttError, actions: list[Action]) -> None:
        """Record the rejected frame, answer as the version demands, close."""
        if self.state == AWAIT_CONNECT:
            if self._connect is not None:  # the CONNECT decoded; a session rule refused it
                self._reject_connect(err, actions)
            else:
                self._reject_first(view, err, actions)
            return
        if err.rule != SECOND_CONNECT and len(view) and view[0] >> 4 == PacketType.CONNECT:
            # Whatever else is wrong with it, a CONNECT on a connected session
            # is a Protocol Error [MQTT-3.1.0-2]: the codec's verdict (e.g. 0x84
            # for a bad Protocol Name or Version, a CONNACK code that no
            # DISCONNECT may carry [MQTT-3.14.2-1]) stays in the message.
            err = violation(SECOND_CONNECT, f"a second CONNECT on the connection ({err})",
                            packet_type=PacketType.CONNECT, protocol_level=self.level)
        if err.rule == SECOND_CONNECT:
            frame, note = self._redacted_second_connect(view)
        else:
            frame, note = reject_record(view, err)
        actions.append(Capture(frame, self._reject_headers(err, note)))
        if self.level == 5:
            actions.append(Send(bytes((0xE0, 1, err.reason_code))))
        self._will_into(actions)
        why = str(err)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))

    def _redacted_second_connect(self, view) -> tuple[bytes, str]:
        """A second CONNECT decoded fine (it is refused for being second):
        record it with the password removed."""
        frame = bytes(view)
        try:
            p, used = decode_packet(frame, None)
        except (MqttError, IncompleteData):
            return reject_record(view, violation(SECOND_CONNECT, "second CONNECT"))
        if p.password is not None:
            return redact_password(frame[:used], len(p.password)), "; password removed"
        return frame[:used], ""

    def _reject_first(self, view, err: MqttError, actions: list[Action]) -> None:
        """A fault in the first packet (the CONNECT, or whatever came instead)."""
        if self._connect is not None:  # the CONNECT decoded; a session rule refused it
            self._reject_connect(err, actions)
            return
        if err.protocol_level is not None:
            self.level = err.protocol_level
        frame, note = reject_record(view, err)
        actions.append(Capture(frame, self._reject_headers(err, note)))
        self._connack_refusal(err, actions)
        why = str(err)
        self.state = CLOSED
        self.close_reason = why
        actions.append(Close(why))
