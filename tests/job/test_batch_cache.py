"""Where the batch step parses a micro-batch (driver or the executors' pandas
UDF) and which batches it keeps in Spark's cache: only those the executors
may forward (they read the frames again). The size comes from Spark's offset
log, written before foreachBatch runs."""

from __future__ import annotations

import json

import pytest

from bridge.config import load_config
from bridge.job.batch import BatchStep, batch_records


def _offsets(checkpoint, batch_id, ends):
    d = checkpoint / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    (d / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({str(p): o for p, o in ends.items()})}")


def test_batch_records_is_this_batch_end_minus_the_previous_one(tmp_path):
    _offsets(tmp_path, 4, {0: 100, 1: 50})
    _offsets(tmp_path, 5, {0: 130, 1: 50, 2: 7})  # partition 2: new, starts at 0
    assert batch_records(tmp_path, 5) == 30 + 0 + 7


def test_a_checkpoints_first_batch_is_at_most_its_end_offsets(tmp_path):
    # it starts at the source's initial offsets, the log's earliest: 0 or more
    _offsets(tmp_path, 0, {0: 10, 1: 0, 2: 3})
    assert batch_records(tmp_path, 0) == 13


@pytest.mark.parametrize("setup, batch_id", [
    (lambda cp: _offsets(cp, 3, {0: 10}), 3),  # the previous batch's file purged
    (lambda cp: (_offsets(cp, 2, {0: 1}), (cp / "offsets" / "3").write_text("v1\n{}\nnot json")), 3),
])
def test_batch_records_unknown_is_none(tmp_path, setup, batch_id):
    setup(tmp_path)
    assert batch_records(tmp_path, batch_id) is None


@pytest.mark.parametrize("forward, limit, parse_limit, records, on_driver, cached", [
    (False, 2000, 2000, 10_000, False, False),  # executors parse; nothing reads the frames twice
    (False, 2000, 2000, 2000, True, False),     # parsed on the driver
    (False, 2000, 0, 200, False, False),        # driver parsing off: the pandas UDF
    (True, 2000, 2000, 200, True, False),       # parsed and forwarded on the driver
    (True, 2000, 2000, 2000, True, False),
    (True, 2000, 2000, 2001, False, True),      # may go to the executors
    (True, 500, 2000, 1000, False, True),       # forwarded by the executors: they parse it
    (True, 2000, 0, 200, False, False),         # executors parse, the driver forwards its Arrow copy
    (True, 0, 2000, 200, False, True),          # driver forwarding off
    (True, 2000, 2000, None, False, True),      # size unknown: assume big
    (False, 2000, 2000, None, False, False),
    (False, 2000, 500_000, 160_000, True, False),  # the default: every batch the trigger admits
    (True, 2000, 500_000, 160_000, False, True),   # unless the executors forward it
])
def test_where_a_batch_is_parsed_and_whether_it_is_cached(tmp_path, forward, limit, parse_limit, records,
                                                          on_driver, cached):
    cfg = load_config(None, [f"data_dir={tmp_path}", f"job.forward_on_driver_max_rows={limit}",
                             f"job.parse_on_driver_max_rows={parse_limit}"], env={})
    if records is not None:
        _offsets(tmp_path, 6, {0: 1000})
        _offsets(tmp_path, 7, {0: 1000 + records})
    step = BatchStep(cfg, engine=None, checkpoint=tmp_path, forward=(lambda *a, **k: None) if forward else None)
    place = step._placement(7)  # noqa: SLF001 - the decision itself
    assert (place.records, place.parse_on_driver, place.cache) == (records, on_driver, cached)
