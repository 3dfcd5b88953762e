"""Table maintenance: expire retained messages, compact small files, vacuum.

``run_maintenance`` is what ``lakegate compact`` runs and what the job runs on
its schedule (``tables.compact_interval_s``). Vacuum never removes files
younger than ``tables.vacuum_retention_hours`` and refuses a retention below
``MIN_VACUUM_HOURS`` (a reader or a time-travel query may still need them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from bridge.tables.engine import TableEngine

__all__ = ["MIN_VACUUM_HOURS", "MaintenanceReport", "run_maintenance"]

log = logging.getLogger(__name__)

MIN_VACUUM_HOURS = 1


@dataclass
class MaintenanceReport:
    expired: int = 0
    compacted: dict[str, Any] = field(default_factory=dict)
    vacuumed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        comp = ", ".join(f"{t} {m.get('files_removed', 0)}->{m.get('files_added', 0)} files" for t, m in self.compacted.items())
        vac = ", ".join(f"{t} {n}" for t, n in self.vacuumed.items())
        return f"expired retained: {self.expired}; compacted: {comp}; vacuumed files: {vac}; {self.seconds:.1f}s"


def run_maintenance(engine: TableEngine, vacuum_retention_hours: int, now_us: int | None = None) -> MaintenanceReport:
    """Expire retained messages, compact every table, vacuum old files."""
    if vacuum_retention_hours < MIN_VACUUM_HOURS:
        raise ValueError(f"tables.vacuum_retention_hours must be at least {MIN_VACUUM_HOURS} (got {vacuum_retention_hours})")
    t0 = time.monotonic()
    engine.ensure()
    report = MaintenanceReport()
    report.expired = engine.expire_retained(now_us if now_us is not None else time.time_ns() // 1000)
    report.compacted = engine.compact()
    report.vacuumed = engine.vacuum(vacuum_retention_hours)
    report.seconds = time.monotonic() - t0
    log.info("maintenance: %s", report.line())
    return report
