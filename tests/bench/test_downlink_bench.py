"""``lakegate bench downlink --json`` end to end at small size on the real
RabbitMQ: every side (the edge, a bare proton receiver, RabbitMQ's MQTT
plugin where scripts/services enabled it) received every message, every number present and sane."""

from __future__ import annotations

import json

import pytest

from bridge.cli import main

pytestmark = [pytest.mark.broker, pytest.mark.subprocess]


def test_bench_downlink_json(tmp_path, capsys, rabbitmq):
    code = main(["bench", "downlink", "--json", "--messages", "300", "--repeat", "1",
                 "--timeout", "60", "--set", f"data_dir={tmp_path}", "--set", f"amqp.url={rabbitmq}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    sides = ["edge", "proton"] + (["rabbitmq_mqtt"] if "rabbitmq_mqtt" in out else [])
    assert "rabbitmq_mqtt" in out or out["rabbitmq_mqtt_not_measured"], out  # measured, or why not
    for side in sides:
        assert out[side]["complete"] and out[side]["received"] == [300], out
        assert out[side]["missing"] == [], out
        assert out[side]["msgs_per_s"] > 0 and 0 < out[side]["p50_ms"] <= out[side]["p99_ms"]
    assert out["ratio"] > 0 and out["qos"] == 1
    assert isinstance(out["target_met"], bool)
