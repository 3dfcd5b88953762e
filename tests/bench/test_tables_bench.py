"""``lakegate bench tables`` at tiny size: both engines wrote every step
(the files each added), every number is there; the generated batches hold
what the bench says they hold."""

from __future__ import annotations

import pytest

from bridge.bench.tables import _frames, measure
from bridge.tables.retained_rule import retained_changes
from bridge.tables.rows import split_batch


@pytest.mark.parametrize("share, retained", [(1.0, 100), (0.09, 9)])
def test_the_batches_hold_their_share_of_retained_publishes_and_quarantined_frames(share, retained):
    rows = split_batch(_frames(100, 0, 1000, share, 0.01 if share < 1 else 0.0))
    assert retained_changes(rows.messages).num_rows == retained  # (a share of 1.0 once gave none at all)
    assert rows.quarantine.num_rows == (1 if share < 1 else 0)


@pytest.mark.spark
@pytest.mark.slow
def test_bench_tables_both_engines_write_every_step(spark, tmp_path):
    from bridge.spark.session import delta_spark_available

    if not delta_spark_available(spark):
        pytest.fail("delta-spark's classes are not on the classpath: run scripts/bootstrap")
    out = measure(spark, tmp_path, [200], topics=500, changes=50, repeat=1)
    (batch,) = out["batches"]
    for step in (batch, out["merge"]):
        for engine in ("delta-rs", "delta-spark"):
            r = step[engine]
            assert r["wall_s"] > 0 and r["cpu_s"] >= 0, out
    # a batch: messages, quarantine, retained each got a file; the merge: messages and retained
    assert batch["delta-rs"]["files"] == 3 and out["merge"]["delta-rs"]["files"] == 2, out
    assert batch["delta-spark"]["files"] >= 3 and out["merge"]["delta-spark"]["files"] >= 2, out
    assert not any(tmp_path.iterdir())  # the tables are removed as the bench goes
