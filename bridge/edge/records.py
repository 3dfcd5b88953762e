"""What the capture log keeps of a frame the edge rejects or redacts.

Pure functions over bytes: the CONNECT without its password
(:func:`redact_password`), and the bytes recorded of a rejected frame, whole
or truncated (:func:`reject_record`). Used by the session state machine
(:mod:`bridge.edge.session`).
"""

from __future__ import annotations

from bridge.mqtt import MqttError
from bridge.mqtt.fixed_header import PacketType, encode_fixed_header, parse_fixed_header

__all__ = ["REJECT_RECORD_BYTES", "redact_password", "reject_record"]

#: A rejected frame that is not complete (judged from its first bytes, or
#: larger than the Maximum Packet Size) is recorded truncated to this many bytes.
REJECT_RECORD_BYTES = 1024
_PASSWORD_FLAG = 0x40


def redact_password(frame: bytes, password_len: int) -> bytes:
    """The CONNECT ``frame`` without its Password field and Password Flag,
    with the Remaining Length fixed. The frame must have decoded with a
    password of ``password_len`` bytes: the Password is then the last field
    of the packet (the codec checks nothing follows it)."""
    fh = parse_fixed_header(frame, minimal=False)  # 3.x may send a non-minimal one
    start = fh.header_length
    body = frame[start:fh.total_length]
    name_len = (body[0] << 8) | body[1]
    flags_at = 2 + name_len + 1
    new_body = b"".join((body[:flags_at], bytes((body[flags_at] & ~_PASSWORD_FLAG,)),
                         body[flags_at + 1:len(body) - 2 - password_len]))
    return encode_fixed_header(frame[0], len(new_body)) + new_body


def _connect_head_length(view) -> int | None:
    """Bytes of a CONNECT up to the end of Keep Alive (fixed header,
    Protocol Name, Version, Connect Flags, Keep Alive), or None."""
    try:
        fh = parse_fixed_header(view, minimal=False)
    except MqttError:
        return None
    if fh is None:
        return None
    pos = fh.header_length
    if len(view) < pos + 2:
        return None
    return pos + 2 + ((view[pos] << 8) | view[pos + 1]) + 4


def reject_record(view, err: MqttError) -> tuple[bytes, str]:
    """(bytes to record, note) for a rejected frame at the start of ``view``.

    * a complete frame is recorded whole;
    * a frame whose fixed header is malformed (a Remaining Length of five
      bytes, or not minimal) is recorded as its first five bytes;
    * a frame rejected from its first bytes before it was complete, or one
      larger than the Maximum Packet Size (never buffered), is recorded
      truncated to the bytes at hand, at most :data:`REJECT_RECORD_BYTES`;
    * a CONNECT that failed to decode keeps only its fixed and variable
      header up to Keep Alive: its payload may hold a password the edge
      cannot locate in a malformed packet, and passwords are never stored.
    """
    have = len(view)
    total = None
    try:
        # strict for the minimal-length rule only when that rule was the fault
        fh = parse_fixed_header(view, minimal=err.rule == "MQTT-1.5.5-1")
        if fh is not None:
            total = fh.total_length
    except MqttError:  # the fixed header itself is bad: its bytes are all there is
        return bytes(view[:min(have, 5)]), ""
    if have and view[0] >> 4 == PacketType.CONNECT:
        head = _connect_head_length(view)
        keep = min(have, head if head is not None else 2, REJECT_RECORD_BYTES)
        return bytes(view[:keep]), f"; CONNECT payload not recorded ({keep} of {total or have} bytes)"
    if total is not None and total <= have:
        return bytes(view[:total]), ""
    keep = min(have, REJECT_RECORD_BYTES, total if total is not None else have)
    shown = total if total is not None else f"{have}+"
    return bytes(view[:keep]), f"; truncated: {keep} of {shown} bytes recorded"

