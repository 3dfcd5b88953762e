"""``lakegate doctor``: check the prerequisites and say what is missing.

Checks Java (17+ for Spark), the Python packages lakegate needs, the JVM
jar groups ``scripts/bootstrap`` resolves into ``.jvm/lib`` (delta-spark,
Spark's Kafka connector: :data:`bridge.spark.jars.GROUPS`), that the data
directory is writable, and whether the AMQP peer and the edge port answer;
then prints the spark-submit line to use. Exit code 0 when everything needed
to run is present, 1 otherwise: a group missing is a warning (the embedded
default writes its tables with delta-rs), unless ``tables.engine =
"delta-spark"`` needs it; a jar of another Spark or Scala line fails (it
would stop spark-submit with ``conf/spark-defaults.conf``).
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import socket
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from bridge.config import Config, mask_secret
from bridge.javacheck import JavaMissing, require_java

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pyspark", "delta", "deltalake", "pyarrow", "pandas", "numpy", "paho.mqtt", "proton")


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _jar_groups(config: Config, line: Callable[[str, str], None]) -> bool:
    """One line per JVM jar group: ok with its jars and their versions, or
    what is wrong and the command that mends it; False when one fails."""
    from bridge.spark import jars

    ok = True
    for name, group in jars.GROUPS.items():
        bad = jars.problems(name)
        if not bad:
            line("ok", f"jvm jars {name} ({jars.jvm_dir() / 'lib' / name}): {jars.summary(name)}")
            continue
        missing = not any(p.name.startswith(group.artifact) for p in jars.jars(name))
        needed = name == "delta" and config.tables.engine == "delta-spark"
        if missing and not needed:
            tail = "; tables go through delta-rs" if name == "delta" else ""
            line("warn", f"jvm jars {name}: {bad[0]}{tail}")
        else:
            ok = False
            line("FAIL", f"jvm jars {name}: {'; '.join(bad)}")
    return ok


def _submit_line() -> str:
    from bridge.spark.jars import submit_options

    return shlex.join(["spark-submit", *submit_options(), "jobs/process_packets.py", "--config", "conf/lakegate.toml"])


def run(args: argparse.Namespace, config: Config) -> int:
    ok = True

    def line(status: str, what: str) -> None:
        print(f"{status:5} {what}")

    try:
        major = require_java()
        line("ok", f"java {major}")
    except JavaMissing as exc:
        ok = False
        line("FAIL", str(exc).removeprefix("lakegate: "))
    for name in PACKAGES:
        try:
            mod = importlib.import_module(name)
            line("ok", f"python package {name} {getattr(mod, '__version__', '')}".rstrip())
        except ImportError as exc:
            ok = False
            line("FAIL", f"python package {name}: {exc}")
    ok = _jar_groups(config, line) and ok
    data = config.data_path
    try:
        data.mkdir(parents=True, exist_ok=True)
        probe = data / ".doctor-probe"
        probe.write_bytes(b"x")
        probe.unlink()
        line("ok", f"data_dir {data} is writable")
    except OSError as exc:
        ok = False
        line("FAIL", f"data_dir {data}: {exc.strerror}")
    if config.amqp.url:
        u = urlsplit(config.amqp.url)
        port = u.port or (5671 if u.scheme == "amqps" else 5672)
        up = _port_open(u.hostname or "127.0.0.1", port)
        line("ok" if up else "warn", f"amqp peer {mask_secret('amqp.url', config.amqp.url)} "
             + ("answers" if up else "does not answer (forwarding waits for it; scripts/services up starts RabbitMQ)"))
    else:
        line("ok", "amqp forwarding off (amqp.url is empty)")
    busy = _port_open(config.edge.host, config.edge.port)
    line("info", f"edge port {config.edge.host}:{config.edge.port} " + ("is in use (an edge running?)" if busy else "is free"))
    line("info", f"spark-submit (from {ROOT}): {_submit_line()}")
    print("all prerequisites present" if ok else "some prerequisites are missing (see FAIL lines)")
    return 0 if ok else 1
