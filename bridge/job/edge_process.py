"""``lakegate run``'s edge in a supervised child process (``edge.own_process``).

Why a process: in one process the edge shares the interpreter lock with
the Spark driver, the live forwarder and the retained table reader. Under
a retained flood that held a well-behaved publisher's PUBACKs for seconds
(issue 38, item 8), and the GIL hand-offs between busy threads alone
(5 ms switch interval each) put its p99 above 50 ms. A process of its own
keeps the edge's latency what it is under ``lakegate edge``; the job and
the forwarder read the capture log's files, as they do next to a separate
``lakegate edge``.

The child is :mod:`bridge.commands.edge_child` (its protocol is there). This
side:

* starts it with the run's exact configuration over a pipe, waits for its
  "ready" line and returns its addresses; a failure to start is the
  child's one line on stderr and :class:`EdgeStartFailed` with its exit
  code (the CLI prints nothing more);
* stops it with SIGTERM (graceful: DISCONNECT 0x8B, fsync) and, after the
  grace, SIGKILL. It stays in the run's process group: a terminal's Ctrl-C,
  ``timeout`` or systemd signal both, and each stops gracefully (the edge
  first is not needed: the query reads only what is durable); a kill of
  the group kills both, and CPU accounting by session sees both;
* notices when it died by itself: :attr:`restartable` when a signal killed
  it (the out-of-memory killer picks big processes), and the run starts it
  again on the same ports (what it acknowledged is in the capture log; its
  sessions come back from the journal, as after any SIGKILL); when it
  stopped because its capture log failed (:attr:`failed`), the run stops
  with exit 1, as before;
* hands the run's live forwarder the read end of the "records are durable"
  pipe (:meth:`wake_on_durable`).

If the run itself is killed, the child sees end of file on its stdin and
stops: no edge outlives its run.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bridge.config import Config
from bridge.config_render import config_to_wire

__all__ = ["EdgeProcess", "EdgeStartFailed"]

log = logging.getLogger("bridge.run")

#: the package's parent directory: the child imports ``bridge`` from here whatever the working directory
_ROOT = str(Path(__file__).resolve().parents[2])


class EdgeStartFailed(Exception):
    """The edge's process exited before it accepted connections; it said why on stderr."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"the edge's process exited with status {exit_code} before it was ready")
        self.exit_code = exit_code or 1


class EdgeProcess:
    """The edge in a child process; the same surface as the in-process ``EdgeThread``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.error: BaseException | None = None
        #: the capture log's failure, as the child reported it when it stopped
        self.failed: str | None = None
        self.addresses: list[tuple[str, int, bool]] = []
        #: the child's metrics endpoint (host, port), None without one
        self.metrics_address: tuple[str, int] | None = None
        self.started_at = 0.0
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        #: the thread that starts the process, every time: made at the first start, before the run lowers
        #: its own priority (``job.run_nice``; a niceness is per thread and inherited), so that a restarted
        #: edge has the priority the first one had
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="lakegate-edge-spawn")

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> list[tuple[str, int, bool]]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        spec = {"config": config_to_wire(self.config), "durable_fd": self._wake_w,
                "metrics": bool(self.config.metrics.port)}
        self._ready.clear()
        self._stopped.clear()
        self.failed = None
        self.proc = self._spawner.submit(
            subprocess.Popen, [sys.executable, "-m", "bridge.commands.edge_child"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, pass_fds=(self._wake_w,)).result()
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
        self.proc.stdin.flush()  # and kept open: its end of file tells the child the run is gone
        threading.Thread(target=self._read, args=(self.proc,), name="lakegate-edge-child", daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise EdgeStartFailed(self.proc.returncode)
            if time.monotonic() > deadline:
                self._kill()
                raise RuntimeError(f"the edge did not start within {timeout:.0f}s")
        self.started_at = time.monotonic()
        log.info("edge: process %d (its own interpreter), %s", self.proc.pid,
                 ", ".join(f"{h}:{p}{' tls' if t else ''}" for h, p, t in self.addresses))
        return self.addresses

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                sys.stdout.write(raw.decode(errors="replace"))  # not ours: a library's print
                continue
            if msg.get("ready"):
                self.addresses = [(h, int(p), bool(t)) for h, p, t in msg["addresses"]]
                self.metrics_address = tuple(msg["metrics"]) if msg.get("metrics") else None
                self._ready.set()
            elif msg.get("stopped"):
                self.failed = msg.get("failed")
                self._stopped.set()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful shutdown), SIGKILL after ``timeout``."""
        self._stopping = True
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("edge: process %d did not stop within %.0f s; killing it", proc.pid, timeout)
            self._kill()
        self._stopped.wait(1.0)  # its last line, read by _read

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> list[tuple[str, int, bool]]:
        """Start it again on the ports it had (``edge.port = 0`` picked them once)."""
        for host, port, tls in self.addresses:
            if tls:
                self.config.edge.tls_port = port
            else:
                self.config.edge.port = port
        self._stopping = False
        return self.start()

    # ------------------------------------------------------------ state
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def exit_status(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    @property
    def stopped_from_outside(self) -> bool:
        """It shut down gracefully on a signal this side did not send (a
        terminal's Ctrl-C, ``timeout``, systemd: the run got it too)."""
        return self.exit_status == 0 and not self._stopping

    @property
    def restartable(self) -> bool:
        """It died by a signal nobody here sent (not stopped, no capture log
        failure), or its capture log's storage did not answer (Kafka down:
        exit 75, at start or while running): starting it again mends both."""
        from bridge.capture.errors import EXIT_UNAVAILABLE

        code = self.exit_status
        if code is None or self._stopping:
            return False
        return (code < 0 and self.failed is None) or code == EXIT_UNAVAILABLE

    def wake_on_durable(self, live: Any) -> None:
        """Wake ``live`` (a LiveForwarder) whenever the edge made records durable."""
        live.attach_fd(self._wake_r)

    def close(self) -> None:
        self._spawner.shutdown(wait=False)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
