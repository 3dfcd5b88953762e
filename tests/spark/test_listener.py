"""JsonEventListener: progress events cross py4j as one JSON string and still
carry every field the job's progress listener reads."""

from __future__ import annotations

import json
import threading

import pytest

pytestmark = pytest.mark.spark


def test_progress_events_arrive_from_json_with_the_fields_the_job_reads(spark, tmp_path):
    from bridge.spark.listener import JsonEventListener

    got: list = []
    arrived = threading.Event()

    class Listener(JsonEventListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            got.append(event.progress)
            if event.progress.numInputRows:
                arrived.set()

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    try:
        q = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="0.2 seconds").start())
        try:
            assert arrived.wait(60), "no progress event with rows"
        finally:
            q.stop()
    finally:
        spark.streams.removeListener(listener)
    p = next(p for p in got if p.numInputRows)
    assert str(p.id) == q.id and p.batchId >= 0 and p.batchDuration >= 0
    assert {"addBatch", "triggerExecution"} <= set(p.durationMs)
    assert json.loads(p.sources[0].endOffset) is not None  # a JSON text, as fromJObject gives
    assert p.processedRowsPerSecond >= 0
    assert type(listener)._jlistener is JsonEventListener._jlistener  # noqa: SLF001 - ours, not PySpark's
