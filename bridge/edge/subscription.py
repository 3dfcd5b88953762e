"""What the subscription tree (:mod:`bridge.edge.topics`) holds and gives:
:class:`Sub` (one session's subscription), :class:`SharedGroup` (the
members of one Shared Subscription, MQTT 5.0 section 4.8.2, and its round
robin), :class:`Matches` (a PUBLISH's receivers, one walk's result) and
:func:`split_share`. Apart from the tree, whose docstring says how they
are matched, because the router, the sessions, the ACL, the journal and the
downlink use them without the tree."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

__all__ = ["Matches", "SharedGroup", "Sub", "split_share"]

_SHARE = "$share/"


def split_share(topic_filter: str) -> tuple[str | None, str]:
    """``(ShareName, filter)`` of ``$share/{ShareName}/{filter}``, else ``(None, topic_filter)``.

    A ``$share/`` prefix without a non-empty ShareName and filter is an
    ordinary filter here (the codec refuses it in MQTT 5 [MQTT-4.8.2-1/-2]).
    """
    if topic_filter.startswith(_SHARE):
        name, sep, rest = topic_filter[len(_SHARE):].partition("/")
        if name and sep and rest:
            return name, rest
    return None, topic_filter


@dataclasses.dataclass(frozen=True, slots=True)
class Sub:
    """One subscription of one client, with its granted options."""

    client_id: str
    #: As subscribed, including a ``$share/{ShareName}/`` prefix if any.
    topic_filter: str
    #: Granted QoS 0..2.
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    #: MQTT 5 Subscription Identifier, None when the SUBSCRIBE had none.
    sub_id: int | None = None

    @property
    def share(self) -> str | None:
        """The ShareName of a Shared Subscription, None otherwise."""
        return split_share(self.topic_filter)[0]

    @property
    def filter(self) -> str:
        """The Topic Filter without its ``$share/{ShareName}/`` prefix."""
        return split_share(self.topic_filter)[1]


class SharedGroup:
    """The members of one Shared Subscription group ``$share/{name}/{topic_filter}``.

    ``members`` maps Client Identifier to its ``Sub``, in the order the
    clients joined (a re-subscription keeps its place). The group returned
    in :class:`Matches` is the tree's own: callers read ``members`` and call
    :meth:`pick`, never modify ``members``.
    """

    __slots__ = ("name", "topic_filter", "members", "_cursor", "_order")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        #: The filter without the ``$share/{name}/`` prefix.
        self.topic_filter = topic_filter
        self.members: dict[str, Sub] = {}
        self._cursor = 0                       # index in member order of the next turn
        self._order: list[Sub] | None = None   # members as a list, rebuilt after a change

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return f"SharedGroup({self.name!r}, {self.topic_filter!r}, {len(self.members)} members)"

    def pick(self, prefer: Callable[[str], bool] = lambda cid: True) -> Sub | None:
        """The member to receive the next message, round robin.

        Starting at the cursor, take the next member for which
        ``prefer(client_id)`` is true (say, its client is connected and its
        window has room); when no member is preferred, the member whose turn
        it is. The cursor moves past the member taken. None when empty.
        ``prefer`` is called at most once per member.
        """
        order = self._order
        if order is None:
            order = self._order = list(self.members.values())
        n = len(order)
        if not n:
            return None
        start = self._cursor % n
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            sub = order[i]
            if prefer(sub.client_id):
                self._cursor = i + 1
                return sub
        self._cursor = start + 1
        return order[start]

    def pick_among(self, eligible: Callable[[str], bool],
                   prefer: Callable[[str], bool] = lambda cid: True) -> Sub | None:
        """:meth:`pick` among the members for which ``eligible(client_id)``
        (a cluster edge: those it serves); None when none is."""
        order = self._order
        if order is None:
            order = self._order = list(self.members.values())
        n = len(order)
        start = self._cursor % n if n else 0
        first = None
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            sub = order[i]
            if not eligible(sub.client_id):
                continue
            if prefer(sub.client_id):
                self._cursor = i + 1
                return sub
            if first is None:
                first = i
        if first is None:
            return None
        self._cursor = first + 1
        return order[first]

    @property
    def key(self) -> str:
        """``{name}/{topic_filter}``: the group as every edge names it."""
        return f"{self.name}/{self.topic_filter}"

    def _put(self, sub: Sub) -> Sub | None:
        old = self.members.get(sub.client_id)
        self.members[sub.client_id] = sub  # a replaced member keeps its place
        self._order = None
        return old

    def _pop(self, client_id: str) -> Sub | None:
        old = self.members.get(client_id)
        if old is None:
            return None
        # The turn stays with the member it belonged to: when a member before
        # the cursor leaves, the cursor moves back one.
        cursor = self._cursor % len(self.members)
        if list(self.members).index(client_id) < cursor:
            cursor -= 1
        self._cursor = cursor
        del self.members[client_id]
        self._order = None
        return old


class Matches:
    """The subscriptions a topic matches (the result of :meth:`SubscriptionTree.match`).

    ``found`` holds the matching nodes' own containers (a ``Sub`` or a dict
    Client Identifier -> ``Sub``), not copies: one node's container has a
    client at most once, so a match with one container needs no grouping
    (the router's fast path). Read a result before the tree changes
    (``version``: the tree's :attr:`SubscriptionTree.version` it was taken at)."""

    __slots__ = ("found", "shared", "_direct", "version")

    def __init__(self, found: list | None = None, shared: list[SharedGroup] | None = None) -> None:
        #: the matching nodes' non-shared subscriptions, one container per node
        self.found: list = [] if found is None else found
        #: Every Shared Subscription group whose filter matches the topic.
        self.shared: list[SharedGroup] = [] if shared is None else shared
        self._direct: dict[str, list[Sub]] | None = None
        self.version = -1

    def width(self) -> int:
        """The deliveries routing this result costs at most: the matching
        subscriptions, a shared group counting once."""
        n = len(self.shared)
        for subs in self.found:
            n += 1 if type(subs) is Sub else len(subs)
        return n

    @property
    def direct(self) -> dict[str, list[Sub]]:
        """Client Identifier -> its non-shared subscriptions matching the
        topic (at least one each; several when a client's filters overlap)."""
        d = self._direct
        if d is None:
            d = self._direct = {}
            for subs in self.found:
                for sub in ((subs,) if type(subs) is Sub else subs.values()):
                    got = d.get(sub.client_id)
                    if got is None:
                        d[sub.client_id] = [sub]
                    else:
                        got.append(sub)
        return d

    def __bool__(self) -> bool:
        return bool(self.found or self.shared)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Matches):
            return NotImplemented
        return self.direct == other.direct and self.shared == other.shared

    def __repr__(self) -> str:
        return f"Matches(direct={self.direct!r}, shared={self.shared!r})"
