"""The tables' Arrow schemas and partition columns, from :mod:`schemas.tables`:
what reads or writes a table without an engine (the edge's retained
snapshot) imports these, not :mod:`bridge.tables.engine`."""

from __future__ import annotations

import pyarrow as pa

from schemas.ddl import to_arrow
from schemas.tables import MESSAGES_PARTITION_BY, TABLES

__all__ = ["PARTITION_BY", "SCHEMAS"]

SCHEMAS: dict[str, pa.Schema] = {name: to_arrow(ddl) for name, ddl in TABLES.items()}
PARTITION_BY: dict[str, list[str]] = {"messages": MESSAGES_PARTITION_BY, "retained": [], "quarantine": ["receive_date"]}
