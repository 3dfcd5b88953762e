"""The job records with each retained commit the capture offsets the version
covers (bridge/tables/coverage.py), which the edge's retained store starts
its overlay from."""

from __future__ import annotations

import pytest

from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.tables.coverage import covered_offsets
from bridge.tables.deltars import DeltaRsEngine
from tests.edge.util import Harness, connect, publish
from tests.job.frames import run_once

pytestmark = pytest.mark.spark


def test_each_retained_commit_records_the_capture_offsets_it_covers(spark, tmp_path):
    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=2", "amqp.url="], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    h = Harness(conn_id="one", log=log)
    h.feed(connect(4, client_id="one"))
    for i in range(3):
        h.feed(publish(4, f"cov/{i}", b"v", 1, packet_id=i + 1, retain=True))
    ends = log.next_offsets()
    log.close()

    run_once(spark, cfg)
    engine = DeltaRsEngine(cfg.tables_dir)
    covered = covered_offsets(engine.history("retained"), cfg.capture.stream)
    # every record was in the batch: each partition with records is covered to its end
    assert covered == {p: e for p, e in enumerate(ends) if e}
    assert covered_offsets(engine.history("retained"), "another-stream") is None
    assert sorted(r["topic"] for r in engine.arrow("retained").to_pylist()) == [
        "cov/0", "cov/1", "cov/2"]
