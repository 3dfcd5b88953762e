"""The codec's outcomes other than a packet: short input, and rule violations.

Contract
--------
* :class:`IncompleteData` means "need more bytes". It is an ordinary outcome
  of feeding a stream, not an error, and deliberately does **not** derive from
  :class:`MqttError`: ``except MqttError`` never swallows it.
* :class:`MqttError` is the one error tree. Every instance names the normative
  statement it enforces (``.rule``, e.g. ``"MQTT-3.3.1-4"``, or a documented
  project id ``"LG-..."``), the reason code the receiver must send
  (``.reason_code``: a DISCONNECT reason in MQTT 5, a CONNACK reason when the
  packet was a CONNECT; in 3.x the connection is just closed), and where known
  the packet type and protocol level it was found in.
* ``str(err)`` is API: it always starts with ``"[RULE] "``, e.g.
  ``"[MQTT-3.3.1-4] PUBLISH has both QoS bits set"``. Tests match it anchored.
* :class:`MalformedPacket` (default reason 0x81) and :class:`ProtocolError`
  (default 0x82). When the rule is in :mod:`bridge.mqtt.rules` its reason code
  is taken from the table unless given explicitly (so
  ``ProtocolError("MQTT-3.3.2-9", "...")`` carries 0x94 Topic Alias invalid).

Use :func:`bridge.mqtt.rules.violation` to build the right subclass for a rule
from the table; the codec itself raises only through it.
"""

from __future__ import annotations

__all__ = ["IncompleteData", "MalformedPacket", "MqttError", "ProtocolError"]


class IncompleteData(Exception):
    """The buffer holds a proper prefix of a frame: feed more bytes and retry.

    ``needed`` is the total number of bytes (counted from the start of the
    buffer) that the first frame occupies, when the fixed header was complete
    enough to know it; otherwise None (the fixed header itself is incomplete,
    at least one more byte is needed). ``have`` is how many bytes were given.
    """

    def __init__(self, needed: int | None = None, have: int = 0) -> None:
        self.needed = needed
        self.have = have
        if needed is None:
            text = f"incomplete fixed header ({have} bytes so far)"
        else:
            text = f"incomplete frame: {have} of {needed} bytes"
        super().__init__(text)

    @property
    def missing(self) -> int | None:
        """How many more bytes complete the frame, if known."""
        if self.needed is None:
            return None
        return max(self.needed - self.have, 0)


class MqttError(Exception):
    """Base of every MQTT rule violation the codec (or the session) detects.

    Parameters are the rule id, a short human detail (sizes and ids only,
    never payload or password bytes) and, optionally, an explicit reason code,
    the packet type and the protocol level the packet was decoded under.
    """

    default_reason_code = 0x80
    kind = "error"

    def __init__(
        self,
        rule: str,
        detail: str,
        *,
        reason_code: int | None = None,
        packet_type: int | None = None,
        protocol_level: int | None = None,
    ) -> None:
        if reason_code is None:
            reason_code = _table_reason(rule, self.default_reason_code)
        self.rule = rule
        self.detail = detail
        self.reason_code = reason_code
        self.packet_type = packet_type
        self.protocol_level = protocol_level
        super().__init__(f"[{rule}] {detail}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rule={self.rule!r}, reason_code=0x{self.reason_code:02X}, "
            f"packet_type={self.packet_type!r}, protocol_level={self.protocol_level!r}, "
            f"detail={self.detail!r})"
        )


class MalformedPacket(MqttError):
    """The bytes cannot be parsed according to the specification (0x81)."""

    default_reason_code = 0x81
    kind = "malformed"


class ProtocolError(MqttError):
    """Parsed, but contains data the protocol does not allow (0x82 unless a
    more specific reason code applies, e.g. 0x94 Topic Alias invalid)."""

    default_reason_code = 0x82
    kind = "protocol"


def _table_reason(rule: str, default: int) -> int:
    # Imported lazily: rules.py builds errors through this module.
    from bridge.mqtt.rules import RULES

    entry = RULES.get(rule)
    return default if entry is None else entry.reason_code
