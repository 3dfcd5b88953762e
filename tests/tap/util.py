"""Helpers for the tap tests: publish to the real Mosquitto, run a tap, read the log."""

from __future__ import annotations

import threading
import uuid

import paho.mqtt.client as mqtt

from bridge.capture import LogReader
from bridge.config import load_config
from bridge.tap import Tap


def records(root):
    """Every durable record of the capture log at ``root``, partition by partition."""
    r = LogReader(root)
    out = []
    for p in range(r.partitions):
        out.extend(r.records(p, 0, r.durable_offsets()[p]))
    return out


def publish(host, port, msgs):
    """Publish (topic, payload, qos, retain, properties) tuples; returns once
    each one's flow with the broker is complete (PUBACK, PUBCOMP)."""
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pub-" + uuid.uuid4().hex[:6], protocol=mqtt.MQTTv5)
    pub.connect(host, port)
    pub.loop_start()
    try:
        for topic, payload, qos, retain, props in msgs:
            info = pub.publish(topic, payload, qos=qos, retain=retain, properties=props)
            info.wait_for_publish(10)
            assert info.is_published(), f"publish to {topic} did not complete"
    finally:
        pub.disconnect()
        pub.loop_stop()


def tap_config(tmp_path, host, port, client_id=None, partitions=2):
    return load_config(None, [f"data_dir={tmp_path}", f"tap.broker=mqtt://{host}:{port}",
                              f"tap.client_id={client_id or 'tap-' + uuid.uuid4().hex[:8]}",
                              f"capture.partitions={partitions}"], env={})


class Running:
    """A Tap running in a thread; ``error`` holds what ``run()`` raised."""

    def __init__(self, cfg, prefix):
        self.tap = Tap(cfg, topics=[f"{prefix}/#"])
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.tap.wait_subscribed(10), "tap did not connect and subscribe"

    def _run(self):
        try:
            self.tap.run()
        except BaseException as exc:
            self.error = exc

    def stop(self):
        self.tap.stop()
        self.thread.join(20)
        assert not self.thread.is_alive(), "tap did not stop"
