"""Common base of the packet dataclasses: a repr that never shows bytes.

Payloads, passwords, Will payloads, Correlation Data and Authentication Data
are ``bytes`` fields; :func:`safe_repr` renders every bytes value as its size
(``<12 bytes>``), so logs built from reprs show sizes and ids only.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

__all__ = ["PacketBase", "safe_repr"]


def _value_repr(value) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    return repr(value)


def safe_repr(obj, *, skip_none: bool = False) -> str:
    """``Name(field=value, ...)`` with bytes values replaced by their size."""
    parts = []
    for f in dataclasses.fields(obj):
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if skip_none and (value is None or value == []):
            continue
        parts.append(f"{f.name}={_value_repr(value)}")
    return f"{type(obj).__name__}({', '.join(parts)})"


class PacketBase:
    """Base of every packet dataclass; ``packet_type`` is set per class."""

    __slots__ = ()
    packet_type: ClassVar[int]

    def __repr__(self) -> str:
        return safe_repr(self)
