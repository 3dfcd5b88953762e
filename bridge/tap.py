"""``lakegate tap``: capture from a broker that already runs (Mosquitto, EMQX, HiveMQ).

A paho-mqtt MQTT 5 subscriber with a persistent session (Clean Start 0 and a
Session Expiry Interval) subscribes at QoS 2 with Retain As Published. Each
message it receives becomes a PUBLISH frame (encoded with lakegate's codec at
MQTT 5, the broker's Subscription Identifiers and Topic Alias dropped: a client
PUBLISH may carry neither) appended to the capture log with origin ``tap``.

The capture log is the configuration's (:func:`bridge.capture.open_capture_log`,
``capture.backend``): local files, or a Kafka topic. The broker is acknowledged
(PUBACK for QoS 1, PUBREC for QoS 2) only once the record is durable: fsynced
on the local log, confirmed by Kafka's delivery report (acks=all) on Kafka:

* QoS 1: paho's manual acknowledgement (``manual_ack=True``) holds PUBACK
  back; ``Client.ack`` sends it once the record's group commit is durable.
* QoS 2: paho 2.2 itself answers a QoS 2 PUBLISH with PUBREC the moment it
  arrives and hands the message over only at PUBREL (manual_ack holds back
  PUBCOMP, not PUBREC): a tap that died after that PUBREC would lose the
  message, since the broker then only re-sends PUBREL. :class:`TapClient`
  (a narrow subclass of paho's Client, checked against the paho versions in
  ``PAHO_VERIFIED``) takes the QoS 2 PUBLISH at arrival instead, sends no
  PUBREC, and lets the tap send it once the record is durable; every PUBREL
  is answered with PUBCOMP (a PUBREL follows only a PUBREC, which followed a
  durable record -- maybe one of a tap process before a restart).

An acknowledgement goes out only on the connection its PUBLISH arrived on:
after a reconnect the broker re-sends what it has no acknowledgement for
(with DUP), so an acknowledgement of the old connection might otherwise
answer a different message that reuses the Packet Identifier. A QoS 2
PUBLISH re-sent for a Packet Identifier this process captured and that still
awaits PUBREL is captured again with the header ``dup=1`` (as the edge marks
QoS 2 re-sends, so the job applies it once) and acknowledged once that
record is durable. Across a crash of the tap the QoS 2 state is not kept: a
message whose record was durable but whose PUBREC had not reached the broker
is captured again after the restart without the mark (a duplicate, never a
loss).

A capture that fails (the capture log's write or fsync failed, Kafka did not
take the record, or the append raised) is not acknowledged, and the tap stops: :meth:`Tap.run` disconnects
(keeping the session) and raises :class:`TapError`, so that the broker
re-sends everything unacknowledged when the tap is started again (after a
failed fsync or a failed Kafka delivery the log must be reopened: see
``bridge.capture.writer`` and ``bridge.capture.kafka_log``). A
clean stop makes the captured records durable and sends their
acknowledgements before DISCONNECT.

The tap is the capture log's writer: do not run an edge on the same
``data_dir`` (or, on Kafka, the same topic) at the same time (the log allows
one writing process; on Kafka the edge must be the topic's only producer).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

import paho.mqtt
import paho.mqtt.client as mqtt
from paho.mqtt import _packet as paho_packet
from paho.mqtt.enums import MQTTErrorCode

from bridge.config import Config

__all__ = ["PAHO_VERIFIED", "PahoVersionError", "Tap", "TapClient", "TapError", "TapStats", "check_paho", "frame_for"]

log = logging.getLogger(__name__)

#: paho-mqtt releases (major, minor) whose Client internals TapClient was read
#: and tested against: ``_handle_publish``/``_handle_pubrel`` (called from
#: ``_packet_handle`` with ``_in_packet`` holding the packet),
#: ``_packet.decode_publish``/``decode_pubrel``, ``_send_pubrec``/``_send_pubcomp``.
#: Another release may change them; check_paho refuses it (tests/tap checks it).
PAHO_VERIFIED = ((2, 2),)

_PAHO_INTERNALS = ("_handle_publish", "_handle_pubrel", "_send_pubrec", "_send_pubcomp", "_easy_log",
                   "_packet_handle")


class TapError(Exception):
    """The tap stopped because a message could not be captured."""


class PahoVersionError(RuntimeError):
    """The installed paho-mqtt is not one TapClient was verified against."""


def check_paho(version: str | None = None) -> None:
    """Raise PahoVersionError unless the installed paho-mqtt (or ``version``) is a
    release whose internals :class:`TapClient` overrides were verified against."""
    version = version or paho.mqtt.__version__
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = ()
    if major_minor not in PAHO_VERIFIED:
        verified = ", ".join(f"{a}.{b}.x" for a, b in PAHO_VERIFIED)
        raise PahoVersionError(
            f"paho-mqtt {version} is installed, but lakegate tap's QoS 2 handling (bridge/tap.py TapClient) "
            f"overrides paho internals verified only for paho-mqtt {verified}; install one of those, or "
            "re-verify TapClient against this release and add it to PAHO_VERIFIED")
    missing = [n for n in _PAHO_INTERNALS if not callable(getattr(mqtt.Client, n, None))]
    missing += [n for n in ("decode_publish", "decode_pubrel") if not callable(getattr(paho_packet, n, None))]
    if missing:
        raise PahoVersionError(f"paho-mqtt {version} lacks {', '.join(missing)}, "
                               "which bridge/tap.py TapClient relies on")


class TapClient(mqtt.Client):
    """paho's MQTT Client with the receiving side of QoS 2 taken over.

    An incoming QoS 2 PUBLISH goes to ``on_qos2_publish(client, message)`` as
    soon as it arrives, and no PUBREC is sent: the callback's owner sends it
    with :meth:`send_pubrec` once the message is durable. An incoming PUBREL
    goes to ``on_qos2_release(client, mid)``, whose owner answers it with
    :meth:`send_pubcomp` (paho with ``manual_ack`` would leave a PUBREL for an
    id it does not hold unanswered). QoS 0 and 1 stay paho's own: on_message,
    and PUBACK through ``ack()`` with ``manual_ack=True``.

    Only the two packet handlers are overridden; paho's incoming QoS 2 store
    (``_in_messages``) is never used. paho's PUBREL handler also re-runs its
    outgoing in-flight queue (``max_inflight_messages``); a tap publishes
    nothing, so that is not needed here.
    """

    on_qos2_publish = None
    on_qos2_release = None

    def __init__(self, *args, **kwargs) -> None:
        check_paho()
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self, "_in_packet", None), dict) or not hasattr(self, "_in_callback_mutex"):
            raise PahoVersionError(f"paho-mqtt {paho.mqtt.__version__}: Client has no _in_packet/_in_callback_mutex, "
                               "which bridge/tap.py TapClient relies on")

    def _handle_publish(self) -> MQTTErrorCode:
        command = self._in_packet["command"]
        if (command & 0x06) >> 1 != 2:
            return super()._handle_publish()
        p = paho_packet.decode_publish(command, self._in_packet["packet"], self._protocol)
        message = mqtt.MQTTMessage(mid=p.mid, topic=p.topic)
        message.dup = p.dup
        message.qos = p.qos
        message.retain = p.retain
        message.properties = p.properties
        message.payload = p.payload
        message.timestamp = time.monotonic()
        self._easy_log(mqtt.MQTT_LOG_DEBUG, "Received PUBLISH (d%d, q2, r%d, m%d), %d bytes; PUBREC once durable",
                       message.dup, message.retain, message.mid, len(message.payload))
        with self._in_callback_mutex:
            self.on_qos2_publish(self, message)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_pubrel(self) -> MQTTErrorCode:
        p = paho_packet.decode_pubrel(self._in_packet["command"], self._in_packet["packet"], self._protocol)
        self._easy_log(mqtt.MQTT_LOG_DEBUG, "Received PUBREL (Mid: %d)", p.mid)
        with self._in_callback_mutex:
            self.on_qos2_release(self, p.mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def send_pubrec(self, mid: int) -> MQTTErrorCode:
        return self._send_pubrec(mid)

    def send_pubcomp(self, mid: int) -> MQTTErrorCode:
        return self._send_pubcomp(mid)


@dataclass
class TapStats:
    received: int = 0
    captured: int = 0
    acked: int = 0
    failed: int = 0
    #: QoS 2 re-sends of an id awaiting PUBREL, captured with dup=1
    duplicates: int = 0
    #: acknowledgements not sent: the connection their PUBLISH came on was gone
    #: (the broker re-sends those messages on the next connection)
    stale: int = 0


def frame_for(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int, props) -> bytes:
    """The MQTT 5 PUBLISH frame for a message received from the broker.

    ``props``: paho's Properties (or None). Subscription Identifiers and Topic
    Alias are the broker-to-subscriber hop's, not the message's: dropped.
    """
    from bridge.mqtt import Properties, Publish, encode

    kw = {}
    if props is not None:
        paho_names = {"payload_format_indicator": "PayloadFormatIndicator", "message_expiry_interval": "MessageExpiryInterval",
                      "content_type": "ContentType", "response_topic": "ResponseTopic", "correlation_data": "CorrelationData"}
        for ours, theirs in paho_names.items():
            v = getattr(props, theirs, None)
            if v is not None:
                kw[ours] = bytes(v) if ours == "correlation_data" else v
        ups = getattr(props, "UserProperty", None)
        if ups:
            kw["user_properties"] = [(str(k), str(v)) for k, v in ups]
    pkt = Publish(dup=False, qos=qos, retain=retain, topic=topic, packet_id=packet_id if qos else None,
                  properties=Properties(**kw), payload=bytes(payload))
    return encode(pkt, 5)


class Tap:
    """One tap: a broker subscription writing into a capture log.

    ``run()`` blocks until ``stop()`` (another thread or a signal handler);
    paho reconnects when the broker goes away. It raises :class:`TapError`
    when a message could not be captured (see the module docstring).

    Threads: paho's network thread receives (captures, keeps the QoS 2 ids
    awaiting PUBREL, answers PUBREL); the capture log's flusher thread (on
    Kafka: its poller thread, with the delivery reports) sends PUBACK/PUBREC
    once a record is durable, under ``_lock`` together with the connection
    state.
    """

    #: how long a stop waits for the acknowledgements of what was captured
    STOP_TIMEOUT_S = 10.0

    def __init__(self, config: Config, topics: list[str] | None = None, capture_log=None) -> None:
        from bridge.capture import open_capture_log

        check_paho()
        self.config = config
        tap = config.tap
        if not tap.broker:
            raise ValueError("tap.broker is empty: give --broker mqtt://HOST:PORT")
        url = urlsplit(tap.broker)
        self.host = url.hostname or "127.0.0.1"
        self.tls = url.scheme == "mqtts"
        self.port = url.port or (8883 if self.tls else 1883)
        self.topics = topics or [tap.topic]
        self.stats = TapStats()
        self._owns_log = capture_log is None
        # local files or a Kafka topic, by capture.backend; either way an Ack resolves once durable
        self.log = capture_log if capture_log is not None else open_capture_log(config)
        self.conn_id = f"tap-{uuid.uuid4().hex[:12]}"
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        #: guards _gen/_online against the flusher's acknowledgements, and _outstanding
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._gen = 0  # connection generation: +1 per accepted CONNACK
        self._online = False  # the connection of generation _gen is up
        self._outstanding = 0  # captured QoS 1/2 messages whose durability is not settled yet
        #: QoS 2 Packet Identifiers captured by this process and awaiting PUBREL
        #: -> capture seq of the record (paho's network thread only)
        self._qos2: dict[int, int] = {}
        self._failure: BaseException | None = None
        self._client = self._make_client()

    def _make_client(self) -> TapClient:
        tap = self.config.tap
        c = TapClient(mqtt.CallbackAPIVersion.VERSION2, client_id=tap.client_id, protocol=mqtt.MQTTv5,
                      manual_ack=True)
        if tap.username:
            c.username_pw_set(tap.username, tap.password or None)
        if self.tls:
            c.tls_set(ca_certs=tap.tls_ca_file or None)
        c.reconnect_delay_set(min_delay=1, max_delay=30)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message
        c.on_qos2_publish = self._on_qos2_publish
        c.on_qos2_release = self._on_qos2_release
        return c

    # -- paho callbacks (paho's network thread) ----------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if reason_code.is_failure:
            log.warning("tap: broker %s:%d refused the connection: %s", self.host, self.port, reason_code)
            return
        log.info("tap: connected to %s:%d as %s (session present: %s)", self.host, self.port,
                 self.config.tap.client_id, flags.session_present)
        with self._lock:
            self._gen += 1
            self._online = True
        if not flags.session_present and self._qos2:
            # a new session: its Packet Identifiers have nothing to do with the old one's
            log.warning("tap: the broker kept no session; forgetting %d QoS 2 ids awaiting PUBREL", len(self._qos2))
            self._qos2.clear()
        opts = SubscribeOptions(qos=2, retainAsPublished=True)
        client.subscribe([(t, opts) for t in self.topics])
        self._connected.set()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        refused = [(t, rc) for t, rc in zip(self.topics, reason_codes) if rc.is_failure]
        for topic, rc in refused:
            log.warning("tap: broker %s:%d refused the subscription to %r: %s", self.host, self.port, topic, rc)
        if len(refused) < len(self.topics):
            self._subscribed.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._lock:
            self._online = False
        self._connected.clear()
        self._subscribed.clear()
        if not self._stop.is_set():
            log.warning("tap: disconnected from %s:%d (%s); reconnecting", self.host, self.port, reason_code)

    def _on_message(self, client, userdata, msg) -> None:
        """QoS 0 and 1 (paho's own handling; PUBACK held back by manual_ack)."""
        self._receive(msg, dup=False)

    def _on_qos2_publish(self, client, msg) -> None:
        """A QoS 2 PUBLISH, at arrival; no PUBREC has been sent (TapClient)."""
        self._receive(msg, dup=msg.mid in self._qos2)

    def _on_qos2_release(self, client, mid: int) -> None:
        # A PUBREL follows our PUBREC, which followed a durable record (maybe one
        # captured before a restart, which this process does not know).
        self._qos2.pop(mid, None)
        client.send_pubcomp(mid)

    def _receive(self, msg, dup: bool) -> None:
        self.stats.received += 1
        qos, mid = msg.qos, msg.mid
        with self._lock:
            if self._stop.is_set():
                return  # stopping: neither captured nor acknowledged; the broker sends it again
            gen = self._gen
            if qos:
                self._outstanding += 1
        try:
            frame = frame_for(msg.topic, msg.payload, qos, bool(msg.retain), mid or 1, msg.properties)
            headers = [("conn_id", self.conn_id.encode()), ("proto", b"5"), ("origin", b"tap"),
                       ("remote", f"{self.host}:{self.port}".encode())]
            if self.config.tap.username:
                headers.append(("username", self.config.tap.username.encode()))
            if dup:
                headers.append(("dup", b"1"))
            ack = self.log.append(self.conn_id, self.config.tap.client_id.encode(), frame, headers)
        except Exception as exc:  # not captured: not acknowledged, and the tap stops
            self._fail(exc, f"could not capture a QoS {qos} message ({len(msg.payload)} bytes)")
            if qos:
                self._settle()
            return
        self.stats.captured += 1
        if qos == 0:
            return
        if qos == 2:
            if dup:
                self.stats.duplicates += 1
                log.info("tap: QoS 2 re-send of packet id %d awaiting PUBREL captured with dup=1 "
                         "(seq %d; first seq %d)", mid, ack.seq, self._qos2[mid])
            else:
                self._qos2[mid] = ack.seq
        ack.add_done_callback(lambda a: self._durable(a, mid, qos, gen))

    # -- the capture log's flusher thread -----------------------------------
    def _durable(self, ack, mid: int, qos: int, gen: int) -> None:
        try:
            if not ack.durable():
                self._fail(ack.future.exception(), f"the record of packet id {mid} (QoS {qos}) is not durable")
                return
            with self._lock:
                if not self._online or self._gen != gen:
                    # the broker re-sends it (DUP) on the next connection; an
                    # acknowledgement there could answer another message
                    self.stats.stale += 1
                    return
                if qos == 1:
                    self._client.ack(mid, 1)
                else:
                    self._client.send_pubrec(mid)
                self.stats.acked += 1
        finally:
            self._settle()

    def _settle(self) -> None:
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._settled.notify_all()

    def _fail(self, exc: BaseException | None, what: str) -> None:
        self.stats.failed += 1
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = exc or RuntimeError(what)
        if first:
            log.error("tap: %s: %s; not acknowledged; stopping (the broker re-sends unacknowledged messages "
                      "when the tap is started again)", what, exc)
        self._stop.set()

    # -- control -------------------------------------------------------------
    def run(self) -> None:
        tap = self.config.tap
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = tap.session_expiry_s
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._client.connect(self.host, self.port, keepalive=tap.keepalive_s, clean_start=False,
                                     properties=props)
                break
            except OSError as exc:
                log.warning("tap: broker %s:%d unreachable (%s); retrying in %.0fs", self.host, self.port, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        self._client.loop_start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self._shutdown()
        if self._failure is not None:
            raise TapError(f"a message could not be captured ({self._failure}); it was not acknowledged, and the "
                           "broker re-sends it when the tap is started again") from self._failure

    def _shutdown(self) -> None:
        """Stop capturing; make what was captured durable and acknowledge it
        (unless capture failed); DISCONNECT, keeping the session."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.reasoncodes import ReasonCode

        if self._failure is None:
            try:
                self.log.flush(timeout=self.STOP_TIMEOUT_S)
            except Exception as exc:
                log.warning("tap: could not flush the capture log at stop: %s", exc)
        with self._lock:
            if not self._settled.wait_for(lambda: self._outstanding == 0, self.STOP_TIMEOUT_S):
                log.warning("tap: %d captured messages were not settled at stop; the broker re-sends them",
                            self._outstanding)
            self._online = False  # nothing more goes out
        reason = ReasonCode(PacketTypes.DISCONNECT, "Unspecified error") if self._failure is not None else None
        self._client.disconnect(reasoncode=reason)
        self._client.loop_stop()
        if self._owns_log:
            self.log.close()
        s = self.stats
        log.info("tap: stopped (received %d, captured %d, acknowledged %d, failed %d, QoS 2 re-sends %d, "
                 "acknowledgements dropped with their connection %d)",
                 s.received, s.captured, s.acked, s.failed, s.duplicates, s.stale)

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def wait_subscribed(self, timeout: float) -> bool:
        """True once the broker granted (SUBACK) a filter on the current connection."""
        return self._subscribed.wait(timeout)

    def stop(self) -> None:
        """Ask ``run()`` to stop (safe from a signal handler: sets an event)."""
        self._stop.set()
