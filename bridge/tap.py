"""``lakegate tap``: capture from a broker that already runs (Mosquitto, EMQX, HiveMQ).

A paho-mqtt MQTT 5 subscriber with a persistent session (Clean Start 0 and a
Session Expiry Interval) subscribes at QoS 2 with Retain As Published. Each
message it receives becomes a PUBLISH frame (encoded with lakegate's codec at
MQTT 5, the broker's Subscription Identifiers and Topic Alias dropped: a client
PUBLISH may carry neither) appended to the capture log with origin ``tap``.
The broker is acknowledged (PUBACK, or PUBREC for QoS 2) only after the record
is durable, using paho's manual acknowledgement: a message the tap did not
make durable is redelivered by the broker after a reconnect.

The tap is the capture log's writer: do not run an edge on the same
``data_dir`` at the same time (the log allows one writing process).
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from bridge.config import Config

__all__ = ["Tap", "TapStats", "frame_for"]

log = logging.getLogger(__name__)

@dataclass
class TapStats:
    received: int = 0
    captured: int = 0
    acked: int = 0
    failed: int = 0


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
    it reconnects with backoff when the broker goes away.
    """

    def __init__(self, config: Config, topics: list[str] | None = None, capture_log=None) -> None:
        from bridge.capture import CaptureLog

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
        self.log = capture_log if capture_log is not None else CaptureLog.open(config.capture_dir, config.capture)
        self.conn_id = f"tap-{uuid.uuid4().hex[:12]}"
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._client = self._make_client()

    def _make_client(self):
        import paho.mqtt.client as mqtt

        tap = self.config.tap
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=tap.client_id, protocol=mqtt.MQTTv5,
                        manual_ack=True)
        if tap.username:
            c.username_pw_set(tap.username, tap.password or None)
        if self.tls:
            c.tls_set(ca_certs=tap.tls_ca_file or None)
        c.reconnect_delay_set(min_delay=1, max_delay=30)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        return c

    # -- paho callbacks (paho's network thread) ----------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if reason_code.is_failure:
            log.warning("tap: broker %s:%d refused the connection: %s", self.host, self.port, reason_code)
            return
        log.info("tap: connected to %s:%d as %s (session present: %s)", self.host, self.port,
                 self.config.tap.client_id, flags.session_present)
        opts = SubscribeOptions(qos=2, retainAsPublished=True)
        client.subscribe([(t, opts) for t in self.topics])
        self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connected.clear()
        if not self._stop.is_set():
            log.warning("tap: disconnected from %s:%d (%s); reconnecting", self.host, self.port, reason_code)

    def _on_message(self, client, userdata, msg) -> None:
        self.stats.received += 1
        try:
            frame = frame_for(msg.topic, msg.payload, msg.qos, bool(msg.retain), msg.mid or 1, msg.properties)
            headers = [("conn_id", self.conn_id.encode()), ("proto", b"5"), ("origin", b"tap"),
                       ("remote", f"{self.host}:{self.port}".encode())]
            if self.config.tap.username:
                headers.append(("username", self.config.tap.username.encode()))
            ack = self.log.append(self.conn_id, self.config.tap.client_id.encode(), frame, headers)
        except Exception as exc:  # not captured: do not acknowledge; the broker redelivers after reconnect
            self.stats.failed += 1
            log.error("tap: could not capture a message on %r (%d bytes): %s", msg.topic, len(msg.payload), exc)
            return
        self.stats.captured += 1
        if msg.qos == 0:
            return
        mid, qos = msg.mid, msg.qos

        def durable(a) -> None:
            if a.durable():
                client.ack(mid, qos)
                self.stats.acked += 1
            else:
                self.stats.failed += 1
                log.error("tap: capture of mid %d failed; not acknowledged (the broker will redeliver)", mid)

        ack.add_done_callback(durable)

    # -- control -------------------------------------------------------------
    def run(self) -> None:
        tap = self.config.tap
        from paho.mqtt.properties import Properties
        from paho.mqtt.packettypes import PacketTypes

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
            self._client.disconnect()
            self._client.loop_stop()
            if self._owns_log:
                self.log.close()
            log.info("tap: stopped (received %d, captured %d, acknowledged %d, failed %d)",
                     self.stats.received, self.stats.captured, self.stats.acked, self.stats.failed)

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
