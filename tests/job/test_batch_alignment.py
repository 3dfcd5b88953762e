"""Forwarding skips its shuffle only when the micro-batch's Spark partitions
are whole capture partitions in offset order -- the source's plan."""

from __future__ import annotations

import pytest

from bridge.job.batch import partitions_aligned
from bridge.job.pipeline import frame_rows
from tests.capture.util import append_range, open_log

pytestmark = pytest.mark.spark


@pytest.fixture
def rows(spark, tmp_path):
    from bridge.spark.source import register

    register(spark)
    path = tmp_path / "capture"
    with open_log(path, partitions=3) as log:
        append_range(log, 0, 600, connections=9)
    return frame_rows(spark.read.format("lakegate").load(str(path)))


def _layout(df) -> list[tuple[int, list[int]]]:
    """Per Spark partition: the capture partitions in it and its offsets in row order."""
    from pyspark.sql import functions as F

    got = df.select(F.spark_partition_id().alias("sp"), "partition", "offset").collect()
    out: dict[int, tuple[set, list]] = {}
    for r in got:
        parts, offs = out.setdefault(r.sp, (set(), []))
        parts.add(r.partition)
        offs.append(r.offset)
    return [(len(parts), offs) for parts, offs in out.values()]


def test_the_sources_plan_is_aligned_and_the_check_says_so(rows):
    table = rows.toArrow()
    assert len(set(table["partition"].to_pylist())) == 3
    # the premise, seen directly: one capture partition per Spark partition, offsets ascending
    layout = _layout(rows)
    assert len(layout) == 3 and all(n == 1 and offs == sorted(offs) for n, offs in layout)
    assert partitions_aligned(rows, table)
    assert partitions_aligned(rows.where("offset % 2 = 0"), table)  # narrow steps keep it


def test_other_layouts_are_not_aligned(rows):
    table = rows.toArrow()
    assert not partitions_aligned(rows.repartition(5), table)
    assert not partitions_aligned(rows.coalesce(1), table)
    assert not partitions_aligned(rows.limit(0), table.slice(0, 0))  # nothing to forward
