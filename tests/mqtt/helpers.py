"""Shared test helpers: commented hex, and the malformed-packet case table shape.

A case's bytes are written one field per line, each line commented::

    36          # PUBLISH, QoS bits 11
    0E          # Remaining Length 14

``wire()`` drops everything after ``#`` and all whitespace.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest

from bridge.mqtt import MqttError, decode_packet


def wire(text: str) -> bytes:
    """Bytes from hex text with ``#`` comments and free whitespace."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex("".join("".join(lines).split()))


class Bad(NamedTuple):
    """One malformed input and the exact error it must raise.

    ``id`` starts with the rule id so that test ids carry it; ``message`` is
    the detail after ``[RULE] `` and must match the whole rest of the message.
    """

    id: str
    level: int | None
    data: str
    error: type[MqttError]
    rule: str
    reason: int
    message: str
    from_client: bool = True
    max_packet_bytes: int | None = None


def check_bad(case: Bad) -> MqttError:
    """Decode ``case`` and assert the exact error class, rule, reason and message."""
    data = wire(case.data)
    with pytest.raises(MqttError) as info:
        decode_packet(data, case.level, from_client=case.from_client,
                      max_packet_bytes=case.max_packet_bytes)
    err = info.value
    assert type(err) is case.error, repr(err)
    assert err.rule == case.rule, repr(err)
    assert err.reason_code == case.reason, repr(err)
    assert re.fullmatch(re.escape(f"[{case.rule}] ") + case.message, str(err)), str(err)
    return err


def params(cases: list[Bad]):
    """pytest parameters whose ids carry the rule id."""
    return [pytest.param(c, id=c.id) for c in cases]
