"""The table step of a micro-batch: messages, quarantine, then retained.

Called once per micro-batch on the driver with the batch's parsed frames as
Arrow. Each table write carries the application transaction (``app_id`` =
the streaming query's id, ``version`` = the batch id) and is skipped when the
table already committed it, so a batch Spark re-runs after a crash (tables
committed, checkpoint not) writes nothing twice and leaves no gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from bridge.failpoints import failpoint
from bridge.tables.engine import TableEngine
from bridge.tables.retained_rule import retained_changes
from bridge.tables.rows import split_batch, unforwardable_rows

__all__ = ["TableStats", "rule_counts", "write_tables", "write_unforwardable"]


@dataclass(frozen=True)
class TableStats:
    messages: int
    quarantined: int
    retained_upserts: int
    retained_deletes: int
    skipped_tables: tuple[str, ...]  # tables that had this batch already (a replay)
    #: quarantined rows by rule id, ((rule, n), ...)
    quarantined_by_rule: tuple[tuple[str, int], ...] = ()


def rule_counts(quarantine: pa.Table) -> tuple[tuple[str, int], ...]:
    """((rule, rows), ...) of quarantine rows, by rule id."""
    if quarantine.num_rows == 0 or "rule" not in quarantine.column_names:
        return ()
    vc = quarantine.column("rule").value_counts()
    return tuple(sorted((str(v["values"]), int(v["counts"])) for v in vc.to_pylist()))


def write_tables(engine: TableEngine, frames: pa.Table, app_id: str, batch_id: int,
                 coverage: str | None = None) -> TableStats:
    """``coverage``: the retained commit's ``userMetadata`` (the capture
    offsets the new version reflects, ``bridge.tables.coverage``)."""
    rows = split_batch(frames)
    skipped = []
    if not engine.append("messages", rows.messages, app_id, batch_id):
        skipped.append("messages")
    if not engine.append("quarantine", rows.quarantine, app_id, batch_id):
        skipped.append("quarantine")
    merged = engine.merge_retained(retained_changes(rows.messages), app_id, batch_id, coverage)
    if merged.skipped:
        skipped.append("retained")
    failpoint("after-tables-commit", batch_id)
    return TableStats(
        messages=rows.messages.num_rows,
        quarantined=rows.quarantine.num_rows,
        retained_upserts=merged.upserts,
        retained_deletes=merged.deletes,
        skipped_tables=tuple(skipped),
        quarantined_by_rule=rule_counts(rows.quarantine),
    )


def write_unforwardable(engine: TableEngine, frames: pa.Table, failures, app_id: str, batch_id: int) -> int:
    """Quarantine the rows forwarding set aside as unforwardable (after the
    forwarding step, so under an app id of its own: ``<app_id>/unforwardable``,
    version = batch id; a re-run batch writes them once). Returns how many."""
    rows = unforwardable_rows(frames, failures)
    if rows.num_rows:
        engine.append("quarantine", rows, f"{app_id}/unforwardable", batch_id)
    return rows.num_rows
