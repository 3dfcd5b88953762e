"""``lakegate demo``: a realistic workload through the whole pipeline.

1. Starts ``lakegate run`` in the background unless one is running on this
   ``data_dir`` (its output goes to ``data_dir/demo-run.log``).
2. Attaches an AMQP consumer (when forwarding goes to RabbitMQ-style
   ``/topic/{routing_key}`` addresses) to count what arrives.
3. Publishes with paho-mqtt: four devices, two on MQTT 3.1.1 and two on 5;
   retained status topics set, updated and cleared; telemetry at QoS 0, 1 and
   2; topic aliases, message expiry and user properties on MQTT 5; and one
   malformed frame sent raw (a PUBLISH with both QoS bits set).
4. Waits until the job has processed everything the edge captured, then
   prints the retained state, the quarantine rows and the forwarding counts.
5. Stops the background run it started (``--keep-running`` leaves it up).
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from bridge.config import Config

__all__ = ["Demo", "DemoError"]

PREFIX = "demo"
#: the demo's alarm: retained, QoS 1, MQTT 5 Message Expiry Interval 5 s
ALARM_TOPIC = f"{PREFIX}/plant-7/dev-04/alarm"
ALARM_EXPIRY_S = 5


def _forward_totals(config: Config) -> dict[str, int]:
    """Messages forwarded and expired so far by the running lakegate run: the
    job's totals (forwarding per micro-batch) plus the live forwarder's."""
    from bridge.amqp.live import read_live_status
    from bridge.job.progress import read_status

    totals = (read_status(config.data_path) or {}).get("totals", {})
    live = read_live_status(config.data_path) or {}
    return {"forwarded": int(totals.get("forwarded", 0)) + int(live.get("forwarded", 0)),
            "expired": int(totals.get("forward_expired", 0)) + int(live.get("expired", 0))}


class DemoError(RuntimeError):
    """The demo cannot run; the message says why in one line."""


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _wait(cond: Callable[[], Any], timeout: float, what: str, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


class _Counter:
    """An AMQP 1.0 receiver on ``/topic/<prefix>.#`` counting messages by subject."""

    def __init__(self, url: str, binding: str) -> None:
        from proton.handlers import MessagingHandler
        from proton.reactor import EventInjector

        from bridge.amqp.reactor import container

        self.counts: dict[str, int] = {}
        #: topic -> (monotonic receipt time, ttl in ms) of what arrived; the alarm's is reported
        self.arrived: dict[str, tuple[float, int | None]] = {}
        self.error: str | None = None
        self.ready = threading.Event()
        self.injector = EventInjector()
        counter = self

        class H(MessagingHandler):
            def on_start(self, event):
                event.container.selectable(counter.injector)
                counter.conn = event.container.connect(url, reconnect=False)
                event.container.create_receiver(counter.conn, f"/topic/{binding}")

            def on_link_opened(self, event):
                counter.ready.set()

            def on_message(self, event):
                key = event.message.subject or "message"
                counter.counts[key] = counter.counts.get(key, 0) + 1
                if key == "publish" and event.message.address:
                    ttl = event.message.ttl  # seconds, float (proton); 0 when absent
                    counter.arrived[str(event.message.address)] = (time.monotonic(), round(ttl * 1000) if ttl else None)

            def on_transport_error(self, event):
                counter.error = str(event.transport.condition)
                counter.ready.set()

            def on_lg_stop(self, event):
                counter.conn.close()
                counter.injector.close()

        self.container = container(H())
        self.thread = threading.Thread(target=self.container.run, daemon=True, name="demo-amqp")
        self.thread.start()
        if not self.ready.wait(10) or self.error:
            raise DemoError(f"AMQP consumer could not attach: {self.error or 'timeout'}")

    def close(self) -> None:
        from proton.reactor import ApplicationEvent

        self.injector.trigger(ApplicationEvent("lg_stop"))
        self.thread.join(10)


class Demo:
    def __init__(self, config: Config, config_args: list[str], out=sys.stdout, keep_running: bool = False) -> None:
        self.config = config
        self.config_args = config_args
        self.out = out
        self.keep_running = keep_running
        self.run_proc: subprocess.Popen | None = None
        self.host = config.edge.host
        self.port = config.edge.port

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # ------------------------------------------------------------ run
    def _ensure_run(self) -> None:
        from bridge.commands.runner import running_run

        info = running_run(self.config)
        if info is not None:
            h, p, _tls = next((e for e in info["edge"] if not e[2]), info["edge"][0])
            self.port = p
            self.say(f"using the lakegate run already running (pid {info['pid']}, edge {h}:{p})")
            return
        if _port_open(self.host, self.port):
            raise DemoError(f"{self.host}:{self.port} is in use by a program that is not a lakegate run on "
                            f"{self.config.data_path}; stop it or pass --set edge.port=...")
        self.config.data_path.mkdir(parents=True, exist_ok=True)
        from bridge.job.progress import STATUS_FILE

        (self.config.data_path / STATUS_FILE).unlink(missing_ok=True)  # a previous process's totals
        logf = open(self.config.data_path / "demo-run.log", "ab")
        cmd = [sys.executable, "-m", "bridge", "run", *self.config_args]
        self.run_proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        self.say(f"started lakegate run in the background (pid {self.run_proc.pid}; log {logf.name})")

        def up():
            if self.run_proc.poll() is not None:
                raise DemoError(f"lakegate run exited with {self.run_proc.returncode}; see {logf.name}")
            return running_run(self.config) is not None and _port_open(self.host, self.port)

        _wait(up, 180, "the edge to accept connections")

    def _stop_run(self) -> None:
        if self.run_proc is None or self.keep_running:
            if self.run_proc is not None:
                self.say(f"lakegate run keeps running (pid {self.run_proc.pid}); stop it with: kill -INT {self.run_proc.pid}")
            return
        self.run_proc.send_signal(signal.SIGINT)
        try:
            self.run_proc.wait(90)
        except subprocess.TimeoutExpired:
            self.run_proc.kill()
        self.say("stopped the background lakegate run")

    # ------------------------------------------------------------ workload
    def _client(self, cid: str, v5: bool):
        import paho.mqtt.client as mqtt

        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
        c.connect(self.host, self.port, keepalive=30)
        c.loop_start()
        return c

    def workload(self) -> dict[str, int]:
        """Publish the demo workload; returns counts by QoS (acknowledged)."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        def props(**kw):
            p = Properties(PacketTypes.PUBLISH)
            for k, v in kw.items():
                setattr(p, k, v)
            return p

        sent = {"qos0": 0, "qos1": 0, "qos2": 0}

        def pub(c, topic, payload, qos, retain=False, properties=None):
            c.publish(topic, payload, qos=qos, retain=retain, properties=properties).wait_for_publish(15)
            sent[f"qos{qos}"] += 1

        devices = {"dev-01": False, "dev-02": False, "dev-03": True, "dev-04": True}
        clients = {d: self._client(f"{PREFIX}-{d}", v5) for d, v5 in devices.items()}
        try:
            for d, v5 in devices.items():
                c = clients[d]
                up = props(UserProperty=[("fw", "2.4.1"), ("site", "plant-7")]) if v5 else None
                pub(c, f"{PREFIX}/plant-7/{d}/status", b"online", 1, retain=True, properties=up)
                for i in range(10):
                    reading = json.dumps({"t": round(20 + i * 0.1, 1), "seq": i}).encode()
                    if v5:
                        # the first reading sets topic alias 1, the rest use it with an empty topic
                        alias = props(TopicAlias=1, MessageExpiryInterval=300, ContentType="application/json",
                                      PayloadFormatIndicator=1)
                        topic = f"{PREFIX}/plant-7/{d}/temp" if i == 0 else ""
                        pub(c, topic, reading, i % 2, properties=alias)
                    else:
                        pub(c, f"{PREFIX}/plant-7/{d}/temp", reading, i % 2)
            pub(clients["dev-03"], f"{PREFIX}/plant-7/dev-03/status", b"busy", 1, retain=True)     # updated
            pub(clients["dev-02"], f"{PREFIX}/plant-7/dev-02/status", b"", 1, retain=True)         # cleared
            pub(clients["dev-04"], f"{PREFIX}/plant-7/dev-04/firmware", b"2.4.2 staged", 2, retain=True,
                properties=props(UserProperty=("by", "ops")))
            pub(clients["dev-04"], ALARM_TOPIC, b"door open", 1, retain=True,
                properties=props(MessageExpiryInterval=ALARM_EXPIRY_S))  # expires 5 s after it was received
            self.alarm_acked = time.monotonic()
        finally:
            for c in clients.values():
                c.loop_stop()
                c.disconnect()
        self._malformed()
        return sent

    def _malformed(self) -> None:
        """One malformed frame sent raw: CONNECT (3.1.1), then PUBLISH with QoS bits 11."""
        from bridge.mqtt import Connect, encode

        with socket.create_connection((self.host, self.port), timeout=10) as s:
            s.sendall(encode(Connect.for_level(4, client_id=f"{PREFIX}-broken-sensor", keepalive=30), 4))
            s.recv(4)  # CONNACK
            # 0x36: PUBLISH, QoS bits 11 (retain 0): malformed [MQTT-3.3.1-4]
            s.sendall(bytes([0x36, 0x0A, 0x00, 0x06]) + b"demo/x" + bytes([0x00, 0x01]))
            s.settimeout(10)
            try:
                while s.recv(64):
                    pass  # the edge closes the connection
            except OSError:
                pass

    # ------------------------------------------------------------ wait and report
    def _processed(self) -> bool:
        from bridge.capture import durable_ends
        from bridge.job.pipeline import checkpoint_path
        from bridge.job.progress import committed_offsets, lag

        if self.config.capture.backend == "local" and not (self.config.capture_dir / "meta.json").exists():
            return False  # the edge has not created it yet
        end = {str(p): n for p, n in enumerate(durable_ends(self.config))}
        _batch, done = committed_offsets(checkpoint_path(self.config))
        return done is not None and lag(done, end) == 0

    def report(self, sent: dict[str, int], counter: _Counter | None, before: dict) -> None:
        from bridge.job.progress import read_status
        from bridge.tables.deltars import DeltaRsEngine

        engine = DeltaRsEngine(self.config.tables_dir)
        now = dt.datetime.now(dt.timezone.utc)
        retained = [r for r in engine.arrow("retained").to_pylist()
                    if r["topic"].startswith(PREFIX + "/") and not r["deleted"]]
        retained.sort(key=lambda r: r["topic"])
        self.say()
        self.say("retained (what a new subscriber to demo/# would receive now):")
        self.say(f"  {'topic':34} {'payload':14} {'qos':>3}  {'publisher':16} expires")
        expired = [r for r in retained if r["expires_at"] is not None and r["expires_at"] <= now]
        for r in retained:
            if r in expired:
                continue
            payload = r["payload"].decode("utf-8", "replace")[:14]
            exp = "-" if r["expires_at"] is None else r["expires_at"].strftime("%H:%M:%S")
            self.say(f"  {r['topic']:34} {payload:14} {r['qos']:>3}  {r['client_id']:16} {exp}")
        for r in expired:
            self.say(f"  {r['topic']:34} (expired at {r['expires_at']:%H:%M:%S}: Message Expiry "
                     f"Interval {r['message_expiry_interval']} s; lakegate compact removes it)")
        cleared = [r["topic"] for r in engine.arrow("retained").to_pylist()
                   if r["topic"].startswith(PREFIX + "/") and r["deleted"]]
        for t in cleared:
            self.say(f"  {t:34} (cleared by a zero-byte retained publish)")
        self.say()
        self.say("quarantine:")
        for q in engine.arrow("quarantine").to_pylist():
            if q["client_id"] and q["client_id"].startswith(PREFIX):
                self.say(f"  {q['rule']:14} {q['client_id']}: {q['error']}")
                self.say(f"  {'':14} frame {q['frame'].hex(' ')}")
        status = read_status(self.config.data_path) or {}
        totals = status.get("totals", {})
        now_fwd, before_fwd = _forward_totals(self.config), getattr(self, "before_forward", {})
        fwd = now_fwd["forwarded"] - before_fwd.get("forwarded", 0)
        msgs = totals.get("messages", 0) - before.get("messages", 0)
        expired = now_fwd["expired"] - before_fwd.get("expired", 0)
        self.say()
        self.say(f"published: {sent['qos0']} at QoS 0, {sent['qos1']} at QoS 1, {sent['qos2']} at QoS 2 "
                 "(+1 malformed frame)")
        # the alarm's 5 s expiry may pass before its batch is forwarded: then
        # it is counted, not sent (how long that takes depends on the machine)
        self.say(f"job: {msgs} messages stored, {fwd} forwarded to AMQP"
                 + (f", {expired} not sent (expired before forwarding)" if expired else "")
                 + ("" if self.config.amqp.url else " (forwarding is off: amqp.url is empty)"))
        if counter is not None:
            pubs, rels = counter.counts.get("publish", 0), counter.counts.get("pubrel", 0)
            self.say(f"AMQP consumer on /topic/{PREFIX}.#: {pubs} AMQP_PUBLISH, {rels} AMQP_PUBREL received")
            self.say(self._alarm_line(counter))
        self.say()
        self.say('next: lakegate sql "SELECT topic, CAST(payload AS STRING) payload, set_at FROM retained '
                 "WHERE mqtt_match('demo/+/+/status', topic)\"")

    def _forwarded_all(self) -> bool:
        """Whether forwarding has passed every durable record (live: its
        marks; by the job: the job's batches, already waited for)."""
        from bridge.amqp.forwarded import ForwardedOffsets
        from bridge.amqp.live import read_live_status
        from bridge.capture import durable_ends

        if read_live_status(self.config.data_path) is None:
            return True
        marks = ForwardedOffsets(self.config.data_path, self.config.capture_stream)
        return marks.behind(durable_ends(self.config)) == 0

    def _alarm_line(self, counter: "_Counter") -> str:
        """Whether the alarm (5 s Message Expiry Interval) made it to AMQP in
        time, and how long it took from its PUBACK to the consumer."""
        got = counter.arrived.get(ALARM_TOPIC)
        acked = getattr(self, "alarm_acked", None)
        if got is None or acked is None:
            return (f"alarm {ALARM_TOPIC} (expiry {ALARM_EXPIRY_S} s): not received over AMQP (expired before "
                    "its batch was forwarded, or the consumer missed it)")
        t, ttl = got
        left = f", ttl {ttl:,} ms left" if ttl is not None else ""
        return (f"alarm {ALARM_TOPIC} (expiry {ALARM_EXPIRY_S} s): forwarded, received over AMQP "
                f"{t - acked:.2f} s after its PUBACK{left}")

    def run(self) -> int:
        from bridge.job.progress import read_status
        from bridge.amqp.reachable import amqp_reachable

        self._ensure_run()
        counter = None
        try:
            if self.config.amqp.url and "{routing_key}" in self.config.amqp.address_template \
                    and self.config.amqp.address_template.startswith("/topic/") and amqp_reachable(self.config.amqp.url):
                counter = _Counter(self.config.amqp.url, f"{PREFIX}.#")
            from bridge.job.pipeline import checkpoint_path

            from bridge.job.progress import committed_offsets

            # the query's first batch is its coldest (JVM, Python workers, tables):
            # the workload goes after it, as a device would find a running system
            _wait(lambda: committed_offsets(checkpoint_path(self.config))[0] is not None, 180,
                  "the job's first batch")
            before = (read_status(self.config.data_path) or {}).get("totals", {})
            if before and before.get("batches") is None:
                before = {}
            self.before_forward = _forward_totals(self.config)
            self.say(f"publishing the demo workload to {self.host}:{self.port} ...")
            sent = self.workload()
            _wait(self._processed, 180, "the job to process the workload")
            # the listener writes the status file just after the batch commits
            from bridge.capture import durable_ends

            target = durable_ends(self.config)

            def reported() -> bool:
                end = (read_status(self.config.data_path) or {}).get("end_offsets", {})
                return all(int(end.get(str(p), 0)) >= n for p, n in enumerate(target))

            try:
                _wait(reported, 15, "the job's progress report")
            except DemoError:
                pass  # the tables are complete (checked above); only the counts may lag
            if counter is not None:
                # everything the job forwarded (QoS 0 too) should reach the consumer
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not self._forwarded_all():
                    time.sleep(0.2)
                want = _forward_totals(self.config)["forwarded"] - self.before_forward["forwarded"]
                deadline = time.monotonic() + 30
                while sum(counter.counts.values()) < want and time.monotonic() < deadline:
                    time.sleep(0.2)
            self.report(sent, counter, before)
            return 0
        finally:
            if counter is not None:
                counter.close()
            self._stop_run()
