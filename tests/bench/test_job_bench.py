"""``lakegate bench job --json`` at small size: the floor and the job both
processed every batch of the same log, every number is there, and the
job's own breakdown (parse, tables) is reported."""

from __future__ import annotations

import json

import pytest

from bridge.cli import main

pytestmark = [pytest.mark.slow]


def test_bench_job_json(tmp_path, capsys):
    code = main(["bench", "job", "--json", "--records", "600", "--batch", "200", "--repeat", "1",
                 "--idle", "1", "--warmup", "0", "--set", f"data_dir={tmp_path}", "--set", "amqp.url="])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, out
    assert out["forwarding"] is False
    for side in ("floor", "job"):
        run = out[side]["runs"][0]
        assert run["batches"] >= 5 and run["warm_batches"] == 4, out  # 600 PUBLISHes and the edge's CONNECT and close records, by 200, then the idle one
        assert 0 < out[side]["wall_p50_s"] <= out[side]["wall_p99_s"], out
        assert out[side]["cpu_p50_s"] > 0 and out[side]["after_idle_wall_s"] > 0, out
        assert out[side]["parts_p50_s"]["addBatch"] > 0, out
    assert {"read_parse", "tables"} <= set(out["job"]["foreach_batch_p50_s"]), out
    assert out["ratio_wall_p50"] > 0 and out["job_idle_over_warm"] > 0
