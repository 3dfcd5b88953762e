"""TLS on the edge's listeners (``edge.tls_port``, ``edge.wss_port``):
the server context, client certificates, and a handshake the edge sees.

* :func:`server_context`: the listener's certificate (``edge.tls_cert_file``,
  ``edge.tls_key_file``) and, with ``edge.tls_client_ca_file``, client
  certificates: asked for and verified against that CA bundle, required
  when ``edge.require_certificate`` (else optional: a client without one
  goes on to the password and anonymous rules, one with an invalid one is
  refused), checked against ``edge.tls_crl_file`` when set (the leaf's
  revocation).
* :class:`TlsAcceptor`: asyncio's ``start_tls`` on each accepted TCP
  connection, so that a handshake that fails (no certificate where one is
  required, expired, revoked, from another CA, not for client use...) is
  one log line with OpenSSL's reason [LG-edge-tls-handshake] (asyncio's own
  TLS server says nothing outside debug mode), and the client gets the TLS
  alert OpenSSL sent; then the connection's protocol (TCP's ``Connection``
  or the WebSocket one) takes over.
* :func:`identity`: what ``edge.cert_identity`` makes the user name of a
  client with a verified certificate (Mosquitto's
  ``use_identity_as_username`` is ``cn``, ``use_subject_as_username`` is
  ``subject``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Callable

from bridge.edge import rules as edge_rules
from bridge.edge.connection import remote_address

if TYPE_CHECKING:
    from bridge.config import EdgeConfig

__all__ = ["TlsAcceptor", "identity", "server_context"]

log = logging.getLogger("bridge.edge")


def server_context(edge: EdgeConfig) -> ssl.SSLContext:
    """The TLS listeners' context (module docstring)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(edge.tls_cert_file, edge.tls_key_file or None)
    if edge.tls_client_ca_file:
        ctx.load_verify_locations(cafile=edge.tls_client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if edge.require_certificate else ssl.CERT_OPTIONAL
        if edge.tls_crl_file:
            ctx.load_verify_locations(cafile=edge.tls_crl_file)
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    return ctx


def _rfc2253(rdns) -> str:
    """A subject as OpenSSL prints it with RFC 2253 flags (Mosquitto's
    ``use_subject_as_username``): the last RDN first, ``,`` between them."""
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST", "emailAddress": "emailAddress",
             "domainComponent": "DC", "serialNumber": "serialNumber"}

    def esc(v: str) -> str:
        out = "".join("\\" + c if c in ',+"\\<>;' else c for c in v)
        if out[:1] in ("#", " "):
            out = "\\" + out
        return out[:-1] + "\\ " if out.endswith(" ") else out

    return ",".join("+".join(f"{short.get(k, k)}={esc(v)}" for k, v in rdn) for rdn in reversed(rdns))


def identity(peercert: dict | None, how: str) -> str | None:
    """The user name ``edge.cert_identity`` = ``how`` gives a verified
    client certificate (``peercert``: ``SSLObject.getpeercert()``), or None
    (no certificate, or none of that kind of name in it)."""
    if not peercert or how == "none":
        return None
    subject = peercert.get("subject", ())
    if how == "cn":
        names = [v for rdn in subject for k, v in rdn if k == "commonName"]
        return names[-1] if names else None
    if how == "subject":
        return _rfc2253(subject) or None
    if how == "san":
        sans = [v for kind, v in peercert.get("subjectAltName", ()) if kind in ("DNS", "email", "URI")]
        return sans[0] if sans else None
    raise ValueError(f"edge.cert_identity: {how!r}")


class TlsAcceptor(asyncio.Protocol):
    """One accepted TCP connection of a TLS listener until its handshake is
    over (module docstring); ``make()`` builds the protocol that takes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ctx: ssl.SSLContext, make: Callable[[], asyncio.Protocol],
                 kind: str, timeout_s: float) -> None:
        self.loop = loop
        self.ctx = ctx
        self.make = make
        self.kind = kind
        self.timeout_s = timeout_s
        self.raw: asyncio.Transport | None = None
        self.proto: asyncio.Protocol | None = None
        self.early: list[bytes] = []  # application data that came with the handshake's end
        self.eof = False
        self.lost: tuple | None = None

    def connection_made(self, transport) -> None:
        self.raw = transport
        self.loop.create_task(self._handshake())

    async def _handshake(self) -> None:
        raw = self.raw
        remote = remote_address(raw.get_extra_info("peername"))
        try:
            tls = await self.loop.start_tls(raw, self, self.ctx, server_side=True,
                                            ssl_handshake_timeout=self.timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:  # (ssl.SSLError and ConnectionError are OSErrors)
            why = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or \
                (f"no handshake within edge.connect_timeout_s = {self.timeout_s:g} s"
                 if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__)
            log.info("%s remote=%s: TLS handshake failed: %s [%s]", self.kind, remote, why,
                     edge_rules.TLS_HANDSHAKE)
            if not raw.is_closing():
                raw.abort()
            return
        proto = self.proto = self.make()
        tls.set_protocol(proto)
        proto.connection_made(tls)
        for data in self.early:
            proto.data_received(data)
        self.early = []
        if self.lost is not None:
            proto.connection_lost(self.lost[0])
        elif self.eof:
            proto.eof_received()

    # until the protocol takes over: what the handshake's end brought
    def data_received(self, data: bytes) -> None:
        if self.proto is not None:
            self.proto.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self):
        if self.proto is not None:
            return self.proto.eof_received()
        self.eof = True
        return False

    def connection_lost(self, exc) -> None:
        if self.proto is not None:
            self.proto.connection_lost(exc)
        else:
            self.lost = (exc,)
