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
    args = p.parse_args(["--json", "--messages", "300", "--repeat", "1", "--topics", "1"])
    assert bench.run(args, load_config(None, [f"amqp.url={rabbitmq}"], env={})) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["messages"] == 300 and out["topics"] == 1 and out["url"].endswith("@127.0.0.1:5672")
    assert "guest:guest" not in out["url"]
    assert out["sink_msgs_per_s"] > 0 and out["bare_msgs_per_s"] > 0
    assert out["ratio"] == pytest.approx(out["sink_msgs_per_s"] / out["bare_msgs_per_s"], rel=0.01)


def test_bench_amqp_many_topics_against_one_with_the_links_counts(rabbitmq, capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--json", "--messages", "100", "--runs", "2", "--topics", "300"])
    assert bench.run(args, load_config(None, [f"amqp.url={rabbitmq}", "amqp.max_links=50"], env={})) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["messages"] == 300 and out["topics"] == 300 and out["repeat"] == 2  # at least one per topic
    assert out["topics_msgs_per_s"] > 0 and out["one_topic_msgs_per_s"] > 0
    assert out["ratio"] == pytest.approx(out["topics_msgs_per_s"] / out["one_topic_msgs_per_s"], rel=0.01)
    assert out["peak_links"] == 50 and out["one_topic_peak_links"] == 1 and not out["relay"]
    assert out["attaches"] >= 250 and out["detaches"] >= 200 and out["max_links"] == 50  # 50 may stay open
    p.parse_args(["--topics", "5"])  # text output too
    assert bench.run(p.parse_args(["--messages", "20", "--runs", "1", "--topics", "5"]),
                     load_config(None, [f"amqp.url={rabbitmq}"], env={})) == 0
    text = capsys.readouterr().out
    assert "5 topics" in text and "1 topic" in text and "peak links" in text


def test_bench_amqp_needs_a_url(capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args([]), load_config(None, ["amqp.url="], env={})) == 2
    assert "amqp.url is empty" in capsys.readouterr().out
