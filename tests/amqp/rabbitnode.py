"""A private RabbitMQ node for tests that stop the broker.

The shared RabbitMQ on 5672 serves everyone's tests; stopping it would break
them. This starts a second node of the same installation, on free loopback
ports, with its own name, cookie, database and log directories under a
temporary directory and only the ``rabbitmq_amqp1_0`` plugin, and stops only
that node (``rabbitmqctl -n <node> stop``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from bridge.ports import free_loopback_port as _free_port

__all__ = ["RabbitNode", "find_rabbitmq"]


def find_rabbitmq() -> tuple[str, str] | None:
    """(rabbitmq-server, rabbitmqctl) that run as the current user, or None.

    Debian's /usr/sbin wrappers switch to the rabbitmq user; the scripts in
    /usr/lib/rabbitmq/bin run as whoever calls them.
    """
    for d in ("/usr/lib/rabbitmq/bin",):
        server, ctl = os.path.join(d, "rabbitmq-server"), os.path.join(d, "rabbitmqctl")
        if os.access(server, os.X_OK) and os.access(ctl, os.X_OK):
            return server, ctl
    server, ctl = shutil.which("rabbitmq-server"), shutil.which("rabbitmqctl")
    if server and ctl and not server.startswith("/usr/sbin"):
        return server, ctl
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitNode:
    """One private node: :meth:`start`, :meth:`stop` (and start again)."""

    def __init__(self, base: Path) -> None:
        found = find_rabbitmq()
        if found is None:
            raise RuntimeError("no RabbitMQ installation to start a private node from")
        self.server, self.ctl = found
        self.base = base
        self.port = _free_port()
        self.dist_port = _free_port()
        self.node = f"lgtest-{uuid.uuid4().hex[:8]}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        home = base / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        (base / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (base / "rabbitmq-env.conf").write_text("")
        self.env = dict(
            os.environ,
            HOME=str(home),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_PID_FILE=str(base / "node.pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(base / "plugins-expand"),
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self.ctl, "-n", self.node, *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def start(self, timeout: float = 90) -> None:
        log = open(self.base / "server.out", "ab")
        self.proc = subprocess.Popen([self.server], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"private RabbitMQ node exited ({self.proc.returncode}); see {self.base}/server.out")
            if time.monotonic() > deadline:
                raise RuntimeError(f"private RabbitMQ node did not answer within {timeout}s")
            try:  # wait for the boot, bounded; returns early when the node is up
                self._ctl("await_startup", "--timeout", "5", timeout=10)
            except subprocess.TimeoutExpired:
                pass
        r = self._ctl("await_startup", "--timeout", str(int(max(deadline - time.monotonic(), 5))))
        if r.returncode != 0:
            raise RuntimeError(f"private RabbitMQ node did not start: {r.stderr.strip()}")

    def stop(self, timeout: float = 60) -> None:
        """``rabbitmqctl stop`` for this node only; waits for the VM to exit."""
        if self.proc is None:
            return
        self._ctl("stop", timeout=timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
