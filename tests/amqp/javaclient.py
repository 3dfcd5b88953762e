"""A second AMQP 1.0 client for the tests: the Qpid protonj2 client (Java),
driven through ``tests/amqp/javaclient/AmqpClient.java`` (issue 39), so
that what lakegate sends is decoded, and what it receives is encoded, by
something that is not python-qpid-proton.

* :func:`available`: whether Java 17+ and the protonj2 jars are there (and
  why not); tests skip with its reason.
* :func:`receive`: a context manager; the receiver is attached when the
  ``with`` body runs (publish there), and after the block the messages are
  in ``.messages`` (each a dict in AmqpClient's JSON shape, typed values as
  ``{"type": "uint", "value": 7}``).
* :func:`send`: sends one message (a dict in the same shape) and returns
  the peer's outcome, e.g. ``{"outcome": "accepted"}``.

Each call starts one JVM through Java's source launcher, which compiles
AmqpClient.java in memory first (the jars are on the class path as they
are, no build step): a whole ``send`` takes about 1 s on the 2-core
machine with :data:`JVM_OPTIONS`, 2 s without.

The jars: ``.jvm/lib/protonj2/`` (git-ignored), filled by
``scripts/bootstrap`` from ``jvm/pom.xml`` (profile ``lib-protonj2``);
``LAKEGATE_PROTONJ2_LIB`` names another folder.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from contextlib import contextmanager

from bridge.javacheck import find_java, java_major

__all__ = ["Availability", "JavaClientError", "Receiving", "available", "body_bytes", "data",
           "receive", "send", "typed"]

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("javaclient") / "AmqpClient.java"
LIB = Path(os.environ.get("LAKEGATE_PROTONJ2_LIB") or ROOT / ".jvm" / "lib" / "protonj2")
#: the JVM's start, the in-memory compile and the connection, before READY (generous: 2 cores, busy)
START_TIMEOUT_S = 60.0
#: a short-lived JVM: C1 only, the serial GC (a send takes about 1 s instead of 2 on 2 cores)
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class JavaClientError(RuntimeError):
    """AmqpClient exited with an error (its exit code and stderr say which)."""

    def __init__(self, what: str, returncode: int | None, stderr: str) -> None:
        super().__init__(f"{what}: AmqpClient exited {returncode}: {stderr.strip()[-2000:]}")
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Availability:
    """``bool(available())``: the client can run; ``reason`` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@functools.lru_cache(maxsize=1)
def available() -> Availability:
    java = find_java()
    if java is None:
        return Availability(False, "no java (JAVA_HOME or PATH): the protonj2 client needs Java 17+")
    major = java_major(java)
    if major is None or major < 17:
        return Availability(False, f"{java} is Java {major}: the protonj2 client needs Java 17+ "
                                   "(its source launcher and this file's syntax)")
    if not any(LIB.glob("protonj2-client-*.jar")):
        return Availability(False, f"no protonj2-client jar in {LIB}: scripts/bootstrap copies "
                                   "org.apache.qpid:protonj2-client and its dependencies there "
                                   "(jvm/pom.xml, profile lib-protonj2)")
    return Availability(True)


def _command(*args: str) -> list[str]:
    java = find_java()
    if java is None or not available():
        raise JavaClientError("not available", None, available().reason)
    return [java, *JVM_OPTIONS, "-cp", f"{LIB}/*", str(SOURCE), *args]


# ---------------------------------------------------------------- message specs


def typed(type_: str, value: Any) -> dict:
    """An AMQP typed value for a spec: ``typed("uint", 7)``; binary takes bytes."""
    if type_ == "binary" and isinstance(value, (bytes, bytearray)):
        value = base64.b64encode(value).decode()
    return {"type": type_, "value": value}


def data(payload: bytes) -> dict:
    """A Data body section."""
    return {"kind": "data", "base64": base64.b64encode(payload).decode()}


def body_bytes(message: dict) -> bytes:
    """The payload of a received message whose body is Data sections."""
    sections = message.get("body") or []
    if any(s.get("kind") != "data" for s in sections):
        raise AssertionError(f"a body that is not Data sections: {sections}")
    return b"".join(base64.b64decode(s["base64"]) for s in sections)


# ---------------------------------------------------------------- the commands


def send(url: str, address: str, message: dict, timeout: float = 15.0) -> dict:
    """Send ``message`` to ``address``; the peer's outcome as AmqpClient prints
    it (``{"outcome": "accepted"}``, ``"rejected"`` with ``condition`` and
    ``description``, ``"released"``, ``"modified"``). Raises
    :class:`JavaClientError` when no outcome came (exit 1) or the connection
    or the link failed (exit 3)."""
    proc = subprocess.run(_command("send", url, address, "-", str(timeout)), input=json.dumps(message),
                          capture_output=True, text=True, timeout=START_TIMEOUT_S + timeout)
    if proc.returncode in (0, 4):  # accepted / another outcome: printed
        return json.loads(proc.stdout.strip().splitlines()[-1])
    raise JavaClientError(f"send to {address}", proc.returncode, proc.stderr)


@dataclass
class Receiving:
    """One running ``AmqpClient receive`` (see :func:`receive`)."""

    url: str
    address: str
    count: int
    timeout: float
    messages: list[dict] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    #: the peer attached the receiver (AmqpClient printed READY)
    attached: bool = False
    _ready: threading.Event = field(default_factory=threading.Event)
    _err: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.proc = subprocess.Popen(_command("receive", self.url, self.address, str(self.count),
                                              str(self.timeout)),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        for target in (self._read_out, self._read_err):
            t = threading.Thread(target=target, daemon=True, name="javaclient-receive")
            t.start()
            self._threads.append(t)
        if not self._ready.wait(START_TIMEOUT_S) or not self.attached:
            self.close()
            raise JavaClientError(f"receive on {self.address}: not attached", self.proc.returncode,
                                  "".join(self._err))

    def _read_out(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "READY":
                self.attached = True
                self._ready.set()
            elif line.strip():
                self.messages.append(json.loads(line))
        self._ready.set()  # ended (before READY: start() fails)

    def _read_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    def wait(self) -> list[dict]:
        """The messages, once ``count`` came; raises :class:`JavaClientError`
        when fewer came within the timeout (``.messages`` has those)."""
        assert self.proc is not None
        try:
            rc = self.proc.wait(self.timeout + 30)
        except subprocess.TimeoutExpired:
            rc = None
        self.close()
        if rc != 0:
            raise JavaClientError(f"receive on {self.address} ({len(self.messages)} of {self.count} "
                                  f"messages: {self.messages})", rc, "".join(self._err))
        return self.messages

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(0 if self.attached else 5)  # ended by itself: its exit code
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for t in self._threads:
            t.join(10)


@contextmanager
def receive(url: str, address: str, count: int, timeout: float = 20.0) -> Iterator[Receiving]:
    """Receive ``count`` messages on ``address``, accepting each::

        with javaclient.receive(url, "/topic/p.#", 1) as got:
            ...  # the receiver is attached: publish
        got.messages  # [{"header": ..., "properties": ..., ...}]

    The block starts once the peer has attached the receiver (READY); on
    leaving it, waits until ``count`` messages came (at most ``timeout``
    seconds after READY: :class:`JavaClientError` with what came)."""
    r = Receiving(url, address, count, timeout)
    r.start()
    try:
        yield r
    except BaseException:
        r.close()
        raise
    r.wait()
