"""The Spark driver JVM as a process: is it alive, and forgetting a dead one.

A local session (``lakegate run``, ``lakegate process``) starts its JVM as a
child of this Python process (PySpark's ``launch_gateway``). The kernel's
out-of-memory killer may end that child alone; ``jvm_exit`` says so, and
``discard_session`` clears what PySpark keeps about it (class-level gateway,
context and session) so that the next ``build_session`` starts a new JVM.
Under spark-submit the JVM is this process's parent and neither applies;
there, signals sent to spark-submit reach the JVM, not Python, and
``on_jvm_signals`` routes them to Python (the job stops after its batch).
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["describe_exit", "discard_session", "jvm_exit", "jvm_pid", "on_jvm_signals", "quiet_accumulator_server"]

log = logging.getLogger(__name__)


def _proc(spark: "SparkSession"):
    gateway = getattr(spark.sparkContext, "_gateway", None)
    return getattr(gateway, "proc", None)


def jvm_pid(spark: "SparkSession") -> int | None:
    """The pid of the session's JVM when this process started it, else None."""
    proc = _proc(spark)
    return None if proc is None else proc.pid


def jvm_exit(spark: "SparkSession", wait_s: float = 0.0) -> int | None:
    """The JVM's exit status (negative: killed by that signal) once the JVM this
    process started has exited; None while it runs, or when this process did
    not start it (spark-submit).

    ``wait_s``: wait up to this long for it to exit (a dead JVM's sockets
    refuse connections a moment before its exit status is there to collect)."""
    import subprocess

    proc = _proc(spark)
    if proc is None:
        return None
    try:
        return proc.wait(wait_s) if wait_s > 0 else proc.poll()
    except subprocess.TimeoutExpired:
        return None


def quiet_accumulator_server(spark: "SparkSession") -> None:
    """PySpark's accumulator server prints a traceback to stderr when the JVM's
    connection to it ends abruptly (the JVM was killed); log it at debug level."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        def handle_error(request: object, client_address: object) -> None:
            log.debug("accumulator server: connection from the JVM %s ended abruptly", client_address)

        server.handle_error = handle_error


def describe_exit(code: int) -> str:
    """``-9`` -> ``killed by SIGKILL (the out-of-memory killer sends this)``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's out-of-memory killer sends this)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {code}"


def discard_session(spark: "SparkSession") -> None:
    """Forget a session whose JVM has exited, without calling into it.

    Closes the Python side of the gateway (client connections, callback
    server) and resets PySpark's class-level state, so that the next
    ``SparkSession.builder.getOrCreate()`` launches a new JVM."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    sc = spark.sparkContext
    gateway = getattr(sc, "_gateway", None)
    quiet = logging.getLogger("py4j")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # py4j logs every failed socket operation with its traceback
    try:
        if gateway is not None:
            try:
                gateway.shutdown_callback_server()
                gateway._gateway_client.close()  # noqa: SLF001 - no public API closes only the client side
            except Exception as exc:
                log.debug("closing the dead JVM's gateway: %s", exc)
            proc = getattr(gateway, "proc", None)
            if proc is not None:
                proc.poll()  # reaps it
        accumulators = getattr(sc, "_accumulatorServer", None)
        if accumulators is not None:
            try:
                accumulators.shutdown()
            except Exception as exc:
                log.debug("stopping the accumulator server: %s", exc)
            sc._accumulatorServer = None  # noqa: SLF001
        sc._jsc = None  # noqa: SLF001
        with SparkContext._lock:  # noqa: SLF001
            SparkContext._active_spark_context = None  # noqa: SLF001
            SparkContext._gateway = None  # noqa: SLF001
            SparkContext._jvm = None  # noqa: SLF001
        SparkSession._instantiatedSession = None  # noqa: SLF001
        SparkSession._activeSession = None  # noqa: SLF001
        try:
            from pyspark.sql.context import SQLContext

            SQLContext._instantiatedContext = None  # noqa: SLF001
        except ImportError:  # pragma: no cover - pyspark without the classic SQLContext
            pass
    finally:
        quiet.setLevel(level)


class _JvmSignalHandler:
    """A ``sun.misc.SignalHandler`` implemented in Python (py4j callback)."""

    def __init__(self, name: str, callback: "Callable[[str], None]") -> None:
        self.name = name
        self.callback = callback

    def handle(self, _signal: object) -> None:
        self.callback(self.name)

    class Java:
        implements = ["sun.misc.SignalHandler"]


def on_jvm_signals(spark: "SparkSession", callback: "Callable[[str], None]",
                   names: tuple[str, ...] = ("TERM", "INT")) -> "Callable[[], None]":
    """Have the JVM call ``callback(name)`` on these signals instead of shutting down.

    Under spark-submit the JVM is the parent process: SIGTERM to spark-submit
    (a scheduler stopping the job), or SIGINT to its process group (Ctrl-C),
    would start the JVM's shutdown, which stops the SparkContext under the
    running batch and exits 143 or 130. With this, the signal only calls back
    into Python, which lets the batch finish and exits 0. Returns a function
    that puts the previous handlers back."""
    from pyspark.java_gateway import ensure_callback_server_started

    sc = spark.sparkContext
    gateway = sc._gateway  # noqa: SLF001 - py4j handles, no public API
    ensure_callback_server_started(gateway)
    jsignal = sc._jvm.sun.misc.Signal  # noqa: SLF001
    previous = []
    for name in names:
        sig = jsignal(name)
        previous.append((sig, jsignal.handle(sig, _JvmSignalHandler(name, callback))))

    def restore() -> None:
        for sig, handler in previous:
            try:
                jsignal.handle(sig, handler)
            except Exception as exc:  # the JVM is going away
                log.debug("restoring the JVM's %s handler: %s", sig, exc)

    return restore
