"""``lakegate bench amqp``: runs end to end against the real RabbitMQ (small)."""

from __future__ import annotations

import argparse
import json

import pytest

from bridge.bench import amqp as bench
from bridge.config import load_config

pytestmark = pytest.mark.broker


def test_bench_amqp_json(rabbitmq, capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--json", "--messages", "300", "--repeat", "1", "--topics", "2"])
    assert bench.run(args, load_config(None, [f"amqp.url={rabbitmq}"], env={})) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["messages"] == 300 and out["topics"] == 2 and out["url"].endswith("@127.0.0.1:5672")
    assert "guest:guest" not in out["url"]
    assert out["sink_msgs_per_s"] > 0 and out["bare_msgs_per_s"] > 0
    assert out["ratio"] == pytest.approx(out["sink_msgs_per_s"] / out["bare_msgs_per_s"], rel=0.01)


def test_bench_amqp_needs_a_url(capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args([]), load_config(None, ["amqp.url="], env={})) == 2
    assert "amqp.url is empty" in capsys.readouterr().out
