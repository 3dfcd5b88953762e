"""MQTT topic-filter matching (Spark-free), as a subscription would match.

* ``+`` matches exactly one level, ``#`` (last, alone in its level) matches the
  parent level and any number of levels below [MQTT-4.7.1-1, MQTT-4.7.1-2];
* a filter starting with a wildcard does not match a topic name starting with
  ``$`` [MQTT-4.7.2-1];
* no normalisation: levels are compared character by character [MQTT-4.7.3-4].

``valid_filter`` says whether a filter is well formed; ``matches`` returns
None for an ill-formed filter (SQL's NULL) so that a query over many rows does
not fail on one bad filter.
"""

from __future__ import annotations

__all__ = ["matches", "valid_filter"]


def valid_filter(topic_filter: str) -> bool:
    """True when the filter obeys MQTT-4.7.1-1/-2 and MQTT-4.7.3-1/-2."""
    if not topic_filter or "\x00" in topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str | None, topic: str | None) -> bool | None:
    """Whether a PUBLISH to ``topic`` matches ``topic_filter``.

    None when either is None or the filter is ill-formed. An empty topic or one
    with wildcards never matches (it is not a valid topic name).
    """
    if topic_filter is None or topic is None or not valid_filter(topic_filter):
        return None
    if not topic or "+" in topic or "#" in topic:
        return False
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
