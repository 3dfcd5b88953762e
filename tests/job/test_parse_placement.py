"""A streaming run whose batches the driver parses (``bridge.rows.arrow_frames``)
writes the same three tables as a run whose every batch the pandas UDF parses
on the executors (``job.parse_on_driver_max_rows = 0``), from one capture log
holding every kind of record the edge writes."""

from __future__ import annotations

import shutil

import pytest

from bridge.config import load_config
from bridge.job.pipeline import progress_listener, release, start_query
from tests.job.test_arrow_frames import _fill

pytestmark = pytest.mark.spark

KEY = ["partition", "offset"]


def _run(spark, data_dir, parse_limit: int) -> tuple[dict, list[str]]:
    from bridge.tables.deltars import DeltaRsEngine

    cfg = load_config(None, [f"data_dir={data_dir}", "capture.partitions=3", "amqp.url=",
                             "job.max_records_per_trigger=4", f"job.parse_on_driver_max_rows={parse_limit}"], env={})
    listener = progress_listener(spark, cfg)
    placed: list[str] = []
    record = listener.record

    def keep(stats) -> None:
        placed.append(stats.extra["parsed_on"])
        record(stats)

    listener.record = keep
    query = start_query(spark, cfg, once=True, listener=listener)
    try:
        assert query.awaitTermination(240), "the job did not finish within 240 s"
        assert query.exception() is None, query.exception()
    finally:
        release(spark)
    engine = DeltaRsEngine(cfg.tables_dir)
    tables = {}
    for name in ("messages", "quarantine", "retained"):
        t = engine.arrow(name)
        order = [(c, "ascending") for c in (KEY if "offset" in t.column_names else t.column_names[:1])]
        tables[name] = t.sort_by(order).to_pylist()
    return tables, placed


def test_tables_are_the_same_whether_the_driver_or_the_pandas_udf_parses(spark, tmp_path):
    from bridge.spark.source import register

    register(spark)
    base = tmp_path / "base"
    _fill(load_config(None, [f"data_dir={base}", "capture.partitions=3"], env={}))
    for name in ("driver", "executors"):
        shutil.copytree(base / "capture", tmp_path / name / "capture")
    driver, driver_placed = _run(spark, tmp_path / "driver", 2000)
    udf, udf_placed = _run(spark, tmp_path / "executors", 0)
    # the first batch too: its end offsets bound its size
    assert set(driver_placed) == {"driver"} and len(driver_placed) > 1, driver_placed
    assert set(udf_placed) == {"executors"}
    assert len(driver["messages"]) >= 5 and driver["quarantine"] and driver["retained"]
    for name in driver:
        assert driver[name] == udf[name], name
