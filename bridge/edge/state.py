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

MQTT 3.x has no Session Expiry Interval: a Clean Session 0 session would
never end. :class:`SessionStore` gives such sessions ``v3_expiry_s`` (the
server sets it from ``edge.persistent_session_expiry_s``, like Mosquitto's
``persistent_client_expiration``; 0: never). It also bounds what it keeps
(``max_sessions``, ``max_qos2_ids`` held by disconnected sessions): beyond
either, :meth:`SessionStore.bound` drops the sessions disconnected the
longest and returns them, for the server to log.

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

    __slots__ = ("client_id", "persistent", "expiry_s", "disconnected_at", "qos2", "connected",
                 "v3", "outbox", "username", "home")

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
        #: opened by an MQTT 3.x CONNECT (Clean Session 0: no expiry interval of its own)
        self.v3 = False
        #: deliveries to this session (bridge.edge.delivery.Outbox; None until the first)
        self.outbox = None
        #: the user name of the connection that last held the session (ACL at delivery)
        self.username: str | None = None
        #: a cluster: the edge the session's connection is (or was last) on; None: this one
        self.home: int | None = None

    def expired(self, now_wall: float, v3_expiry_s: int = 0) -> bool:
        """True when the session has outlived its expiry interval (for a 3.x
        session that never expires by itself: ``v3_expiry_s``, when > 0)."""
        if self.connected or self.disconnected_at is None:
            return False
        expiry = self.expiry_s
        if expiry == NEVER_EXPIRES and self.v3 and v3_expiry_s > 0:
            expiry = v3_expiry_s
        if expiry == NEVER_EXPIRES:
            return False
        return now_wall >= self.disconnected_at + expiry

    def to_json(self) -> dict:
        doc = {"expiry_s": self.expiry_s, "disconnected_at": self.disconnected_at,
               "qos2": {str(pid): e.to_json() for pid, e in sorted(self.qos2.items())}}
        if self.v3:
            doc["v3"] = True
        if self.home is not None:
            doc["home"] = self.home
        return doc

    @classmethod
    def from_json(cls, client_id: str, doc: dict) -> ClientSession:
        s = cls(client_id, True, int(doc["expiry_s"]))
        s.disconnected_at = doc.get("disconnected_at")
        s.v3 = bool(doc.get("v3", False))
        s.home = doc.get("home")
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

    def __init__(self, v3_expiry_s: int = 0, max_sessions: int | None = None,
                 max_qos2_ids: int | None = None) -> None:
        self.sessions: dict[str, ClientSession] = {}
        #: expiry of 3.x persistent sessions, seconds after their connection ends (0: never)
        self.v3_expiry_s = v3_expiry_s
        #: persistent sessions kept (None: no bound)
        self.max_sessions = max_sessions
        #: QoS 2 ids kept across disconnected sessions (None: no bound)
        self.max_qos2_ids = max_qos2_ids

    def configure(self, v3_expiry_s: int, max_sessions: int | None,
                  max_qos2_ids: int | None) -> None:
        """Set the expiry of 3.x sessions and the bounds (see the module docstring)."""
        self.v3_expiry_s = v3_expiry_s
        self.max_sessions = max_sessions
        self.max_qos2_ids = max_qos2_ids

    def open(self, client_id: str, clean_start: bool, expiry_s: int, now_wall: float,
             protocol_level: int = 5) -> tuple[ClientSession, bool]:
        """The session for a CONNECT that was accepted; returns (session,
        session_present). ``expiry_s`` is the effective Session Expiry
        Interval (0: the session ends with the connection)."""
        existing = self.sessions.get(client_id)
        if existing is not None and (clean_start or existing.expired(now_wall, self.v3_expiry_s)):
            del self.sessions[client_id]
            existing = None
        present = existing is not None
        s = existing if existing is not None else ClientSession(client_id)
        s.persistent = expiry_s > 0
        s.expiry_s = expiry_s
        s.v3 = protocol_level != 5
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
        v3 = self.v3_expiry_s
        gone = [cid for cid, s in self.sessions.items() if s.expired(now_wall, v3)]
        for cid in gone:
            del self.sessions[cid]
        return gone

    def bound(self) -> list[tuple[str, int]]:
        """Keep at most ``max_sessions`` sessions and ``max_qos2_ids`` QoS 2
        ids in disconnected sessions: drop the sessions disconnected the
        longest until both hold. Connected sessions are never dropped (the
        connection limit bounds them). Returns (client id, QoS 2 ids dropped)
        per session dropped."""
        over_sessions = (len(self.sessions) - self.max_sessions
                         if self.max_sessions is not None else 0)
        over_ids = 0
        if self.max_qos2_ids is not None:
            over_ids = sum(len(s.qos2) for s in self.sessions.values()
                           if not s.connected) - self.max_qos2_ids
        if over_sessions <= 0 and over_ids <= 0:
            return []
        idle = sorted((s for s in self.sessions.values()
                       if not s.connected and s.disconnected_at is not None),
                      key=lambda s: s.disconnected_at)
        dropped = []
        for s in idle:
            if over_sessions <= 0 and over_ids <= 0:
                break
            del self.sessions[s.client_id]
            over_sessions -= 1
            over_ids -= len(s.qos2)
            dropped.append((s.client_id, len(s.qos2)))
        return dropped

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
