"""Test helpers for the edge: a fake server that performs a Session's actions
without sockets, frame builders, and a capture-log reader."""

from __future__ import annotations

from pathlib import Path

from bridge.capture import LogReader, open_reader
from bridge.edge.session import (
    Capture, Close, ConnectRequest, Limits, Notice, Send, Session, WillMessage,
)
from bridge.edge.state import SessionStore
from bridge.mqtt import Connect, Properties, Publish, encode

__all__ = ["Harness", "connect", "headers_of", "publish", "read_log"]


def connect(level: int = 4, client_id: str = "dev", **fields) -> bytes:
    return encode(Connect.for_level(level, client_id=client_id, **fields), level)


def publish(level: int, topic: str = "a/b", payload: bytes = b"x", qos: int = 0,
            packet_id: int | None = None, **fields) -> bytes:
    if qos and packet_id is None:
        packet_id = 1
    if not qos:
        packet_id = None
    props = fields.pop("properties", Properties())
    return encode(Publish(qos=qos, topic=topic, payload=payload, packet_id=packet_id,
                          properties=props, **fields), level)


def headers_of(record) -> dict[str, bytes]:
    """Stored headers as a dict (first value wins); works for Harness records too."""
    items = record.stored_headers if hasattr(record, "stored_headers") else record[1]
    out: dict[str, bytes] = {}
    for k, v in items:
        out.setdefault(k, v)
    return out


def read_log(where) -> list:
    """Every durable record of a capture log, in capture-sequence order:
    ``where`` a capture directory, or a Config (its ``capture.backend``:
    local files or a Kafka topic)."""
    reader = LogReader(where) if isinstance(where, (str, Path)) else open_reader(where)
    try:
        durable = reader.durable_offsets()
        recs = [r for p in range(reader.partitions) for r in reader.records(p, 0, durable[p])]
    finally:
        reader.close()  # a Kafka reader's consumers hold sockets: polled in a loop, they ran out of fds
    return sorted(recs, key=lambda r: r.seq)


class Harness:
    """Plays the server for one Session: captures go to a list (or a real
    CaptureLog), replies are 'sent' at once (as if every append were
    durable immediately), CONNECTs are accepted through a SessionStore."""

    def __init__(self, limits: Limits | None = None, *, conn_id: str = "c1",
                 store: SessionStore | None = None, log=None, now: float = 0.0,
                 auto_accept: bool = True, busy: bool = False, router=None) -> None:
        self.now = now
        self.session = Session(conn_id, "127.0.0.1:40000", limits or Limits(), now, busy=busy,
                               router=router)
        self.store = store if store is not None else SessionStore()
        self.log = log
        self.auto_accept = auto_accept
        self.records: list[tuple[bytes, list[tuple[str, bytes]]]] = []
        #: the reply sent for each record (aligned with ``records``; None: no reply)
        self.replies: list[bytes | None] = []
        self.sent = bytearray()
        self.closed: str | None = None
        self.wills: list[WillMessage] = []
        self.notices: list[str] = []
        self.requests: list[ConnectRequest] = []
        self.present: bool | None = None
        self._seq = 0
        #: slices of large SUBSCRIBE / UNSUBSCRIBE packets run (Session.work)
        self.slices = 0

    def feed(self, data: bytes, now: float | None = None) -> Harness:
        if now is not None:
            self.now = now
        self.perform(self.session.receive_data(data, self.now))
        while self.session.work_pending:  # a large SUBSCRIBE / UNSUBSCRIBE, slice by slice
            self.slices += 1
            self.perform(self.session.work(self.now))
        return self

    def perform(self, actions) -> None:
        for a in actions:
            if isinstance(a, Capture):
                headers = a.final_headers()
                if self.log is not None:
                    ack = self.log.append(self.session.conn_id, self.session.key, a.frame, headers)
                    a.captured(ack.partition, ack.offset, ack.seq)
                else:
                    a.captured(0, len(self.records), self._seq)
                    self._seq += 1
                self.records.append((a.frame, headers))
                self.replies.append(a.reply)
                if a.reply is not None:
                    self.sent += a.reply
                    if a.quota:
                        self.session.quota_released(a.quota)
            elif isinstance(a, Send):
                self.sent += a.data
            elif isinstance(a, Close):
                self.closed = a.reason
            elif isinstance(a, ConnectRequest):
                self.requests.append(a)
                if self.auto_accept:
                    self.accept(a)
            elif isinstance(a, WillMessage):
                self.wills.append(a)
            elif isinstance(a, Notice):
                self.notices.append(a.message)
            else:  # pragma: no cover
                raise TypeError(a)

    def accept(self, req: ConnectRequest) -> None:
        client, present = self.store.open(req.client_id, req.clean_start, req.expiry_s, 1000.0,
                                          req.protocol_level)
        self.present = present
        self.perform(self.session.accept(client, present, self.now))

    def take(self) -> bytes:
        """The bytes 'sent' since the last take."""
        out = bytes(self.sent)
        self.sent.clear()
        return out

    def headers(self, i: int = -1) -> dict[str, bytes]:
        return headers_of(self.records[i])

    def frames(self) -> list[bytes]:
        return [f for f, _ in self.records]
