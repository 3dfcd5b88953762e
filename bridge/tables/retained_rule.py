"""The MQTT retained-message rule, as one pure function over a micro-batch.

For the valid PUBLISH rows of one micro-batch (any order), return one row per
topic that the batch changes, shaped as the ``retained`` table
(``schemas.tables.RETAINED_DDL``):

* RETAIN=1 with a payload: the topic's retained message becomes this one
  [MQTT-3.3.1-5];
* RETAIN=1 with zero bytes: the topic's retained message is removed and the
  zero-byte message is not stored [MQTT-3.3.1-6, MQTT-3.3.1-7]: the row is a
  tombstone (``deleted`` true, no payload);
* RETAIN=0: never stored, changes nothing [MQTT-3.3.1-8] (the seed document
  numbers this MQTT-3.3.1-10; the OASIS 5.0 standard numbers it -8);
* the latest publish by capture sequence wins within the batch; the MERGE that
  applies the result only replaces a row whose ``seq`` is lower, so a late,
  older record never overwrites a newer one across batches;
* a QoS 2 re-send the edge marked as duplicate is ignored (applied once);
* wills published with retain count as retained publishes (they arrive as
  PUBLISH rows with origin ``will``).

``expires_at`` is the receive time plus the Message Expiry Interval (MQTT 5).
The function is Spark-free and runs on the driver over Arrow data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.ddl import to_arrow
from schemas.tables import RETAINED_DDL

__all__ = ["RETAINED_SCHEMA", "SUPERSEDES_SQL", "TOMBSTONE_NULLS", "retained_changes", "supersedes"]

# The order rule itself lives in a module of its own (no Arrow imports), so
# that the edge's retained store uses it without loading pyarrow.compute.
from bridge.tables.retained_order import SUPERSEDES_SQL, supersedes  # noqa: E402,F401

RETAINED_SCHEMA = to_arrow(RETAINED_DDL)

_COPIED = (
    "topic", "payload", "payload_size", "qos", "payload_format_indicator", "message_expiry_interval",
    "content_type", "response_topic", "correlation_data", "user_properties", "client_id", "origin",
    "stream", "partition", "offset", "seq",
)
#: Columns a tombstone keeps; the rest become null.
_TOMBSTONE_KEEPS = {"topic", "client_id", "origin", "stream", "partition", "offset", "seq", "payload_size"}
#: The columns a tombstone has null: what both engines' expiry
#: (``TableEngine.expire_retained``) clears when it turns an expired row into one.
TOMBSTONE_NULLS = tuple(n for n in RETAINED_SCHEMA.names if n not in _TOMBSTONE_KEEPS and n != "deleted")


def retained_changes(publishes: pa.Table) -> pa.Table:
    """One row per topic changed by this batch's valid PUBLISH rows (see module doc).

    ``publishes`` needs the columns of ``schemas.tables.MESSAGES_DDL`` (extra
    columns are ignored). Returns a table with ``RETAINED_SCHEMA``.
    """
    if publishes.num_rows == 0:
        return RETAINED_SCHEMA.empty_table()
    keep = pc.and_(pc.fill_null(publishes["retain"], False), pc.invert(pc.fill_null(publishes["duplicate"], False)))
    t = publishes.filter(keep)
    if t.num_rows == 0:
        return RETAINED_SCHEMA.empty_table()
    # Latest by capture sequence per topic: sort by (topic, seq desc), keep each topic's first row.
    t = t.sort_by([("topic", "ascending"), ("seq", "descending")])
    topics = t["topic"].combine_chunks()
    first = np.ones(t.num_rows, dtype=bool)
    if t.num_rows > 1:
        same = pc.equal(topics.slice(1), topics.slice(0, t.num_rows - 1))
        first[1:] = ~same.to_numpy(zero_copy_only=False)
    t = t.filter(pa.array(first))

    deleted = pc.equal(pc.fill_null(t["payload_size"], 0), 0)
    cols: dict[str, pa.Array] = {}
    for name in RETAINED_SCHEMA.names:
        typ = RETAINED_SCHEMA.field(name).type
        if name == "deleted":
            col = deleted
        elif name == "set_at":
            col = t["receive_time"]
        elif name == "expires_at":
            secs = pc.cast(t["message_expiry_interval"], pa.int64())
            col = pc.add(pc.cast(t["receive_time"], pa.timestamp("us", tz="UTC")),
                         pc.cast(pc.multiply(secs, 1_000_000), pa.duration("us")))
        else:
            col = t[name]
        col = pc.cast(col, typ)
        if name not in _TOMBSTONE_KEEPS and name != "deleted":
            col = pc.if_else(deleted, pa.scalar(None, typ), col)
        cols[name] = col
    return pa.Table.from_pydict(cols, schema=RETAINED_SCHEMA)
