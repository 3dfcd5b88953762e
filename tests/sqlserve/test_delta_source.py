"""The endpoint's Python data source reader (bridge/sqlserve/delta_source.py),
driven directly (no Spark): it reads a Delta table's newest version, or a
version asked for, file by file with its partition values, under a directory
whose name needs percent-encoding in the Delta log."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from bridge.sqlserve.delta_source import _Reader, source_class
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.engine import SCHEMAS
from bridge.tables.views import VERSIONS_ARROW
from tests.tables.rows import publish, table


def _read(options: dict) -> pa.Table:
    r = _Reader(options)
    schema = VERSIONS_ARROW if options["table"] == "retained_versions" else SCHEMAS[options["table"]]
    batches = [b for p in r.partitions() for b in r.read(p)]
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


@pytest.fixture
def tables(tmp_path):
    root = tmp_path / "data dir" / "tables"  # a space: %20 in the Delta log's paths
    engine = DeltaRsEngine(root)
    engine.ensure()
    now = dt.datetime(2026, 11, 26, 10, 0, tzinfo=dt.timezone.utc)
    for batch in range(3):
        rows = [publish(f"dev/{batch}/{i}", b"v%d" % i, seq=10 * batch + i,
                        at=now + dt.timedelta(days=batch)) for i in range(4)]
        engine.append("messages", table(rows), "test", batch)
    return root


def test_reads_the_newest_version_file_by_file_with_partition_values(tables):
    got = _read({"delta_dir": str(tables / "messages"), "table": "messages"}).sort_by("seq")
    assert got.num_rows == 12
    assert got.column("topic").to_pylist()[:2] == ["dev/0/0", "dev/0/1"]
    assert sorted(set(got.column("receive_date").to_pylist())) == [dt.date(2026, 11, 26), dt.date(2026, 11, 27),
                                                                    dt.date(2026, 11, 28)]
    assert len(_Reader({"delta_dir": str(tables / "messages"), "table": "messages"}).partitions()) == 3


def test_a_version_asked_for_and_the_versions_list(tables):
    old = _read({"delta_dir": str(tables / "messages"), "table": "messages", "version": "1"})
    assert old.num_rows == 4
    versions = _read({"delta_dir": str(tables / "messages"), "table": "retained_versions"})
    assert versions.column("version").to_pylist() == [3, 2, 1, 0]


def test_an_empty_table_reads_no_rows(tables):
    assert _read({"delta_dir": str(tables / "quarantine"), "table": "quarantine"}).num_rows == 0


def test_fixed_sources_read_under_the_tables_dir_of_the_environment(tables, monkeypatch):
    cls = source_class("messages")
    assert cls.name() == "lakegate_messages"
    monkeypatch.delenv("LG_ENDPOINT_TABLES_DIR", raising=False)
    with pytest.raises(ValueError, match="LG_ENDPOINT_TABLES_DIR is not set"):
        cls({}).reader(None)
    monkeypatch.setenv("LG_ENDPOINT_TABLES_DIR", str(tables))
    src = cls({})
    assert "topic STRING" in src.schema()
    r = src.reader(None)
    assert sum(b.num_rows for p in r.partitions() for b in r.read(p)) == 12
