"""Anonymous access beyond loopback must be chosen explicitly (issue 38,
item 9) [LG-edge-anonymous-beyond-loopback].

``lakegate edge --set edge.host=0.0.0.0`` used to start with the default
``edge.allow_anonymous = true`` and say nothing. As Mosquitto 2.0 does, the
default now holds on loopback only; beyond it, without a password file, the
edge does not start (one line naming ``edge.allow_anonymous``, exit code 2),
and with one, anonymous clients are refused (CONNACK 0x87 / 3.x 0x05). Only
``edge.allow_anonymous = true`` set by the user lets them in there.

Tests that bind 0.0.0.0 connect through 127.0.0.1, on a port the kernel picks.
"""

from __future__ import annotations

import logging
import re
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import ConfigError, load_config
from bridge.edge.auth import hash_password, write_password_file
from bridge.edge.exposure import anonymous_allowed, is_loopback
from bridge.edge.server import EdgeServer
from tests.conftest import child_env
from tests.edge.conftest import RawClient, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULE = "LG-edge-anonymous-beyond-loopback"
CONNACK_OK = b"\x20\x02\x00\x00"
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True),
    ("", False), ("0.0.0.0", False), ("::", False), ("192.0.2.10", False),
    ("2001:db8::1", False), ("edge.example", False), ("::ffff:10.0.0.1", False),
])
def test_lg_edge_anonymous_beyond_loopback_what_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def _config(tmp_path, *overrides, env=None, path=None):
    return load_config(path, [f"data_dir={tmp_path / 'data'}", "edge.port=0", *overrides],
                       env=env or {})


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.10"])
def test_lg_edge_anonymous_beyond_loopback_refused_without_the_setting(tmp_path, host):
    cfg = _config(tmp_path, f"edge.host={host}")
    with pytest.raises(ConfigError) as err:
        EdgeServer(cfg)
    line = str(err.value)
    assert line.startswith(f"config error: edge.allow_anonymous: [{RULE}] not set, and the edge "
                           f"listens beyond loopback (edge.port on edge.host = {host!r}")
    assert line.endswith("(from default)") and "\n" not in line


def test_lg_edge_anonymous_beyond_loopback_names_the_tls_listener_too(tmp_path):
    # edge.tls_port binds edge.host too; refused before any certificate is read
    cfg = _config(tmp_path, "edge.host=0.0.0.0", "edge.tls_port=8883", "edge.tls_cert_file=none.pem")
    with pytest.raises(ConfigError, match=r"\(edge\.port and edge\.tls_port on edge\.host = "
                                          r"'0\.0\.0\.0' \(all interfaces\)\)"):
        EdgeServer(cfg)


def test_lg_edge_anonymous_beyond_loopback_a_future_listener_is_checked_alike(tmp_path):
    # a listener of its own (a WebSocket one, say) goes through the same check
    cfg = _config(tmp_path)
    assert anonymous_allowed(cfg) is True
    with pytest.raises(ConfigError, match=r"edge\.ws_port on edge\.host = '0\.0\.0\.0'"):
        anonymous_allowed(cfg, [("edge.ws_port", "0.0.0.0")])


@pytest.mark.parametrize("how", ["set", "file", "environment"])
def test_lg_edge_anonymous_beyond_loopback_explicit_true_is_allowed(tmp_path, how):
    f = tmp_path / "site.toml"
    f.write_text("[edge]\nallow_anonymous = true\n")
    cfg = {
        "set": lambda: _config(tmp_path, "edge.host=0.0.0.0", "edge.allow_anonymous=true"),
        "file": lambda: _config(tmp_path, "edge.host=0.0.0.0", path=f),
        "environment": lambda: _config(tmp_path, "edge.host=0.0.0.0",
                                       env={"LAKEGATE_EDGE_ALLOW_ANONYMOUS": "true"}),
    }[how]()
    assert EdgeServer(cfg).allow_anonymous is True


def test_lg_edge_anonymous_beyond_loopback_the_shipped_file_does_not_choose(tmp_path):
    # conf/lakegate.toml is the defaults: copying it and changing edge.host must not
    # count as choosing anonymous access
    cfg = load_config(ROOT / "conf" / "lakegate.toml", ["edge.host=0.0.0.0"], env={})
    assert "edge.allow_anonymous" not in cfg.sources
    with pytest.raises(ConfigError, match=re.escape(RULE)):
        EdgeServer(cfg)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_lg_edge_anonymous_beyond_loopback_loopback_default_allows_anonymous(run_edge, host):
    e = run_edge(f"edge.host={host}")
    assert e.server.allow_anonymous is True
    c = RawClient(e.port)
    try:
        assert c.connect(4, client_id="anon") == CONNACK_OK
    finally:
        c.close()


@pytest.fixture
def passwords(tmp_path):
    path = tmp_path / "passwd"
    write_password_file(path, {"alice": hash_password(b"wonderland", ln=4)})
    return path


@pytest.mark.parametrize("level, refused", [(4, b"\x20\x02\x00\x05"), (5, b"\x20\x03\x00\x87\x00")])
def test_lg_edge_anonymous_beyond_loopback_password_file_refuses_anonymous(
        run_edge, passwords, level, refused, caplog):
    caplog.set_level(logging.INFO, logger="bridge.edge")
    e = run_edge("edge.host=0.0.0.0", f"edge.password_file={passwords}")
    assert e.server.allow_anonymous is False
    ok, anon = RawClient(e.port), RawClient(e.port)
    try:
        assert ok.connect(level, client_id="a1", username="alice", password=b"wonderland")[3] == 0
        assert anon.connect(level, client_id="a2") == refused
    finally:
        ok.close()
        anon.close()
    msgs = [r.getMessage() for r in caplog.records if r.name == "bridge.edge"]
    assert any(m.startswith("edge: anonymous clients are refused") and RULE in m for m in msgs), msgs
    close = wait_for(lambda: [m for m in (r.getMessage() for r in caplog.records)
                              if m.startswith("close ") and "client=a2" in m], 10.0, "close line")
    assert "[MQTT-3.1.4-2] anonymous access is off beyond loopback" in close[0], close
    assert f"[{RULE}]" in close[0]


def test_lg_edge_anonymous_beyond_loopback_password_file_and_explicit_true(run_edge, passwords):
    e = run_edge("edge.host=0.0.0.0", f"edge.password_file={passwords}", "edge.allow_anonymous=true")
    c = RawClient(e.port)
    try:
        assert c.connect(4, client_id="anon") == CONNACK_OK
    finally:
        c.close()


# ------------------------------------------------------------------ the CLI
def _lakegate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True,
                          timeout=120, env=child_env(), cwd=cwd)


@pytest.mark.subprocess
@pytest.mark.parametrize("command", [["edge", "--port", "0"], ["run", "--set", "edge.port=0"]],
                         ids=lambda c: c[0])
def test_lg_edge_anonymous_beyond_loopback_cli_is_one_line_and_exit_2(command, tmp_path):
    r = _lakegate(tmp_path, *command, "--set", f"data_dir={tmp_path / 'data'}",
                  "--set", "amqp.url=", "--set", "edge.host=0.0.0.0")
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and not _LOG_RECORD.match(x)]
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert lines[0].startswith(f"lakegate: config error: edge.allow_anonymous: [{RULE}] not set, "
                               "and the edge listens beyond loopback (edge.port on edge.host = "
                               "'0.0.0.0' (all interfaces))"), lines[0]
    assert "listening" not in r.stdout
    assert not (tmp_path / "data" / "run.pid").exists()


@pytest.mark.subprocess
def test_lg_edge_anonymous_beyond_loopback_cli_explicit_true_starts(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "edge", "--port", "0", "--set", f"data_dir={tmp_path / 'data'}",
         "--set", "amqp.url=", "--set", "edge.host=0.0.0.0", "--set", "edge.allow_anonymous=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(60), "the edge printed nothing within 60 s"
        line = proc.stdout.readline()
        m = re.search(r"mqtt://0\.0\.0\.0:(\d+)", line)
        assert m, line
        c = RawClient(int(m.group(1)))  # through 127.0.0.1
        try:
            assert c.connect(4, client_id="anon") == CONNACK_OK
        finally:
            c.close()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "edge: anonymous clients are allowed beyond loopback" in err
        assert "from --set edge.allow_anonymous" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
