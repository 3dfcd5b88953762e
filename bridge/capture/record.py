"""The binary record format of capture log segments (format version 1).

One record, little-endian::

    0   magic         4   b"\\xa5LGR" (lets recovery find the next record)
    4   crc           u32 CRC-32 (zlib, IEEE) of bytes [8, size)
    8   size          u32 the whole record's size in bytes, magic included
    12  offset        u64 dense within the partition
    20  seq           u64 capture sequence, global across partitions
    28  timestamp_us  i64 receive time, microseconds since the epoch (UTC)
    36  key_len       u32
    40  value_len     u32
    44  headers_len   u32
    48  header_count  u16
    50  attributes    u16 reserved, 0
    52  key, value, headers

Headers are a table of ``header_count`` entries ``u16 key_len, u32 value_len``
followed by each header's key (UTF-8) and value bytes, in order; the table
first lets a reader locate every header of a batch of records with array
arithmetic instead of a loop per header. The ``seq`` header of the Kafka-shaped row is not stored among them:
it is the fixed ``seq`` field, rendered as a header by the reader.

The CRC covers the size field and everything after the CRC, so a damaged
length, offset or payload byte is detected. No I/O here.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from schemas.capture import HEADER_KEYS

__all__ = [
    "FIXED_SIZE",
    "INCOMPLETE",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "Record",
    "RecordFields",
    "check_record",
    "decode_headers",
    "decode_record",
    "Headers",
    "encode_headers",
    "encode_record",
    "partition_for",
    "record_size",
]

MAGIC = b"\xa5LGR"
#: magic, crc, size, offset, seq, timestamp_us, key_len, value_len, headers_len, header_count, attributes
_FIXED = struct.Struct("<4sIIQQqIIIHH")
_TAIL = struct.Struct("<IQQqIIIHH")  # the fixed part after magic and crc
_U32 = struct.Struct("<I")
_HENTRY = struct.Struct("<HI")  # header table entry: key_len, value_len
FIXED_SIZE = _FIXED.size  # 52
#: Larger than any MQTT packet (268,435,460 bytes) plus headers; anything
#: bigger in a size field is damage, not data.
MAX_RECORD_BYTES = 300 * 1024 * 1024

#: Header keys the caller may pass; ``seq`` is the log's own.
_CALLER_KEYS = frozenset(HEADER_KEYS) - {"seq"}
_KEY_BYTES = {k: k.encode("ascii") for k in _CALLER_KEYS}
#: the header of a record's capture sequence number (the log's own, on both backends)
SEQ_HEADER = "seq"
_SEQ = SEQ_HEADER


def kafka_headers_size(pairs: Iterable[tuple[str, bytes]]) -> int:
    """The bytes headers add to a Kafka record (format v2), each varint at its widest."""
    return sum(10 + len(k) + len(v) for k, v in pairs)


def partition_for(partition_key: str, partitions: int) -> int:
    """The partition of a connection: a stable hash (CRC-32 of the UTF-8 key) mod N.

    Stable across processes and Python versions (unlike ``hash()``).
    """
    return zlib.crc32(partition_key.encode("utf-8")) % partitions


def _encode_parts(headers: Iterable[tuple[str, bytes]]) -> tuple[bytes, bytes, int]:
    table: list[bytes] = []
    data: list[bytes] = []
    for k, v in headers:
        if k not in _CALLER_KEYS:
            if k == _SEQ:
                raise ValueError("header 'seq' is assigned by the capture log; do not pass it")
            raise ValueError(f"unknown capture header key {k!r}; known keys are in schemas.capture.HEADER_KEYS")
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise TypeError(f"capture header {k!r}: value must be bytes, got {type(v).__name__}")
        kb = k.encode("ascii")
        table.append(_HENTRY.pack(len(kb), len(v)))
        data.append(kb)
        data.append(bytes(v))
    n = len(table)
    if n > 0xFFFF:
        raise ValueError(f"too many capture headers: {n}")
    return b"".join(table), b"".join(data), n


class Headers(list):
    """A list of (key, bytes) capture headers that keeps its encoding, for
    headers appended with many records (a connection's): the log encodes
    them once. :meth:`plus` returns a new :class:`Headers` with more pairs,
    encoding only those. Treat it as read-only once encoded (a plain list
    made from it, e.g. by ``+``, is encoded afresh)."""

    __slots__ = ("_enc", "_kafka")

    def __init__(self, pairs: Iterable[tuple[str, bytes]] = ()) -> None:
        super().__init__(pairs)
        self._enc: tuple[bytes, bytes, int, bytes] | None = None
        self._kafka: tuple[list[tuple[str, bytes]], int] | None = None

    def _parts(self) -> tuple[bytes, bytes, int, bytes]:
        enc = self._enc
        if enc is None:
            table, data, n = _encode_parts(self)
            enc = self._enc = (table, data, n, table + data)
        return enc

    def encoded(self) -> tuple[bytes, int]:
        enc = self._parts()
        return enc[3], enc[2]

    def kafka(self) -> tuple[list[tuple[str, bytes]], int]:
        """The pairs as Kafka record headers (checked as :func:`encode_headers`
        checks them, values bytes) and the bytes they add to a Kafka record
        at most: computed once (the capture log on Kafka)."""
        kf = self._kafka
        if kf is None:
            self._parts()  # checks the keys and values
            pairs = [(k, bytes(v)) for k, v in self]
            kf = self._kafka = (pairs, kafka_headers_size(pairs))
        return kf

    def plus(self, extra: list[tuple[str, bytes]]) -> "Headers":
        h = Headers.__new__(Headers)
        h._kafka = None
        list.extend(h, self)
        list.extend(h, extra)
        t0, d0, n0, _blob = self._parts()
        if len(extra) == 1 and n0 < 0xFFFF:  # the usual case: one known key, bytes
            k, v = extra[0]
            kb = _KEY_BYTES.get(k)
            if kb is not None and type(v) is bytes:
                t, d = t0 + _HENTRY.pack(len(kb), len(v)), d0 + kb + v
                h._enc = (t, d, n0 + 1, t + d)
                return h
        t1, d1, n1 = _encode_parts(extra)
        if n0 + n1 > 0xFFFF:
            raise ValueError(f"too many capture headers: {n0 + n1}")
        t, d = t0 + t1, d0 + d1
        h._enc = (t, d, n0 + n1, t + d)
        return h


def encode_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[bytes, int]:
    """Encode caller headers; returns (blob, count).

    Keys must be listed in ``schemas.capture.HEADER_KEYS``; ``seq`` is set by
    the log and may not be given. Values are bytes. A :class:`Headers`
    list is encoded once and then reused.
    """
    if type(headers) is Headers:
        return headers.encoded()
    table, data, n = _encode_parts(headers)
    return table + data, n


def decode_headers(buf, pos: int, length: int, count: int) -> list[tuple[str, bytes]]:
    """Decode ``count`` headers from ``buf[pos:pos+length]``. Raises ValueError
    when they do not fill exactly that span (the caller has checked the CRC,
    so this means a writer bug, not disk damage)."""
    out: list[tuple[str, bytes]] = []
    end = pos + length
    data = pos + _HENTRY.size * count
    for i in range(count):
        kl, vl = _HENTRY.unpack_from(buf, pos + _HENTRY.size * i)
        k = bytes(buf[data:data + kl]).decode("utf-8")
        data += kl
        out.append((k, bytes(buf[data:data + vl])))
        data += vl
    if data != end:
        raise ValueError("headers do not fill their declared length")
    return out


def encode_record(offset: int, seq: int, timestamp_us: int, key: bytes, value: bytes,
                  headers_blob: bytes, header_count: int) -> bytes:
    """One record's bytes, CRC included."""
    size = FIXED_SIZE + len(key) + len(value) + len(headers_blob)
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"capture record of {size} bytes exceeds the limit of {MAX_RECORD_BYTES}")
    tail = b"".join((
        _TAIL.pack(size, offset, seq, timestamp_us, len(key), len(value), len(headers_blob), header_count, 0),
        key, value, headers_blob,
    ))
    return b"".join((MAGIC, _U32.pack(zlib.crc32(tail)), tail))


def record_size(key: bytes, value: bytes, headers_blob: bytes) -> int:
    return FIXED_SIZE + len(key) + len(value) + len(headers_blob)


@dataclass(frozen=True, slots=True)
class RecordFields:
    """The fixed fields of a record found at ``position`` in a buffer."""

    position: int
    size: int
    offset: int
    seq: int
    timestamp_us: int
    key_len: int
    value_len: int
    headers_len: int
    header_count: int

    @property
    def key_pos(self) -> int:
        return self.position + FIXED_SIZE

    @property
    def value_pos(self) -> int:
        return self.position + FIXED_SIZE + self.key_len

    @property
    def headers_pos(self) -> int:
        return self.position + FIXED_SIZE + self.key_len + self.value_len


#: check_record outcomes besides a RecordFields
INCOMPLETE = "incomplete"


def check_record(buf, pos: int, limit: int) -> RecordFields | str:
    """Validate the record at ``buf[pos:]`` (``limit`` = end of valid bytes).

    Returns its fields, ``INCOMPLETE`` when the bytes up to ``limit`` end
    inside a plausible record, or a string saying what is wrong (bad magic,
    implausible size, CRC mismatch).
    """
    if limit - pos < FIXED_SIZE:
        # Not even a fixed header: a torn write, unless the magic is wrong.
        head = bytes(buf[pos:min(limit, pos + 4)])
        if MAGIC.startswith(head):
            return INCOMPLETE
        return "bad magic"
    magic, crc, size, offset, seq, ts, kl, vl, hl, hc, _attr = _FIXED.unpack_from(buf, pos)
    if magic != MAGIC:
        return "bad magic"
    if size != FIXED_SIZE + kl + vl + hl or size > MAX_RECORD_BYTES:
        return "implausible size"
    if pos + size > limit:
        return INCOMPLETE
    if zlib.crc32(buf[pos + 8:pos + size]) != crc:
        return "CRC mismatch"
    return RecordFields(pos, size, offset, seq, ts, kl, vl, hl, hc)


@dataclass(frozen=True)
class Record:
    """A decoded record (for ``log dump`` and tests; the Spark reader builds
    Arrow columns without these objects)."""

    partition: int
    offset: int
    seq: int
    timestamp_us: int
    key: bytes
    value: bytes
    #: the caller's headers as stored, without ``seq``
    stored_headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        """The Kafka-shaped row's headers: the stored ones, then ``seq``."""
        return [*self.stored_headers, (_SEQ, str(self.seq).encode("ascii"))]

    def header(self, key: str) -> bytes | None:
        for k, v in self.headers:
            if k == key:
                return v
        return None

    def __repr__(self) -> str:  # sizes and ids, never the payload
        return (f"Record(partition={self.partition}, offset={self.offset}, seq={self.seq}, "
                f"key_bytes={len(self.key)}, value_bytes={len(self.value)}, headers={len(self.stored_headers)})")


def decode_record(buf, f: RecordFields, partition: int) -> Record:
    return Record(
        partition=partition,
        offset=f.offset,
        seq=f.seq,
        timestamp_us=f.timestamp_us,
        key=bytes(buf[f.key_pos:f.key_pos + f.key_len]),
        value=bytes(buf[f.value_pos:f.value_pos + f.value_len]),
        stored_headers=tuple(decode_headers(buf, f.headers_pos, f.headers_len, f.header_count)),
    )
