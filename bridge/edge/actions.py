"""What the edge's session state machine returns: its *actions*.

:class:`~bridge.edge.session.Session` methods return lists of these; the
server (:mod:`bridge.edge.server`) performs them strictly in order (see
the :mod:`bridge.edge.session` docstring for the contract of each). Plain
data: no I/O. :func:`will_publish` builds the PUBLISH a Will is captured as,
for the session and for the recovery of Wills a crash left owed.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Union

from bridge.edge.state import Qos2Entry
from bridge.mqtt import Connect, Properties, Publish, encode

__all__ = [
    "Action",
    "Capture",
    "Close",
    "ConnectRequest",
    "Notice",
    "Send",
    "WillMessage",
    "will_publish",
]


class Capture:
    """Append ``frame`` to the capture log; optionally ``reply`` once durable.

    ``quota``: Receive Maximum units freed when ``reply`` is written.
    ``forward``: with ``ack_after = "forward"``, also wait until the AMQP sink
    forwarded this record (True) or the given :class:`Qos2Entry`'s record.
    ``qos2``: the entry whose capture coordinates this record sets.
    ``release``: on a PUBREL, the entry it releases (adds ``rel_topic`` and
    ``rel_seq`` to the headers at append time, see :meth:`final_headers`).
    ``deliver``: on an accepted PUBLISH, its topic (an inbound Topic Alias
    resolved): the server hands the message to matching subscribers once
    the record is durable. A re-sent QoS 2 PUBLISH (``dup``) has none: it
    was delivered the first time. ``matched``: the subscription tree's
    :class:`~bridge.edge.subscription.Matches` for ``deliver``, when the session
    took it already (to weigh its work, ``Session._process``); the server
    routes with it while the tree's version is still the one it was taken at.
    """

    __slots__ = ("frame", "headers", "reply", "quota", "forward", "qos2", "release", "deliver",
                 "matched")

    def __init__(self, frame: bytes, headers: list[tuple[str, bytes]], reply: bytes | None = None,
                 quota: int = 0, forward: bool | Qos2Entry | None = None,
                 qos2: Qos2Entry | None = None, release: Qos2Entry | None = None,
                 deliver: str | None = None) -> None:
        self.frame = frame
        self.headers = headers
        self.reply = reply
        self.quota = quota
        self.forward = forward
        self.qos2 = qos2
        self.release = release
        self.deliver = deliver
        self.matched = None

    def final_headers(self) -> list[tuple[str, bytes]]:
        """The headers to append with (a PUBREL's rel_topic/rel_seq are read
        from its entry now: the PUBLISH it releases may have been appended
        after this action was created, by an earlier action of the same batch)."""
        rel = self.release
        if rel is None:
            return self.headers
        extra = [("rel_topic", rel.topic.encode())]
        if rel.seq is not None:
            extra.append(("rel_seq", str(rel.seq).encode()))
        return self.headers + extra

    def captured(self, partition: int, offset: int, seq: int) -> None:
        """The server appended the record here."""
        if self.qos2 is not None:
            self.qos2.captured(partition, offset, seq)

    def __repr__(self) -> str:
        keys = ",".join(k for k, _ in self.headers)
        return (f"Capture(frame=<{len(self.frame)} bytes>, headers=[{keys}], "
                f"reply={None if self.reply is None else self.reply.hex()})")


class Send:
    """Write ``data`` (after everything queued before it)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Send({self.data.hex()})"


class Close:
    """Close the connection once everything queued before is written.
    ``reason`` is for the connection's log line."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Close({self.reason!r})"


class Notice:
    """A line for the server's log (never payloads or passwords)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"Notice({self.message!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class ConnectRequest:
    """A valid CONNECT awaits the server's decision (authentication,
    connection limit, take-over, session lookup). ``client_id`` is the one
    the session will use (assigned when the client sent an empty one);
    ``expiry_s`` the effective Session Expiry Interval (3.x: 0 for Clean
    Session 1, :data:`NEVER_EXPIRES` for 0)."""

    client_id: str
    username: str | None
    password: bytes | None
    clean_start: bool
    expiry_s: int
    protocol_level: int

    def __repr__(self) -> str:  # never the password
        pw = "None" if self.password is None else f"<{len(self.password)} bytes>"
        return (f"ConnectRequest(client_id={self.client_id!r}, username={self.username!r}, "
                f"password={pw}, clean_start={self.clean_start}, expiry_s={self.expiry_s}, "
                f"protocol_level={self.protocol_level})")


class WillMessage:
    """Capture the Will: ``frame`` is a PUBLISH encoded at the connection's
    protocol level. ``delay_s`` 0: now; otherwise after that many seconds
    unless a connection resumes the session of ``client_id`` first."""

    __slots__ = ("client_id", "key", "conn_id", "frame", "headers", "delay_s")

    def __init__(self, client_id: str, key: bytes, conn_id: str, frame: bytes,
                 headers: list[tuple[str, bytes]], delay_s: int) -> None:
        self.client_id = client_id
        self.key = key
        self.conn_id = conn_id
        self.frame = frame
        self.headers = headers
        self.delay_s = delay_s

    def __repr__(self) -> str:
        return f"WillMessage(client_id={self.client_id!r}, frame=<{len(self.frame)} bytes>, " \
               f"delay_s={self.delay_s})"

    def to_json(self) -> dict:
        return {"client_id": self.client_id, "key": base64.b64encode(self.key).decode(),
                "conn_id": self.conn_id, "frame": base64.b64encode(self.frame).decode(),
                "headers": [[k, base64.b64encode(v).decode()] for k, v in self.headers],
                "delay_s": self.delay_s}

    @classmethod
    def from_json(cls, d: dict) -> "WillMessage":
        return cls(d["client_id"], base64.b64decode(d["key"]), d["conn_id"],
                   base64.b64decode(d["frame"]),
                   [(k, base64.b64decode(v)) for k, v in d["headers"]], int(d["delay_s"]))


def will_publish(connect: Connect, expiry_s: int) -> tuple[bytes, int]:
    """The Will of an accepted ``connect`` as the PUBLISH frame the edge
    captures (at the connection's protocol level; Will Properties become
    PUBLISH properties; a QoS 1/2 Will gets Packet Identifier 1) and its
    delay in seconds (MQTT 5: the Will Delay Interval, at most the Session
    Expiry Interval ``expiry_s``; 3.x: 0). Used by the session and by the
    recovery of Wills a crash left owed (``bridge.edge.persist``)."""
    w = connect.will
    level = connect.protocol_level
    delay = 0
    props = Properties()
    if level == 5:
        wp = w.properties
        props = Properties(
            payload_format_indicator=wp.payload_format_indicator,
            message_expiry_interval=wp.message_expiry_interval,
            content_type=wp.content_type, response_topic=wp.response_topic,
            correlation_data=wp.correlation_data, user_properties=wp.user_properties)
        delay = min(wp.will_delay_interval or 0, expiry_s)
    frame = encode(Publish(qos=w.qos, retain=w.retain, topic=w.topic,
                           packet_id=1 if w.qos else None, properties=props,
                           payload=w.payload), level)
    return frame, delay


Action = Union[Capture, Send, Close, Notice, ConnectRequest, WillMessage]
