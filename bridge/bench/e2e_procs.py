"""The two systems ``lakegate bench e2e`` measures, as processes: ``lakegate
run`` in its own session (:class:`Lakegate`: start, kill the whole group,
stop, CPU of every process in it) and the glue a user would otherwise write
(:data:`GLUE_SCRIPT`, run by :class:`Glue`); and the housekeeping of the
bench's consumer queue in RabbitMQ (:func:`delete_queue`) and of the Kafka
topics its ``--capture kafka`` runs create (:func:`delete_topic`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bridge.bench.edge import _cpu_seconds
from bridge.config import Config, load_config

__all__ = ["GLUE_SCRIPT", "Glue", "Lakegate", "delete_queue", "delete_topic", "rabbitmqctl", "session_cpu", "session_stats"]

ROOT = Path(__file__).resolve().parents[2]
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def session_stats(sid: int) -> list[tuple[int, float]]:
    """(pid, CPU seconds) of every live process in session ``sid`` (a
    lakegate run started by the bench: its driver, Spark JVM, Python workers)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[3]) == sid and f[0] != "Z":
            out.append((int(d), (int(f[11]) + int(f[12])) / _TICKS))
    return out


def session_cpu(sid: int) -> float:
    return sum(c for _pid, c in session_stats(sid))


class Lakegate:
    """``python -m bridge run`` in its own session (process group)."""

    def __init__(self, args: argparse.Namespace, data_dir: Path, log_path: Path) -> None:
        self.base = list(getattr(args, "overrides", None) or [])
        self.config_file = getattr(args, "config", None)
        self.data_dir, self.log_path = data_dir, log_path
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.cpu_dead = 0.0  # CPU of killed incarnations
        self.log_from = 0  # where this incarnation's lines start in the log file

    def sets(self, extra: list[str]) -> list[str]:
        # the SQL endpoint and metrics off unless asked (no clash with a run of yours on their ports)
        return ["log_level=INFO", "sql.connect_port=0", "metrics.port=0", *self.base, f"data_dir={self.data_dir}",
                "edge.port=0",
                "edge.host=127.0.0.1", *extra]

    def config(self, extra: list[str] = ()) -> Config:
        return load_config(self.config_file, self.sets(list(extra)))

    def start(self, extra: list[str], timeout: float) -> float:
        from bridge.commands.runner import running_run

        cmd = [sys.executable, "-m", "bridge", "run"]
        if self.config_file:
            cmd += ["--config", self.config_file]
        for s in self.sets(extra):
            cmd += ["--set", s]
        cfg = self.config(extra)
        t0 = time.monotonic()
        self.log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lakegate run exited with code {self.proc.returncode}: {self.tail()}")
            info = running_run(cfg)
            if info is not None and info.get("pid") == self.proc.pid:
                self.port = next((p for _h, p, tls in info["edge"] if not tls), info["edge"][0][1])
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"lakegate run did not start its edge within {timeout:.0f}s: {self.tail()}")
            time.sleep(0.1)  # startup poll, bounded by the deadline

    def log_text(self) -> str:
        """What this incarnation logged so far (the log file is shared by restarts)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.log_from)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(text[-lines:])

    def cpu(self) -> float:
        return self.cpu_dead + (session_cpu(self.proc.pid) if self.proc is not None else 0.0)

    def check_alive(self, when: str) -> None:
        """RuntimeError with the end of its log when this incarnation has exited
        (the bench would otherwise fail later on a refused connection)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"lakegate run exited with code {self.proc.returncode} {when}: {self.tail(20)}")

    def kill(self) -> None:
        """SIGKILL the whole process group (driver, Spark JVM, Python workers)."""
        if self.proc is None:
            return
        self.cpu_dead += session_cpu(self.proc.pid)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the leader is not reaped yet: the group is ours
        self.proc.wait(30)
        self._sweep()

    def _sweep(self) -> None:
        """SIGKILL what is left of our own session (processes that left the group), by pid."""
        for pid, _cpu in session_stats(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 120.0) -> None:
        """SIGINT (graceful: the edge fsyncs, the job finishes its batch); then
        SIGKILL whatever of the group is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the leader is not reaped yet: the group is ours
            self.proc.wait(30)
        self._sweep()


GLUE_SCRIPT = r'''"""MQTT -> AMQP 1.0 glue as users write it: a paho subscriber (QoS 1)
that forwards every message with python-qpid-proton. Written and run by
``lakegate bench e2e``; a status file reports counts for the bench."""
import argparse, collections, json, os, queue, threading, time

import paho.mqtt.client as mqtt
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector

p = argparse.ArgumentParser()
p.add_argument("--mqtt-port", type=int, required=True)
p.add_argument("--topic-filter", required=True)
p.add_argument("--client-id", required=True)
p.add_argument("--amqp-url", required=True, help="without credentials: they come from GLUE_AMQP_USER/_PASSWORD")
p.add_argument("--status", required=True)
p.add_argument("--mode", choices=("async", "sync"), default="async")
p.add_argument("--clean-session", action="store_true")
a = p.parse_args()

CREDS = {k: os.environ[e] for k, e in (("user", "GLUE_AMQP_USER"), ("password", "GLUE_AMQP_PASSWORD"))
         if e in os.environ}
stats = {"pid": os.getpid(), "received": 0, "accepted": 0, "failed": 0, "subscribed": False, "amqp": False}


STATUS_LOCK = threading.Lock()  # three threads write the status: one tmp file, one writer at a time


def write_status():
    with STATUS_LOCK:
        tmp = a.status + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(stats, fh)
        os.replace(tmp, a.status)


def status_loop():
    while True:
        write_status()
        time.sleep(0.25)


def address(topic):
    return "/topic/" + topic.replace("/", ".")


class AsyncForwarder(MessagingHandler):
    """Sends what on_message hands over, as far as link credit goes; counts dispositions."""

    def __init__(self):
        super().__init__()
        self.q = queue.SimpleQueue()
        self.pending = collections.defaultdict(collections.deque)
        self.senders = {}
        self.injector = EventInjector()
        self.waking = False

    def submit(self, topic, payload):  # paho's thread
        self.q.put((topic, payload))
        if not self.waking:
            self.waking = True
            self.injector.trigger(ApplicationEvent("glue_wake"))

    def on_start(self, event):
        self.container = event.container
        event.container.selectable(self.injector)
        self.conn = event.container.connect(a.amqp_url, **CREDS)

    def on_connection_opened(self, event):
        stats["amqp"] = True
        write_status()

    def on_glue_wake(self, event):
        self.waking = False
        self.pump()

    def on_sendable(self, event):
        self.pump()

    def pump(self):
        while True:
            try:
                topic, payload = self.q.get_nowait()
            except queue.Empty:
                break
            addr = address(topic)
            if addr not in self.senders:
                self.senders[addr] = self.container.create_sender(self.conn, addr)
            self.pending[addr].append(Message(body=payload, address=topic, durable=True, inferred=True))
        for addr, dq in self.pending.items():
            s = self.senders[addr]
            while dq and s.credit:
                s.send(dq.popleft())

    def on_accepted(self, event):
        stats["accepted"] += 1

    def on_rejected(self, event):
        stats["failed"] += 1

    def on_released(self, event):
        stats["failed"] += 1


class SyncForwarder:
    """One BlockingConnection; send() waits until the peer settled the message."""

    def __init__(self):
        from proton.utils import BlockingConnection

        self.conn = BlockingConnection(a.amqp_url, **CREDS)
        self.senders = {}
        stats["amqp"] = True

    def submit(self, topic, payload):
        addr = address(topic)
        if addr not in self.senders:
            self.senders[addr] = self.conn.create_sender(addr)
        self.senders[addr].send(Message(body=payload, address=topic, durable=True, inferred=True))
        stats["accepted"] += 1


if a.mode == "async":
    fwd = AsyncForwarder()
    threading.Thread(target=Container(fwd).run, daemon=True).start()
else:
    fwd = SyncForwarder()
threading.Thread(target=status_loop, daemon=True).start()


def on_connect(client, userdata, flags, reason_code, properties):
    client.subscribe(a.topic_filter, qos=1)


def on_subscribe(client, userdata, mid, reason_codes, properties):
    stats["subscribed"] = True
    write_status()


def on_message(client, userdata, msg):
    stats["received"] += 1
    fwd.submit(msg.topic, msg.payload)  # paho sends PUBACK when this returns


c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=a.client_id, protocol=mqtt.MQTTv311,
                clean_session=a.clean_session)
c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
c.connect("127.0.0.1", a.mqtt_port, keepalive=30)
c.loop_forever()
'''


class Glue:
    """:data:`GLUE_SCRIPT` as a process; :meth:`status` reads its counts."""

    def __init__(self, workdir: Path, mqtt_port: int, topic_filter: str, amqp: Any, mode: str,
                 client_id: str) -> None:
        from bridge.amqp.sender import peer_url

        amqp_url, user, password = peer_url(amqp)
        self.env = dict(os.environ)
        for key, value in (("GLUE_AMQP_USER", user), ("GLUE_AMQP_PASSWORD", password)):
            if value is not None:
                self.env[key] = value
        self.script = workdir / "glue.py"
        self.script.write_text(GLUE_SCRIPT)
        self.status_path = workdir / "glue-status.json"
        self.log_path = workdir / "glue.log"
        self.cmd = [sys.executable, str(self.script), "--mqtt-port", str(mqtt_port), "--topic-filter",
                    topic_filter, "--client-id", client_id, "--amqp-url", amqp_url,
                    "--status", str(self.status_path), "--mode", mode]
        self.proc: subprocess.Popen | None = None
        self.accepted_before = 0  # accepted by killed incarnations
        self.cpu_dead = 0.0

    def start(self) -> subprocess.Popen:
        self.status_path.unlink(missing_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        return self.proc

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            try:
                tail = " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-8:])
            except OSError:
                tail = "no log"
            raise RuntimeError(f"the glue exited with code {self.proc.returncode}: {tail}")
        st = self.status()
        return bool(st.get("subscribed") and st.get("amqp") and st.get("pid") == self.proc.pid)

    def idle(self) -> bool:
        """Everything the running glue received is settled by the AMQP peer."""
        st = self.status()
        return bool(st) and st.get("received", 0) <= st.get("accepted", 0) + st.get("failed", 0)

    def accepted(self) -> int:
        return self.accepted_before + int(self.status().get("accepted", 0))

    def cpu(self) -> float:
        return self.cpu_dead + ((_cpu_seconds(self.proc.pid) or 0.0) if self.proc is not None else 0.0)

    def kill(self) -> None:
        if self.proc is None:
            return
        self.cpu_dead += _cpu_seconds(self.proc.pid) or 0.0
        self.accepted_before += int(self.status().get("accepted", 0))
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def rabbitmqctl() -> str | None:
    return shutil.which("rabbitmqctl") or next(
        (p for p in ("/usr/sbin/rabbitmqctl", "/usr/lib/rabbitmq/bin/rabbitmqctl") if os.path.exists(p)), None)


def delete_queue(binding: str) -> str:
    """Delete the queue RabbitMQ bound to ``amq.topic`` for the consumer."""
    ctl = rabbitmqctl()
    if ctl is None:
        return f"rabbitmqctl not found: the queue bound to {binding} stays"
    try:
        out = subprocess.run([ctl, "-q", "list_bindings", "destination_name", "routing_key"],
                             capture_output=True, text=True, timeout=60).stdout
        names = [ln.split("\t")[0] for ln in out.splitlines() if ln.split("\t")[-1] == binding]
        for name in names:
            subprocess.run([ctl, "-q", "delete_queue", name], capture_output=True, timeout=60)
        return f"deleted {len(names)} queue(s) bound to {binding}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not delete the queue bound to {binding}: {exc}"


def delete_topic(servers: str, topic: str, timeout: float = 30.0) -> str:
    """Delete the Kafka topic a ``--capture kafka`` run created; what happened,
    in a few words (never raises: the bench's figures stand either way)."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError as exc:
        return f"not deleted: {exc}"
    import logging

    # kept in a name until the future answers: a client collected at once fails its futures (_DESTROY)
    admin = AdminClient({"bootstrap.servers": servers, "logger": logging.getLogger("bridge.bench.rdkafka")})
    try:
        for fut in admin.delete_topics([topic], operation_timeout=timeout).values():
            fut.result(timeout)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"not deleted: {exc}"
    finally:
        del admin
    return "deleted"
