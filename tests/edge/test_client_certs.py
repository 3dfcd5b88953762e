"""Client certificates on the TLS listener (bridge/edge/tls.py, issue 44
item 3): a test CA made with ``openssl ca`` issues the server's and the
devices' certificates (one expired, one revoked and in the CRL, one for
server use only) and a second CA one more; Mosquitto's own
``mosquitto_sub`` / ``mosquitto_pub`` connect with a device certificate and
are authorised by the ACL under its CN."""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from bridge.edge.tls import identity
from bridge.ports import free_loopback_port
from tests.edge.conftest import wait_records
from tests.edge.util import connect
from tests.waiting import wait_for

CNF = """[ ca ]
default_ca = CA_default
[ CA_default ]
dir = {dir}
database = $dir/index.txt
new_certs_dir = $dir/newcerts
certificate = $dir/ca.pem
private_key = $dir/ca.key
serial = $dir/serial
crlnumber = $dir/crlnumber
default_md = sha256
default_days = 1
default_crl_days = 1
policy = policy_any
unique_subject = no
[ policy_any ]
commonName = supplied
organizationName = optional
[ server_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
[ client_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectAltName = DNS:dev1.fleet.example
[ server_only_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
"""


def _run(*args, cwd: Path) -> None:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr)


class Pki:
    """A CA in ``dir`` (``openssl ca``): :meth:`issue` a certificate and key."""

    def __init__(self, d: Path, name: str) -> None:
        self.dir = d
        (d / "newcerts").mkdir(parents=True)
        (d / "index.txt").write_text("")
        (d / "serial").write_text("01\n")
        (d / "crlnumber").write_text("01\n")
        (d / "openssl.cnf").write_text(CNF.format(dir=d))
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        self.ca = d / "ca.pem"

    def issue(self, name: str, subject: str, ext: str, *dates: str) -> tuple[Path, Path]:
        d = self.dir
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=d)
        _run("openssl", "ca", "-config", "openssl.cnf", "-batch", "-notext", "-in", f"{name}.csr", "-out",
             f"{name}.pem", "-extensions", ext, *dates, cwd=d)
        return d / f"{name}.pem", d / f"{name}.key"

    def revoke(self, cert: Path) -> Path:
        _run("openssl", "ca", "-config", "openssl.cnf", "-revoke", str(cert), cwd=self.dir)
        _run("openssl", "ca", "-config", "openssl.cnf", "-gencrl", "-out", "crl.pem", cwd=self.dir)
        return self.dir / "crl.pem"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = Pki(tmp_path_factory.mktemp("pki") / "ca", "lakegate test CA")
    other = Pki(tmp_path_factory.mktemp("pki-other") / "ca", "another CA")
    out = {"ca": ca.ca, "server": ca.issue("server", "/CN=localhost", "server_ext"),
           "dev1": ca.issue("dev1", "/O=Fleet/CN=dev1", "client_ext"),
           "expired": ca.issue("expired", "/CN=old", "client_ext", "-startdate", "20200101000000Z",
                               "-enddate", "20200102000000Z"),
           "revoked": ca.issue("revoked", "/CN=stolen", "client_ext"),
           "server-only": ca.issue("serveronly", "/CN=wrongusage", "server_only_ext"),
           "other-ca": other.issue("foreign", "/CN=dev1", "client_ext")}
    out["crl"] = ca.revoke(out["revoked"][0])
    return out


@pytest.fixture
def cert_edge(run_edge, pki, tmp_path):
    """A function: overrides -> an EdgeThread whose TLS listener asks for client certificates."""
    def start(*overrides: str):
        acl = tmp_path / "acl"
        acl.write_text("user dev1\ntopic readwrite fleet/dev1/#\n")
        cert, key = pki["server"]
        return run_edge(f"edge.tls_port={free_loopback_port()}", f"edge.tls_cert_file={cert}",
                        f"edge.tls_key_file={key}", f"edge.tls_client_ca_file={pki['ca']}",
                        f"edge.tls_crl_file={pki['crl']}", f"edge.acl_file={acl}", *overrides)
    return start


def _tls_client(port: int, pki, device: str | None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if device is not None:
        ctx.load_cert_chain(*map(str, pki[device]))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(sock, server_hostname="localhost")


def _packet(s: ssl.SSLSocket) -> bytes:
    data = s.recv(2)
    return data + (s.recv(data[1]) if len(data) == 2 and data[1] else b"")


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto clients not installed "
                    "(scripts/services up installs them)")
def test_done_when_mosquitto_clients_with_a_device_certificate_are_authorised_by_the_acl_under_its_cn(
        cert_edge, pki):
    e = cert_edge("edge.require_certificate=true", "edge.cert_identity=cn")
    cert, key = map(str, pki["dev1"])
    tls = ["-h", "localhost", "-p", str(e.tls_port), "--cafile", str(pki["ca"]), "--cert", cert, "--key", key]
    sub = subprocess.Popen(["mosquitto_sub", *tls, "-i", "dev1-sub", "-t", "fleet/dev1/#", "-C", "1", "-W", "20",
                            "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: e.call(lambda: any(c.session.client_id == "dev1-sub" for c in e.server.conns
                                            if c.session is not None)), 10, "mosquitto_sub connected")
        wait_for(lambda: e.call(lambda: len(e.server.router.tree) > 0), 10, "its subscription")
        subprocess.run(["mosquitto_pub", *tls, "-i", "dev1-pub", "-t", "fleet/dev1/temp", "-m", "21.5", "-q", "1"],
                       check=True, capture_output=True, timeout=20)
        out, err = sub.communicate(timeout=25)
    finally:
        sub.kill()
    assert out.strip() == "fleet/dev1/temp 21.5", err
    # the CONNECTs are recorded under the certificate's name
    recs = wait_records(e.server.config, lambda r: r.value[:1] == b"\x10", 2)
    assert {dict(r.headers).get("username") for r in recs} == {b"dev1"}


def test_the_certificate_name_is_the_user_for_the_acl_whatever_the_connect_says(cert_edge, pki):
    """The CONNECT's user name and password are not used: the ACL grants
    dev1's topics and refuses another device's [LG-acl-subscribe]."""
    e = cert_edge("edge.require_certificate=true", "edge.cert_identity=cn")
    s = _tls_client(e.tls_port, pki, "dev1")
    s.sendall(connect(4, client_id="claims-to-be-dev2", username="dev2", password=b"whatever"))
    assert _packet(s) == b"\x20\x02\x00\x00"
    s.sendall(bytes((0x82, 17, 0, 1, 0, 12)) + b"fleet/dev1/#" + b"\x01")
    assert _packet(s) == b"\x90\x03\x00\x01\x01"
    s.sendall(bytes((0x82, 17, 0, 2, 0, 12)) + b"fleet/dev2/#" + b"\x01")
    assert _packet(s) == b"\x90\x03\x00\x02\x80"
    s.close()


@pytest.mark.parametrize("device, why", [
    (None, "certificate"),             # required, none sent
    ("expired", "expired"),
    ("revoked", "revoked"),
    ("other-ca", "issuer"),
    ("server-only", "purpose"),        # a certificate for servers, not clients
])
def test_lg_edge_tls_handshake_an_invalid_or_missing_certificate_fails_the_handshake_in_one_line(
        cert_edge, pki, caplog, device, why):
    e = cert_edge("edge.require_certificate=true", "edge.cert_identity=cn")
    got = None
    with caplog.at_level(logging.INFO, logger="bridge.edge"):
        try:
            s = _tls_client(e.tls_port, pki, device)
            s.sendall(connect(4, client_id="refused"))
            got = s.recv(4)  # TLS 1.3: the server's alert comes after the client's side finished
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            pass
        lines = wait_for(lambda: [r.getMessage() for r in caplog.records
                                  if "TLS handshake failed" in r.getMessage()], 10, "the line")
    assert not got  # no CONNACK
    assert len(lines) == 1 and "LG-edge-tls-handshake" in lines[0] and why in lines[0].lower(), lines
    assert e.call(lambda: e.server.stats.get("connections", 0)) == 0  # no MQTT connection started


@pytest.mark.parametrize("level, code", [(5, 0x87), (4, 0x05)])
def test_lg_edge_cert_identity_a_tls_client_without_a_certificate_gets_not_authorized(cert_edge, pki, level,
                                                                                      code):
    """Certificates optional (edge.require_certificate = false), but the
    user name comes from one: a client without one is refused in CONNACK."""
    e = cert_edge("edge.cert_identity=cn")
    s = _tls_client(e.tls_port, pki, None)
    s.sendall(connect(level, client_id="anon"))
    ack = _packet(s)
    assert ack[0] == 0x20 and ack[-1 if level == 4 else 3] == code, ack
    s.close()


def test_identity_kinds_from_a_real_certificate(cert_edge, pki):
    """cn, subject (RFC 2253, as Mosquitto's use_subject_as_username), san."""
    e = cert_edge("edge.cert_identity=subject")
    s = _tls_client(e.tls_port, pki, "dev1")
    s.sendall(connect(4, client_id="subj"))
    assert _packet(s) == b"\x20\x02\x00\x00"
    (rec,) = wait_records(e.server.config, lambda r: r.key == b"subj", 1)
    # as OpenSSL prints it with RFC 2253 flags (what Mosquitto's use_subject_as_username takes)
    printed = subprocess.run(["openssl", "x509", "-in", str(pki["dev1"][0]), "-noout", "-subject", "-nameopt",
                              "RFC2253"], capture_output=True, text=True, check=True, timeout=30).stdout
    assert dict(rec.headers)["username"].decode() == printed.strip().removeprefix("subject=")
    s.close()
    peer = {"subject": ((("organizationName", "Fleet"),), (("commonName", "dev1"),)),
            "subjectAltName": (("DNS", "dev1.fleet.example"),)}
    assert identity(peer, "cn") == "dev1"
    assert identity(peer, "subject") == "CN=dev1,O=Fleet"
    assert identity(peer, "san") == "dev1.fleet.example"
    assert identity({"subject": ((("commonName", "a,b"),),)}, "subject") == "CN=a\\,b"
    assert identity(None, "cn") is None and identity(peer, "none") is None
