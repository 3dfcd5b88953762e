"""``mqtt_match(filter, topic)`` as a SQL function (no Python worker).

The same rule as :func:`bridge.topic_filter.matches` (tests compare the two
over a corpus of filters and topics):

* NULL when either is NULL or the filter is ill-formed: empty, a NUL
  character, ``#`` not alone in the last level [MQTT-4.7.1-2], ``+`` not
  alone in its level [MQTT-4.7.1-3];
* false for a topic that is empty or holds a wildcard [MQTT-4.7.3-1], and
  for a ``$`` topic against a filter starting with a wildcard [MQTT-4.7.2-1];
* otherwise a Java regular expression built from the filter: the filter
  quoted (``\\Q...\\E``, with ``\\E`` inside it escaped), ``+`` -> one level
  (``[^/]*``), a last ``/#`` -> the parent level or any levels below
  (``(/.*)?``), ``#`` alone -> any topic; DOTALL and ``\\z`` so that a
  newline in a topic is a character like any other.

A permanent SQL function is in the catalog every session of a Spark
Connect endpoint shares, which a Python UDF cannot be: any client, a BI
tool included, calls it without lakegate's code.
"""

from __future__ import annotations

__all__ = ["MQTT_MATCH_BODY", "create_function_sql"]

#: The function's body over its parameters ``flt`` and ``topic`` (Spark SQL,
#: raw string literals: r'...' keeps backslashes as they are).
MQTT_MATCH_BODY = r"""CASE
  WHEN flt IS NULL OR topic IS NULL THEN NULL
  WHEN flt = '' OR instr(flt, char(0)) > 0 OR flt RLIKE r'(?s)#.|[^/]#|[^/]\+|\+[^/]' THEN NULL
  WHEN topic = '' OR instr(topic, '+') > 0 OR instr(topic, '#') > 0 THEN false
  WHEN startswith(topic, '$') AND (startswith(flt, '+') OR startswith(flt, '#')) THEN false
  WHEN flt = '#' THEN true
  ELSE topic RLIKE concat(r'(?s)^',
         replace(replace(concat(r'\Q', replace(flt, r'\E', r'\E\\E\Q'), r'\E'),
                         '+', r'\E[^/]*\Q'),
                 r'/#\E', r'\E(/.*)?'),
         r'\z')
END"""


def create_function_sql(temporary: bool = False) -> str:
    """``CREATE OR REPLACE [TEMPORARY] FUNCTION mqtt_match ...``."""
    kind = "TEMPORARY FUNCTION" if temporary else "FUNCTION"
    return (f"CREATE OR REPLACE {kind} mqtt_match(flt STRING, topic STRING) RETURNS BOOLEAN "
            f"COMMENT 'whether a subscription to flt receives a PUBLISH to topic (MQTT 4.7); NULL for an "
            f"ill-formed filter' RETURN {MQTT_MATCH_BODY}")
