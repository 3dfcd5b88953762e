"""Session state that outlives a connection: QoS 2 Packet Identifiers awaiting
PUBREL, per Client Identifier. Pure memory, no I/O (persistence is
:mod:`bridge.edge.persist`).

A *session* in the edge's sense is what MQTT calls the server's Session
State minus subscriptions (the edge has none): the QoS 2 messages received
and acknowledged with PUBREC whose PUBREL has not arrived, plus the expiry
rules. A session is **persistent** when MQTT says it outlives the network
connection: MQTT 3.x Clean Session 0, MQTT 5 Session Expiry Interval > 0.
Only persistent sessions are kept in :class:`SessionStore` between
connections and survive an edge restart; a clean session's state is dropped
when its connection ends.

Each :class:`Qos2Entry` remembers the topic of the QoS 2 PUBLISH (so that
the PUBREL's capture record can name it, ``rel_topic``) and where that
PUBLISH was captured (``seq``, ``partition``, ``offset``; known once the
server appended it).
"""

from __future__ import annotations

__all__ = ["NEVER_EXPIRES", "ClientSession", "Qos2Entry", "SessionStore"]

#: MQTT 5 Session Expiry Interval 0xFFFFFFFF: the session does not expire
#: (also used for MQTT 3.x Clean Session 0).
NEVER_EXPIRES = 0xFFFFFFFF


class Qos2Entry:
    """A QoS 2 PUBLISH acknowledged (or about to be) with PUBREC, awaiting PUBREL."""

    __slots__ = ("topic", "seq", "partition", "offset")

    def __init__(self, topic: str, seq: int | None = None, partition: int | None = None,
                 offset: int | None = None) -> None:
        self.topic = topic
        self.seq = seq
        self.partition = partition
        self.offset = offset

    def captured(self, partition: int, offset: int, seq: int) -> None:
        """Called by the server once the PUBLISH was appended to the capture log."""
        self.partition = partition
        self.offset = offset
        self.seq = seq

    def to_json(self) -> list:
        return [self.topic, self.seq, self.partition, self.offset]

    @classmethod
    def from_json(cls, row: list) -> Qos2Entry:
        topic, seq, partition, offset = row
        return cls(topic, seq, partition, offset)

    def __eq__(self, other) -> bool:
        return isinstance(other, Qos2Entry) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return (f"Qos2Entry(topic={self.topic!r}, seq={self.seq}, partition={self.partition}, "
                f"offset={self.offset})")


class ClientSession:
    """The state of one Client Identifier's session (see the module docstring)."""

    __slots__ = ("client_id", "persistent", "expiry_s", "disconnected_at", "qos2", "connected")

    def __init__(self, client_id: str, persistent: bool = False, expiry_s: int = 0) -> None:
        self.client_id = client_id
        self.persistent = persistent
        #: seconds the session outlives its connection (NEVER_EXPIRES: forever)
        self.expiry_s = expiry_s
        #: wall-clock time (seconds since the epoch) the last connection ended
        self.disconnected_at: float | None = None
        #: packet id -> entry, for QoS 2 PUBLISH packets awaiting PUBREL
        self.qos2: dict[int, Qos2Entry] = {}
        self.connected = False

    def expired(self, now_wall: float) -> bool:
        """True when the session has outlived its expiry interval."""
        if self.connected or self.disconnected_at is None or self.expiry_s == NEVER_EXPIRES:
            return False
        return now_wall >= self.disconnected_at + self.expiry_s

    def to_json(self) -> dict:
        return {"expiry_s": self.expiry_s, "disconnected_at": self.disconnected_at,
                "qos2": {str(pid): e.to_json() for pid, e in sorted(self.qos2.items())}}

    @classmethod
    def from_json(cls, client_id: str, doc: dict) -> ClientSession:
        s = cls(client_id, True, int(doc["expiry_s"]))
        s.disconnected_at = doc.get("disconnected_at")
        s.qos2 = {int(pid): Qos2Entry.from_json(row) for pid, row in doc.get("qos2", {}).items()}
        return s

    def __repr__(self) -> str:
        return (f"ClientSession(client_id={self.client_id!r}, persistent={self.persistent}, "
                f"expiry_s={self.expiry_s}, qos2={len(self.qos2)} ids, connected={self.connected})")


class SessionStore:
    """Persistent sessions by Client Identifier (in memory).

    The server calls :meth:`open` when it accepts a CONNECT and :meth:`close`
    when the connection ends; :meth:`set_expiry` when an MQTT 5 DISCONNECT
    changes the Session Expiry Interval. Clean sessions are handed out but
    never stored.
    """

    def __init__(self) -> None:
        self.sessions: dict[str, ClientSession] = {}

    def open(self, client_id: str, clean_start: bool, expiry_s: int, now_wall: float
             ) -> tuple[ClientSession, bool]:
        """The session for a CONNECT that was accepted; returns (session,
        session_present). ``expiry_s`` is the effective Session Expiry
        Interval (0: the session ends with the connection)."""
        existing = self.sessions.get(client_id)
        if existing is not None and (clean_start or existing.expired(now_wall)):
            del self.sessions[client_id]
            existing = None
        present = existing is not None
        s = existing if existing is not None else ClientSession(client_id)
        s.persistent = expiry_s > 0
        s.expiry_s = expiry_s
        s.connected = True
        s.disconnected_at = None
        if s.persistent:
            self.sessions[client_id] = s
        elif present:
            del self.sessions[client_id]
        return s, present

    def set_expiry(self, session: ClientSession, expiry_s: int) -> None:
        """An MQTT 5 DISCONNECT set a new Session Expiry Interval."""
        session.expiry_s = expiry_s
        session.persistent = expiry_s > 0
        if session.persistent:
            self.sessions[session.client_id] = session
        elif self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]

    def close(self, session: ClientSession, now_wall: float) -> None:
        """The session's connection ended."""
        session.connected = False
        session.disconnected_at = now_wall
        if not session.persistent:
            session.qos2.clear()
            if self.sessions.get(session.client_id) is session:
                del self.sessions[session.client_id]

    def expire(self, now_wall: float) -> list[str]:
        """Drop sessions whose expiry interval has passed; returns their ids."""
        gone = [cid for cid, s in self.sessions.items() if s.expired(now_wall)]
        for cid in gone:
            del self.sessions[cid]
        return gone

    def to_json(self) -> dict:
        return {cid: s.to_json() for cid, s in sorted(self.sessions.items())}

    @classmethod
    def from_json(cls, doc: dict) -> SessionStore:
        store = cls()
        for cid, sdoc in doc.items():
            store.sessions[cid] = ClientSession.from_json(cid, sdoc)
        return store

    def __len__(self) -> int:
        return len(self.sessions)
