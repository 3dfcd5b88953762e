"""``lakegate passwd`` and ``lakegate edge`` from the command line."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
import sys

import pytest

from bridge.cli import main
from bridge.edge.auth import (
    PasswordFile, PasswordFileError, hash_password, read_password_file, verify_password,
)
from tests.edge.conftest import RawClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _passwd(monkeypatch, capsys, *argv, stdin: str = ""):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["passwd", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_passwd_adds_changes_and_deletes(tmp_path, monkeypatch, capsys):
    path = tmp_path / "pw"
    code, out, _ = _passwd(monkeypatch, capsys, str(path), "alice", "--password-stdin",
                           stdin="first secret\n")
    assert code == 0 and out.strip() == f"added user 'alice' in {path}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "first secret" not in text and re.search(r"^alice:\$scrypt\$ln=15,r=8,p=1\$", text, re.M)
    _passwd(monkeypatch, capsys, str(path), "bob", "--password-stdin", stdin="b0b\n")
    code, out, _ = _passwd(monkeypatch, capsys, str(path), "alice", "--password-stdin",
                           stdin="second\n")
    assert out.startswith("changed user 'alice'")
    users = read_password_file(path)
    assert set(users) == {"alice", "bob"}
    assert verify_password(b"second", users["alice"]) and not verify_password(b"first secret",
                                                                             users["alice"])
    code, out, _ = _passwd(monkeypatch, capsys, str(path), "alice", "--delete")
    assert code == 0 and set(read_password_file(path)) == {"bob"}
    code, _, err = _passwd(monkeypatch, capsys, str(path), "alice", "--delete")
    assert code == 2 and "is not in" in err


def test_passwd_refuses_an_empty_password_and_a_missing_terminal(tmp_path, monkeypatch, capsys):
    code, _, err = _passwd(monkeypatch, capsys, str(tmp_path / "pw"), "a", "--password-stdin",
                           stdin="\n")
    assert code == 2 and "empty password" in err
    code, _, err = _passwd(monkeypatch, capsys, str(tmp_path / "pw"), "a")
    assert code == 2 and "--password-stdin" in err
    assert not (tmp_path / "pw").exists()


def test_password_file_checks_and_rereads(tmp_path):
    path = tmp_path / "pw"
    path.write_text(f"u:{hash_password(b'one', ln=4)}\n")
    pf = PasswordFile(path)
    assert pf.check("u", b"one") and not pf.check("u", b"two") and not pf.check("x", b"one")
    assert not pf.check("u", None) and not pf.check(None, b"one")
    path.write_text(f"u:{hash_password(b'two', ln=4)}\n")
    os.utime(path, ns=(1, 1))  # a different mtime, whatever the clock's resolution
    assert pf.check("u", b"two") and "one" not in repr(pf)


def test_a_malformed_password_file_names_the_line(tmp_path):
    path = tmp_path / "pw"
    path.write_text("# comment\n\nu:$scrypt$ln=x$$\n")
    with pytest.raises(PasswordFileError, match=r"pw:3: user 'u'"):
        read_password_file(path)


def test_allow_anonymous_false_needs_a_password_file(tmp_path, capsys):
    code = main(["edge", "--port", "0", "--set", f"data_dir={tmp_path}",
                 "--set", "edge.allow_anonymous=false"])
    assert code == 2
    assert "edge.allow_anonymous: false needs edge.password_file" in capsys.readouterr().err


def test_ack_after_forward_needs_forwarding_on(tmp_path, capsys):
    code = main(["edge", "--port", "0", "--set", f"data_dir={tmp_path}",
                 "--set", "edge.ack_after=forward", "--set", "amqp.url="])
    assert code == 2
    assert 'edge.ack_after: "forward" needs amqp.url' in capsys.readouterr().err


@pytest.mark.subprocess
def test_lakegate_edge_prints_its_address_and_stops_gracefully_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "edge", "--port", "0", "--set",
                             f"data_dir={tmp_path}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.match(r"lakegate edge listening on mqtt://127\.0\.0\.1:(\d+) \(capture log (.*)\)$",
                     line.strip())
        assert m, line
        c = RawClient(int(m.group(1)))
        assert c.connect(5, client_id="cli")[:4] == b"\x20\x0e\x00\x00"
        proc.send_signal(signal.SIGTERM)
        assert c.packet() == b"\xe0\x01\x8b" and c.closed()
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert "open " in err and "close " in err and "server shutting down" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
