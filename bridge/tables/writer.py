"""The table step of a micro-batch: messages, quarantine, then retained.

Called once per micro-batch on the driver with the batch's parsed frames as
Arrow. Each table write carries the application transaction (``app_id`` =
the streaming query's id, ``version`` = the batch id) and is skipped when the
table already committed it, so a batch Spark re-runs after a crash (tables
committed, checkpoint not) writes nothing twice and leaves no gap. A write
that fails because another writer committed the same batch at the same
moment (a second job on this checkpoint) is one line (:func:`once`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import pyarrow as pa

from bridge.failpoints import failpoint
from bridge.tables.engine import TableEngine, one_line
from bridge.tables.retained_rule import retained_changes
from bridge.tables.rows import split_batch, unforwardable_rows

T = TypeVar("T")

__all__ = ["ConcurrentJobError", "TableStats", "once", "rule_counts", "write_tables", "write_unforwardable"]


class ConcurrentJobError(RuntimeError):
    """Another writer committed the batch this one was committing, under the
    same application transaction: a second job on the same checkpoint."""


def once(engine: TableEngine, table: str, app_id: str, version: int, write: Callable[[], T]) -> T:
    """``write()`` (one table write of batch ``version`` under ``app_id``);
    when it fails and ``table`` now has that batch under the same
    application transaction, another writer committed it at the same moment
    (Delta refused this commit: delta-rs ``CommitFailedError ... Concurrent
    transaction failed``, delta-spark ``ConcurrentTransactionException``):
    :class:`ConcurrentJobError`, one line. Any other failure is raised as it was."""
    try:
        return write()
    except Exception as exc:
        try:
            last = engine.committed_version(table, app_id)
        except Exception:  # noqa: BLE001 - the table cannot say: the original error stands
            last = None
        if last is None or last < version:
            raise
        words = next((ln.strip() for ln in str(exc).splitlines() if "oncurrent" in ln), one_line(exc))
        raise ConcurrentJobError(
            f"{table}: another writer committed batch {version} of {app_id} at the same moment (Delta: "
            f"{words[:120]}): a second job runs on this checkpoint (the same data_dir and job.query_name); run "
            "one job per checkpoint. This one stops; nothing was written twice") from exc


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
    for table, part in (("messages", rows.messages), ("quarantine", rows.quarantine)):
        if not once(engine, table, app_id, batch_id, lambda: engine.append(table, part, app_id, batch_id)):
            skipped.append(table)
    changes = retained_changes(rows.messages)
    merged = once(engine, "retained", app_id, batch_id,
                  lambda: engine.merge_retained(changes, app_id, batch_id, coverage))
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
        app = f"{app_id}/unforwardable"
        once(engine, "quarantine", app, batch_id, lambda: engine.append("quarantine", rows, app, batch_id))
    return rows.num_rows
