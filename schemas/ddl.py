"""A small parser for Spark DDL schema strings, with no Spark dependency.

Supports the types lakegate uses: BOOLEAN, TINYINT, SMALLINT, INT, BIGINT,
FLOAT, DOUBLE, STRING, BINARY, DATE, TIMESTAMP, ARRAY<t>, MAP<k, v> and
STRUCT<name: t, ...>, plus ``NOT NULL`` on top-level and struct fields.
``to_arrow`` builds pyarrow types; :func:`schemas.spark.to_spark` builds
pyspark types (importing pyspark.sql.types only, no JVM), checked by a test
against Spark's own DDL parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Field", "Type", "parse_ddl", "to_arrow", "field_names"]

_PRIMITIVES = {
    "BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE",
    "STRING", "BINARY", "DATE", "TIMESTAMP",
}
_ALIASES = {"INTEGER": "INT", "LONG": "BIGINT", "SHORT": "SMALLINT", "BYTE": "TINYINT", "BOOL": "BOOLEAN"}


@dataclass(frozen=True)
class Type:
    name: str  # a primitive, "ARRAY", "MAP" or "STRUCT"
    args: tuple[Any, ...] = ()  # element type; key/value types; Fields


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    nullable: bool = True


_TOKEN = re.compile(r"\s*(?:(`[^`]*`)|([A-Za-z_][A-Za-z0-9_]*)|(<|>|,|:|\())")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _peek(self) -> str | None:
        m = _TOKEN.match(self.text, self.pos)
        if not m:
            return None
        return m.group(1) or m.group(2) or m.group(3)

    def _next(self) -> str:
        m = _TOKEN.match(self.text, self.pos)
        if not m:
            rest = self.text[self.pos:].strip()
            raise ValueError(f"DDL: unexpected {rest[:20]!r} at {self.pos}" if rest else "DDL: unexpected end")
        self.pos = m.end()
        return m.group(1) or m.group(2) or m.group(3)

    def _expect(self, tok: str) -> None:
        got = self._next()
        if got != tok:
            raise ValueError(f"DDL: expected {tok!r}, got {got!r} at {self.pos}")

    def name(self) -> str:
        tok = self._next()
        return tok[1:-1] if tok.startswith("`") else tok

    def type(self) -> Type:
        word = self._next().upper()
        word = _ALIASES.get(word, word)
        if word in _PRIMITIVES:
            return Type(word)
        if word == "ARRAY":
            self._expect("<")
            el = self.type()
            self._expect(">")
            return Type("ARRAY", (el,))
        if word == "MAP":
            self._expect("<")
            k = self.type()
            self._expect(",")
            v = self.type()
            self._expect(">")
            return Type("MAP", (k, v))
        if word == "STRUCT":
            self._expect("<")
            fields = []
            while True:
                n = self.name()
                if self._peek() == ":":
                    self._next()
                fields.append(Field(n, self.type(), self._nullable()))
                tok = self._next()
                if tok == ">":
                    break
                if tok != ",":
                    raise ValueError(f"DDL: expected ',' or '>' in STRUCT, got {tok!r}")
            return Type("STRUCT", tuple(fields))
        raise ValueError(f"DDL: unknown type {word!r}")

    def _nullable(self) -> bool:
        if (self._peek() or "").upper() == "NOT":
            self._next()
            if self._next().upper() != "NULL":
                raise ValueError("DDL: expected NULL after NOT")
            return False
        return True

    def fields(self) -> list[Field]:
        out = []
        while True:
            n = self.name()
            if self._peek() == ":":
                self._next()
            out.append(Field(n, self.type(), self._nullable()))
            if self._peek() is None:
                if self.text[self.pos:].strip():
                    raise ValueError(f"DDL: trailing text {self.text[self.pos:]!r}")
                return out
            self._expect(",")


def parse_ddl(ddl: str) -> list[Field]:
    """Parse ``"a INT, b ARRAY<STRUCT<k: STRING, v: BINARY>>"`` into Fields."""
    return _Parser(ddl).fields()


def field_names(ddl: str) -> list[str]:
    return [f.name for f in parse_ddl(ddl)]


def _arrow_type(t: Type):
    import pyarrow as pa

    prim = {
        "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(),
        "BIGINT": pa.int64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "STRING": pa.string(),
        "BINARY": pa.binary(), "DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    }
    if t.name in prim:
        return prim[t.name]
    if t.name == "ARRAY":
        return pa.list_(_arrow_type(t.args[0]))
    if t.name == "MAP":
        return pa.map_(_arrow_type(t.args[0]), _arrow_type(t.args[1]))
    return pa.struct([pa.field(f.name, _arrow_type(f.type), nullable=f.nullable) for f in t.args])


def to_arrow(ddl: str):
    """The pyarrow.Schema for a DDL string (TIMESTAMP -> timestamp[us, UTC])."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, _arrow_type(f.type), nullable=f.nullable) for f in parse_ddl(ddl)])
