"""``lakegate bench job --json`` at small size: the floor and the job both
processed every batch of the same log, every number is there, and the
job's own breakdown (parse, tables) is reported."""

from __future__ import annotations

import json

import pytest

from bridge.cli import main


@pytest.mark.slow
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


def test_bench_job_sizes_follow_the_rate_and_the_trigger():
    """A batch is what --rate brings in one trigger (200 msg/s at the default
    5 s: 1,000 records), the log holds BATCHES of them; explicit sizes win;
    bad ones are a usage error (one line, exit 2) before any Spark starts."""
    import argparse

    from bridge.bench.job import BATCHES, _sizes
    from bridge.cli import UsageError
    from bridge.config import load_config

    def ns(**kw):
        return argparse.Namespace(**{"rate": 200.0, "batch": None, "records": None, **kw})

    five, one = load_config(None, ["job.trigger_interval_s=5"]), load_config(None, ["job.trigger_interval_s=1"])
    assert (_sizes(ns(), five).batch, _sizes(ns(), five).records) == (1000, BATCHES * 1000)
    assert _sizes(ns(), one).batch == 200
    assert _sizes(ns(rate=50.0), one).batch == 50
    got = _sizes(ns(batch=300, records=900), five)
    assert (got.batch, got.records) == (300, 900)
    with pytest.raises(UsageError, match="--rate must be positive"):
        _sizes(ns(rate=0.0), five)
    with pytest.raises(UsageError, match="at least 1"):
        _sizes(ns(batch=0), five)


def test_bench_job_bad_rate_is_one_line_exit_2(capsys):
    assert main(["bench", "job", "--rate", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lakegate: bench job: --rate must be positive, got -1"]
