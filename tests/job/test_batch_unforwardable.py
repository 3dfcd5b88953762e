"""The batch step quarantines the rows forwarding could not make a message of
(``LG-amqp-unforwardable``) or the peer refused for their own sake
(``LG-amqp-rejected``), counts them, and the batch goes on; a re-run batch
quarantines them once."""

from __future__ import annotations

import pytest

from bridge.amqp.sender import ForwardResult
from bridge.amqp.unforwardable import Unforwardable
from bridge.capture import CaptureLog
from bridge.config import load_config
from bridge.job.batch import BatchStep
from bridge.tables.deltars import DeltaRsEngine
from tests.job.frames import append_publish

pytestmark = pytest.mark.spark


class SinkResult:
    """Stands for ``bridge.amqp.sink.forward_batch`` (tested against RabbitMQ in
    tests/amqp/test_sink.py): returns what it returns when one row could not be
    made a message of."""

    def __init__(self, offset: int, rule: str, error: str) -> None:
        self.offset = offset
        self.rule = rule
        self.error = error
        self.calls = 0

    def __call__(self, df, batch_id, aligned=False, **driver):  # rows, table: the driver path's
        self.calls += 1
        rows = driver["rows"] if df is None else df.count()
        fail = Unforwardable("mqtt-frames", 0, self.offset, self.rule, self.error)
        return ForwardResult(rows=rows, accepted=rows - 1, unforwardable=1, failures=[fail])


@pytest.mark.parametrize("parsed_on", ["executors", "driver"])
@pytest.mark.parametrize("rule, error", [
    ("LG-amqp-unforwardable", "[LG-amqp-unforwardable] ValueError: does not fit"),
    ("LG-amqp-rejected", "[LG-amqp-rejected] AMQP peer did not accept publish mqtt-frames/0/1 sent to address "
                         "'/topic/t.1': rejected (amqp:decode-error: cannot decode) (3 attempts)"),
])
def test_lg_amqp_unforwardable_and_lg_amqp_rejected_row_is_quarantined_counted_once_and_the_batch_completes(
        spark, tmp_path, rule, error, parsed_on):
    from bridge.spark.source import register

    cfg = load_config(None, [f"data_dir={tmp_path}", "capture.partitions=1", "amqp.url="], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    acks = [append_publish(log, "c1", f"t/{i}", b"p%d" % i, packet_id=i + 1) for i in range(3)]
    for a in acks:
        a.wait(10)
    log.close()
    register(spark)
    records = spark.read.format("lakegate").load(str(cfg.capture_dir))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q-1"}\n')
    batch_id = 0  # no offset log entry: size unknown, the executors' pandas UDF parses it
    if parsed_on == "driver":  # the offset log says 3 records: the driver parses them
        batch_id = 5
        (checkpoint / "offsets").mkdir()
        for i, end in ((4, 0), (5, 3)):
            (checkpoint / "offsets" / str(i)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"0":{end}}}')
    engine = DeltaRsEngine(cfg.tables_dir)
    engine.ensure()
    seen = []
    sink = SinkResult(offset=1, rule=rule, error=error)
    step = BatchStep(cfg, engine, checkpoint, forward=sink, on_stats=seen.append)

    step(records, batch_id)
    step(records, batch_id)  # the batch runs again (checkpoint not committed): written once

    assert sink.calls == 2
    q = engine.arrow("quarantine").to_pylist()
    assert [(r["offset"], r["rule"], r["error"], r["packet_type"]) for r in q] == [
        (1, rule, error, 3)]
    assert engine.arrow("messages").num_rows == 3  # valid MQTT: still a message
    assert [(s.tables.quarantined, s.forward_unforwardable, s.forwarded) for s in seen] == [(1, 1, 2), (1, 1, 2)]
    assert seen[0].extra["forward"]["unforwardable"] == 1
    assert [s.extra["parsed_on"] for s in seen] == [parsed_on] * 2
