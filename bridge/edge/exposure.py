"""Who can reach the edge's listeners: anonymous access beyond loopback
[LG-edge-anonymous-beyond-loopback].

As Mosquitto 2.0 changed its defaults ("local only" unless configured), the
default ``edge.allow_anonymous = true`` holds only while every listener
binds a loopback address (127.0.0.0/8, ::1, ``localhost``). A listener
beyond loopback (another address of the machine, or ``""``, ``0.0.0.0``,
``::``: all interfaces) needs anonymous access chosen explicitly:

* ``edge.allow_anonymous`` set by the user (a configuration file, the
  environment, ``--set``): that value holds;
* not set, with ``edge.password_file``: anonymous clients are refused
  (CONNACK 0x87 Not authorized, 3.x 0x05, rule MQTT-3.1.4-2);
* not set, without a password file: the edge does not start
  (:class:`~bridge.config.ConfigError`: one line naming
  ``edge.allow_anonymous``, exit code 2).

Every listener runs through :func:`anonymous_allowed` with the key of its
port and the host it binds (:func:`listeners` lists the edge's: the plain
TCP one and, when ``edge.tls_port`` is set, the TLS one, both on
``edge.host``); a future WebSocket listener adds its own entry there.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from bridge.config import ConfigError
from bridge.edge import rules as edge_rules

if TYPE_CHECKING:
    from bridge.config import Config
    from bridge.config_sections import EdgeConfig

__all__ = ["ALL_INTERFACES", "anonymous_allowed", "anonymous_note", "beyond_loopback", "is_loopback",
           "listeners"]

#: host values that bind every interface
ALL_INTERFACES = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """True when binding ``host`` reaches loopback only: an address in
    127.0.0.0/8, ``::1`` or the name ``localhost``. Any other name may
    resolve to anything, so it counts as beyond loopback."""
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def listeners(edge: EdgeConfig) -> list[tuple[str, str]]:
    """The edge's listeners as (key of the port, host bound): ``edge.port``
    and, when set, ``edge.tls_port``, ``edge.ws_port`` and ``edge.wss_port``,
    all on ``edge.host``."""
    out = [("edge.port", edge.host)]
    for key in ("edge.tls_port", "edge.ws_port", "edge.wss_port"):
        if getattr(edge, key[5:]):
            out.append((key, edge.host))
    return out


def beyond_loopback(config: Config, extra: list[tuple[str, str]] | None = None
                    ) -> list[tuple[str, str]]:
    """The listeners (see :func:`listeners`, plus ``extra``) that bind
    beyond loopback."""
    return [(k, h) for k, h in listeners(config.edge) + list(extra or ()) if not is_loopback(h)]


def _where(exposed: list[tuple[str, str]]) -> str:
    by_host: dict[str, list[str]] = {}
    for key, host in exposed:
        by_host.setdefault(host, []).append(key)
    parts = []
    for host, keys in by_host.items():
        what = f"{host!r} (all interfaces)" if host in ALL_INTERFACES else repr(host)
        parts.append(f"{' and '.join(keys)} on edge.host = {what}")
    return "; ".join(parts)


def anonymous_allowed(config: Config, extra: list[tuple[str, str]] | None = None) -> bool:
    """Whether clients without a user name may connect, given where the
    listeners bind (see the module docstring). Raises :class:`ConfigError`
    (key ``edge.allow_anonymous``) when a listener binds beyond loopback,
    ``edge.allow_anonymous`` was not set and there is no password file."""
    edge = config.edge
    source = config.sources.get("edge.allow_anonymous", "default")
    exposed = beyond_loopback(config, extra)
    if not exposed or source != "default":
        return edge.allow_anonymous
    if edge.password_file:
        return False
    raise ConfigError(
        "edge.allow_anonymous", source,
        f"[{edge_rules.ANONYMOUS_BEYOND_LOOPBACK}] not set, and the edge listens beyond loopback "
        f"({_where(exposed)}), where anyone who reaches it could publish and subscribe: set "
        "edge.allow_anonymous = true to allow that, or edge.password_file (anonymous clients are "
        "then refused), or bind edge.host = 127.0.0.1")


def anonymous_note(config: Config) -> str | None:
    """A line for the edge's log when anonymous access beyond loopback was
    decided by the rule above (None: all listeners are on loopback)."""
    exposed = beyond_loopback(config)
    if not exposed:
        return None
    source = config.sources.get("edge.allow_anonymous", "default")
    if source == "default":
        return (f"anonymous clients are refused: the edge listens beyond loopback "
                f"({_where(exposed)}) and edge.allow_anonymous is not set "
                f"[{edge_rules.ANONYMOUS_BEYOND_LOOPBACK}]")
    state = "allowed" if config.edge.allow_anonymous else "refused"
    return (f"anonymous clients are {state} beyond loopback ({_where(exposed)}; "
            f"edge.allow_anonymous = {str(config.edge.allow_anonymous).lower()} from {source})")
