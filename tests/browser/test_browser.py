"""MQTT.js in a real headless Chromium against the edge's WebSocket
listeners (issue 44): a page served on loopback by the test loads MQTT.js
(npm, tests/browser/package-lock.json), connects over ``ws://`` and over
``wss://`` (a certificate made for the test, which Chromium is told to
trust by its key's pin), subscribes, publishes at QoS 0/1/2 and receives
each back, a retained message published before, and a message a TCP
client (paho) publishes when the page says it is ready. Chromium is
Debian's (scripts/services installs it), driven by playwright-core
(run.mjs)."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from bridge.config import load_config
from bridge.edge.thread import EdgeThread
from bridge.ports import free_loopback_port

HERE = Path(__file__).resolve().parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium (scripts/services up installs Debian's)"),
    pytest.mark.skipif(not (HERE / "node_modules" / "playwright-core").is_dir() or shutil.which("node") is None,
                       reason="no node or no tests/browser/node_modules (scripts/bootstrap runs npm ci there)"),
]


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """(certificate, key, SPKI pin) for localhost and 127.0.0.1."""
    d = tmp_path_factory.mktemp("browser-tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    der = ssl.PEM_cert_to_DER_cert(crt.read_text())
    spki = subprocess.run(["openssl", "x509", "-inform", "der", "-pubkey", "-noout"], input=der,
                          capture_output=True, check=True, timeout=30).stdout
    spki_der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=spki, capture_output=True,
                              check=True, timeout=30).stdout
    return crt, key, base64.b64encode(hashlib.sha256(spki_der).digest()).decode()


@pytest.fixture(scope="module")
def site():
    """The page and MQTT.js, served on loopback: its base URL."""
    handler = functools.partial(_Quiet, directory=str(HERE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def edge(tmp_path_factory, cert):
    crt, key, _pin = cert
    ws, wss = free_loopback_port(), free_loopback_port()
    cfg = load_config(None, [f"data_dir={tmp_path_factory.mktemp('browser-edge')}", "edge.port=0",
                             f"edge.ws_port={ws}", f"edge.wss_port={wss}", f"edge.tls_cert_file={crt}",
                             f"edge.tls_key_file={key}", "amqp.url="], env={})
    e = EdgeThread(cfg).start()
    yield e, ws, wss
    e.stop()


class TcpHelper:
    """A paho client over TCP: publishes the retained message before the
    page connects, and a live one when the page publishes ``.../ready``."""

    def __init__(self, port: int, topic: str) -> None:
        self.topic = topic
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"tcp-{topic}", protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *_a: subscribed.set()
        self.c.on_message = self._ready
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.c.subscribe(f"{topic}/ready", qos=1)
        assert subscribed.wait(10)
        self.c.publish(f"{topic}/kept", b"retained before the page came", qos=1, retain=True).wait_for_publish(10)

    def _ready(self, _c, _u, msg) -> None:
        if msg.topic.endswith("/ready"):
            self.c.publish(f"{self.topic}/tcp", b"from a TCP client", qos=1)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _run_page(site: str, url: str, topic: str, pin: str, home: Path, timeout_ms: int = 20000) -> dict:
    cfg = {"url": url, "topic": topic, "clientId": f"browser-{topic}", "expect": 6, "timeoutMs": timeout_ms}
    # (HOME: Chromium's caches go to the test's own folder)
    r = subprocess.run(["node", str(HERE / "run.mjs"), f"{site}/page.html", json.dumps(cfg), pin], cwd=HERE,
                       capture_output=True, text=True, timeout=90,
                       env={"CHROMIUM": CHROMIUM, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_mqtt_js_in_headless_chromium_over_websockets(edge, site, cert, scheme, tmp_path):
    e, ws, wss = edge
    topic = f"browser-{scheme}"
    helper = TcpHelper(e.port, topic)
    try:
        port = ws if scheme == "ws" else wss
        host = "127.0.0.1" if scheme == "ws" else "localhost"
        result = _run_page(site, f"{scheme}://{host}:{port}/mqtt", topic, cert[2], tmp_path)
    finally:
        helper.close()
    assert result["connected"] and not result["errors"], result
    assert result["granted"] == [2]
    assert sorted(result["acked"]) == [0, 1, 2]
    got = sorted((m["topic"], m["payload"], m["qos"], m["retain"]) for m in result["messages"])
    assert got == sorted([
        (f"{topic}/kept", "retained before the page came", 1, True),
        (f"{topic}/q0", "from the browser at QoS 0", 0, False),
        (f"{topic}/q1", "from the browser at QoS 1", 1, False),
        (f"{topic}/q2", "from the browser at QoS 2", 2, False),
        (f"{topic}/ready", "", 1, False),
        (f"{topic}/tcp", "from a TCP client", 1, False),
    ]), result


def test_wss_with_a_certificate_chromium_does_not_trust_is_refused(edge, site, cert, tmp_path):
    """The wss run above passes because of the pin: without it Chromium
    refuses the test's certificate, and the page never connects."""
    _e, _ws, wss = edge
    result = _run_page(site, f"wss://localhost:{wss}/mqtt", "browser-untrusted", "", tmp_path, timeout_ms=4000)
    assert not result["connected"] and result["errors"], result
