"""Authorization with a Mosquitto ACL file (``edge.acl_file``).

The format and the publish/delivery decisions are those of Mosquitto 2.0's
``acl_file`` (``src/security_default.c`` and ``src/security.c`` of 2.0.x;
checked against the Debian binary 2.0.11 by ``tests/edge/test_acl.py``):

* ``topic [read|write|readwrite|deny] <topic>`` grants (or denies) a topic
  filter; without an access word the access is ``readwrite``. Fields are
  separated by spaces (not tabs); the topic is the rest of the line with its
  surrounding blanks removed, so it may contain spaces, but then the access
  word is needed (``topic a b`` is an error: ``a`` is no access word).
  ``topic x`` with one word grants ``readwrite`` on ``x`` (even ``topic read``).
* ``user <username>`` starts the section of that user (the rest of the line,
  spaces allowed; a repeated ``user`` line adds to the earlier section). The
  ``topic`` lines before the first ``user`` line are the anonymous section:
  they apply to clients without a user name (``username is None``) only.
* ``pattern [read|write|readwrite|deny] <topic>`` applies to every client, with
  ``%c`` replaced by the client id and ``%u`` by the user name (a pattern
  with ``%u`` does not apply to a client without a user name).
* A line whose first character is ``#`` is a comment; empty lines (and lines
  of blanks) are skipped. Anything else is an error, also ``  # indented``.
* Errors name ``file:line`` and what is wrong, in one line
  (:class:`AclFileError`); a topic must be a valid filter (``+`` and ``#``
  alone in their level, ``#`` last; at most 65,535 characters and 200 ``/``).

A check (``can_publish`` = "write", ``can_read`` = the delivery check) runs as
Mosquitto's does, first answer wins:

1. ``$SYS...`` topics cannot be written (except
   ``$SYS/broker/connection/+/state``); ``$share...`` topics can be neither
   written nor read (Mosquitto's ``acl__check_dollar``).
2. The client's own section (the user's, or the anonymous one): ``deny``
   entries first, then the grants in file order. A matching ``deny`` refuses,
   a matching grant with the access allows; an entry that does not start
   with ``$`` never matches a ``$`` topic.
3. If there are patterns and the user name or client id contains ``+`` or
   ``#``: refused (Mosquitto 2.0 no longer refuses ``/``, Mosquitto 1.x did;
   a client id ``a/b`` thus spans two levels where ``%c`` stands).
4. The patterns, ``deny`` ones first, the same way.
5. Anything else is refused.

So a ``deny`` wins over grants of the same kind (user entries, or patterns),
but a user's own grant is found before a ``deny`` pattern is looked at.

SUBSCRIBE. Mosquitto 2.0.11's ``acl_file`` grants every SUBSCRIBE (its
check returns success for ``MOSQ_ACL_SUBSCRIBE``, marked "FIXME - implement
ACL subscription strings"; 2.1's acl-file plugin still does) and filters only
at delivery with the read check. Lakegate refuses (SUBACK 0x87 / 0x80) only
the SUBSCRIBEs that could never deliver anything: a filter is granted when
some ``read``/``readwrite`` entry *overlaps* it (some topic matches both, see
:func:`overlaps`) and no ``deny`` entry *covers* it (matches every topic the
filter matches, :func:`covers`, Mosquitto's ``mosquitto_sub_matches_acl``);
deny entries are looked at first, then grants, user section before
patterns, as for the other checks. So a file written for Mosquitto keeps
working unchanged: a client with ``topic read public/#`` that subscribes to
``#`` is granted ``#`` and receives ``public/...`` only, exactly as with
Mosquitto, while one that subscribes to ``private/#`` learns at once that it
will receive nothing. A shared subscription ``$share/{group}/{filter}`` is
checked as ``{filter}``. Delivery is always checked again with
:meth:`AclFile.can_read`, as Mosquitto does, so what a client receives is
what Mosquitto would deliver to it.

Second difference: Mosquitto rereads the file on SIGHUP; :class:`AclWatcher`
rereads it when it changes (modification time, size or inode), and a file
that does not parse on reload keeps the previous rules.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from bridge.edge.subscription import split_share

__all__ = ["AclFile", "AclFileError", "AclWatcher", "covers", "overlaps", "topic_matches"]

log = logging.getLogger("bridge.edge.acl")

_READ = 1
_WRITE = 2
_NONE = 0
_ACCESS = {"read": _READ, "write": _WRITE, "readwrite": _READ | _WRITE, "deny": _NONE}
#: C isspace(): what Mosquitto trims from line ends and around a topic.
_BLANKS = " \t\n\v\f\r"
#: Mosquitto's TOPIC_HIERARCHY_LIMIT (levels beyond 200 ``/`` are refused).
_MAX_SLASHES = 200
_MAX_TOPIC_CHARS = 65535


class AclFileError(ValueError):
    """The ACL file cannot be used; the message is one line: ``file:line: what``."""


@dataclass(frozen=True)
class _Entry:
    topic: str
    access: int  # _READ | _WRITE, or _NONE for deny
    line: int
    uses_username: bool = False


def _levels_ok(topic: str) -> bool:
    """Mosquitto's ``mosquitto_sub_topic_check`` (broker build)."""
    if len(topic) > _MAX_TOPIC_CHARS or topic.count("/") > _MAX_SLASHES:
        return False
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if "+" in level and level != "+":
            return False
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
    return True


def topic_matches(acl_filter: str, topic: str) -> bool:
    """Whether a topic name matches an ACL filter (``mosquitto_topic_matches_sub``).

    ``+`` one level, ``#`` the parent level and everything below; a ``$``
    topic is matched only by a filter that starts with ``$`` and vice versa.
    An invalid filter or a topic with ``+``/``#`` matches nothing.
    """
    if not acl_filter or not topic or "+" in topic or "#" in topic:
        return False
    if (acl_filter[0] == "$") != (topic[0] == "$"):
        return False
    f = acl_filter.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return i == len(f) - 1
        if i >= len(t):
            return False
        if level == "+":
            continue
        if "+" in level or "#" in level or level != t[i]:
            return False
    return len(f) == len(t)


def covers(acl_filter: str, topic_filter: str) -> bool:
    """Whether every topic ``topic_filter`` matches is matched by ``acl_filter``
    (``mosquitto_sub_matches_acl``): ``+`` covers any level but ``#``, ``#``
    covers everything below, a literal level covers only itself; ``$`` as in
    :func:`topic_matches`."""
    if not acl_filter or not topic_filter:
        return False
    if (acl_filter[0] == "$") != (topic_filter[0] == "$"):
        return False
    a = acl_filter.split("/")
    s = topic_filter.split("/")
    for i, level in enumerate(a):
        if level == "#":
            return i == len(a) - 1
        if i >= len(s):
            return False
        if level == "+":
            if s[i] == "#":
                return False
            continue
        if "+" in level or "#" in level or level != s[i]:
            return False
    return len(a) == len(s)


def overlaps(acl_filter: str, topic_filter: str) -> bool:
    """Whether some topic name matches both filters: ``+`` and a literal
    level overlap, ``#`` overlaps everything from its level on (its parent
    level too); ``$`` as in :func:`topic_matches`."""
    if not acl_filter or not topic_filter:
        return False
    if (acl_filter[0] == "$") != (topic_filter[0] == "$"):
        return False
    a = acl_filter.split("/")
    s = topic_filter.split("/")
    for i in range(max(len(a), len(s))):
        x = a[i] if i < len(a) else None
        y = s[i] if i < len(s) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


def _substitute(pattern: str, client_id: str, username: str | None) -> str:
    """``%c`` -> client id, ``%u`` -> user name (when there is one), scanned
    left to right as Mosquitto does (``%%c`` keeps the first ``%``)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "%" and i < n - 1:
            nxt = pattern[i + 1]
            if nxt == "c":
                out.append(client_id)
                i += 2
                continue
            if nxt == "u" and username is not None:
                out.append(username)
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _next_token(text: str | None) -> tuple[str | None, str | None]:
    """strtok_r(text, " "): the next space-separated token and the rest after
    its terminating space (None when the token ended the string)."""
    if text is None:
        return None, None
    text = text.lstrip(" ")
    if not text:
        return None, None
    cut = text.find(" ")
    if cut < 0:
        return text, None
    return text[:cut], text[cut + 1:]


class AclFile:
    """The parsed rules of one ACL file; immutable, safe to share."""

    def __init__(self, path: str, users: dict[str | None, tuple[_Entry, ...]],
                 patterns: tuple[_Entry, ...]) -> None:
        self.path = path
        self._users = users
        self._patterns = patterns

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AclFile:
        """Parse the file. Raises FileNotFoundError/OSError when it cannot be
        read, :class:`AclFileError` naming ``file:line`` for a bad line."""
        data = Path(path).read_bytes()
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: bytes | str, path: str = "<acl>") -> AclFile:
        """Parse ACL file contents; ``path`` only names the file in errors."""
        if isinstance(data, bytes):
            lines = data.split(b"\n")
        else:
            lines = data.encode("utf-8").split(b"\n")
        users: dict[str | None, list[_Entry]] = {}
        patterns: list[_Entry] = []
        user: str | None = None
        for n, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise AclFileError(f"{path}:{n}: the line is not UTF-8") from None
            if "\x00" in line:
                raise AclFileError(f"{path}:{n}: the line contains a NUL character")
            line = line.rstrip(_BLANKS)
            if line.startswith("#"):
                continue
            word, rest = _next_token(line)
            if word is None:
                continue
            if word in ("topic", "pattern"):
                access_s, rest = _next_token(rest)
                if access_s is None:
                    raise AclFileError(f"{path}:{n}: '{word}' without a topic")
                if rest:
                    topic = rest.strip(_BLANKS)
                    access = _ACCESS.get(access_s)
                    if access is None:
                        raise AclFileError(
                            f"{path}:{n}: invalid access {access_s!r} (expected read, write, "
                            f"readwrite or deny before the topic)")
                else:
                    topic, access = access_s, _READ | _WRITE
                if not _levels_ok(topic):
                    raise AclFileError(
                        f"{path}:{n}: invalid topic filter {topic!r} ('+' and '#' must fill "
                        f"a whole level, '#' only the last; at most {_MAX_TOPIC_CHARS} "
                        f"characters and {_MAX_SLASHES} '/')")
                if word == "topic":
                    _add(users.setdefault(user, []), _Entry(topic, access, n))
                else:
                    if "%c" not in topic and "%u" not in topic:
                        log.warning("%s:%d: ACL pattern without %%c or %%u (applies to every "
                                    "client alike)", path, n)
                    _add(patterns, _Entry(topic, access, n, uses_username="%u" in topic))
            elif word == "user":
                name = rest.strip(_BLANKS) if rest else ""
                if not name:
                    raise AclFileError(f"{path}:{n}: 'user' without a user name")
                user = name
            else:
                shown = word if len(word) <= 40 else word[:40] + "..."
                raise AclFileError(f"{path}:{n}: invalid line: expected 'topic', 'pattern', "
                                   f"'user' or a '#' comment in the first column, got {shown!r}")
        return cls(str(path), {u: tuple(e) for u, e in users.items()}, tuple(patterns))

    # -- checks ---------------------------------------------------------

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        """May this client PUBLISH to ``topic`` ("write")?"""
        if topic.startswith("$SYS"):
            if not topic_matches("$SYS/broker/connection/+/state", topic):
                return False
        elif topic.startswith("$share"):
            return False
        return self._check(username, client_id, topic, _WRITE, topic_matches)

    def can_read(self, username: str | None, client_id: str, topic: str) -> bool:
        """May a message published to ``topic`` be delivered to this client ("read")?"""
        if topic.startswith("$share"):
            return False
        return self._check(username, client_id, topic, _READ, topic_matches)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        """May this client SUBSCRIBE to ``topic_filter``? True when a read grant
        overlaps the filter and no deny covers it (see the module docstring:
        Mosquitto 2.0 grants every SUBSCRIBE; delivery is checked again)."""
        # $share/{ShareName}/{filter}: the filter is checked; a "$share/"
        # filter without both parts is an ordinary one (3.x; MQTT 5's codec
        # refuses it [MQTT-4.8.2-1, MQTT-4.8.2-2])
        topic_filter = split_share(topic_filter)[1]
        if not topic_filter:
            return False
        for e in self._users.get(username, ()):
            if e.access == _NONE and covers(e.topic, topic_filter):
                return False
        for e in self._users.get(username, ()):
            if e.access & _READ and overlaps(e.topic, topic_filter):
                return True
        if not self._patterns:
            return False
        if (username is not None and ("+" in username or "#" in username)) \
                or "+" in client_id or "#" in client_id:
            return False
        subst = [(p, _substitute(p.topic, client_id, username)) for p in self._patterns
                 if not (p.uses_username and username is None)]
        for p, t in subst:
            if p.access == _NONE and covers(t, topic_filter):
                return False
        return any(p.access & _READ and overlaps(t, topic_filter) for p, t in subst)

    def _check(self, username: str | None, client_id: str, topic: str, access: int,
               match) -> bool:
        if not topic:
            return False
        for e in self._users.get(username, ()):
            if topic[0] == "$" and e.topic[0] != "$":
                continue
            if match(e.topic, topic):
                if e.access == _NONE:
                    return False
                if access & e.access:
                    return True
        if not self._patterns:
            return False
        if (username is not None and ("+" in username or "#" in username)) \
                or "+" in client_id or "#" in client_id:
            return False
        for p in self._patterns:
            if p.uses_username and username is None:
                continue
            if match(_substitute(p.topic, client_id, username), topic):
                if p.access == _NONE:
                    return False
                if access & p.access:
                    return True
        return False

    def __len__(self) -> int:
        return sum(len(e) for e in self._users.values()) + len(self._patterns)

    def __repr__(self) -> str:
        named = sum(1 for u in self._users if u is not None)
        return (f"AclFile({self.path!r}, users={named}, anonymous={None in self._users}, "
                f"entries={len(self)}, patterns={len(self._patterns)})")


def _add(entries: list[_Entry], entry: _Entry) -> None:
    """Mosquitto's order: a deny goes to the front of the list, a grant to the end."""
    if entry.access == _NONE:
        entries.insert(0, entry)
    else:
        entries.append(entry)


def _signature(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


class AclWatcher:
    """Holds the current :class:`AclFile` for a path and rereads it when the
    file changes (modification time, size or inode, looked at no more than
    every ``interval_s``; driven by :meth:`check` or :meth:`current`, no
    threads). A file that fails to parse (or disappears) on reload keeps the
    previous rules and logs one line with the error, once per change of the
    file; a missing or bad file at start raises (FileNotFoundError,
    :class:`AclFileError`)."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 2.0,
                 now: float | None = None) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self._sig = _signature(self.path)
        self._acl = AclFile.load(self.path)
        self._checked = time.monotonic() if now is None else now
        self.reloads = 0
        self.failures = 0
        log.info("ACL file %s: %d entries, %d patterns", self.path, len(self._acl),
                 len(self._acl._patterns))

    def check(self, now: float) -> bool:
        """Look at the file now; reread it if it changed. True when new rules
        were loaded."""
        self._checked = now
        try:
            sig = _signature(self.path)
        except OSError as exc:
            if self._sig is not None:
                self.failures += 1
                log.warning("ACL file %s: cannot be read (%s); keeping the previous rules",
                            self.path, exc.strerror or type(exc).__name__)
            self._sig = None
            return False
        if sig == self._sig:
            return False
        self._sig = sig
        try:
            acl = AclFile.load(self.path)
        except (OSError, AclFileError) as exc:
            self.failures += 1
            log.warning("ACL file reload failed, keeping the previous rules: %s", exc)
            return False
        self._acl = acl
        self.reloads += 1
        log.info("ACL file %s reloaded: %d entries, %d patterns", self.path, len(acl),
                 len(acl._patterns))
        return True

    def current(self, now: float) -> AclFile:
        """The rules in force, after a :meth:`check` if ``interval_s`` has passed."""
        if now - self._checked >= self.interval_s:
            self.check(now)
        return self._acl
