"""``lakegate doctor``: check the prerequisites and say what is missing.

Checks Java (17+ for Spark), the Python packages lakegate needs, that the data
directory is writable, and whether the AMQP peer and the edge port answer.
Exit code 0 when everything needed to run is present, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import socket
from urllib.parse import urlsplit

from bridge.config import Config, mask_secret
from bridge.javacheck import JavaMissing, require_java

PACKAGES = ("pyspark", "delta", "deltalake", "pyarrow", "pandas", "numpy", "paho.mqtt", "proton")


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


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
    print("all prerequisites present" if ok else "some prerequisites are missing (see FAIL lines)")
    return 0 if ok else 1
