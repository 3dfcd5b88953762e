"""``lakegate bench e2e --quick --json``: both sides measured in one run,
every number present and sane, and lakegate lost no acknowledged message
when its process group was SIGKILLed mid-run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import child_env

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.broker, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = child_env()
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def _lat_ok(d: dict, qs=("p50", "p95", "p99")) -> None:
    assert d is not None
    values = [d[q] for q in qs]
    assert 0 < values[0] and values == sorted(values) and values[-1] <= d["max"], d


@pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                    reason="mosquitto is not installed (scripts/services up installs it)")
def test_bench_e2e_quick_json(rabbitmq):
    proc = subprocess.run(
        # a 1 s trigger keeps lakegate's steps short (a step spans six triggers)
        [sys.executable, "-m", "bridge", "bench", "e2e", "--quick", "--json", "--set", f"amqp.url={rabbitmq}",
         "--set", "job.trigger_interval_s=1"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=420)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, (out, proc.stderr[-3000:])
    rate = out["offered_rate"]
    assert out["quick"] and rate > 0 and out["cpus"] >= 1

    for side in ("lakegate", "glue"):
        d = out[side]
        lat = d["latency"]
        assert lat["acknowledged"] == lat["messages"] == lat["received"], (side, lat)
        assert lat["lost_acknowledged"] == 0
        _lat_ok(lat["e2e_ms"])
        _lat_ok(lat["puback_ms"], ("p50", "p99"))
        assert lat["send_rate"] > 0.9 * rate
        steps = d["sustained"]["steps"]
        assert steps and all(st["offered_rate"] > 0 and "sustained" in st for st in steps)
        kill = d["kill"]
        assert kill["offered_rate"] == rate and 0 < kill["acknowledged"] <= kill["sent"]
        assert kill["lost_acknowledged"] >= 0 and kill["duplicates"] >= 0

    lg = out["lakegate"]
    # durable capture + checkpoint replay: at least once, whatever the kill interrupted
    assert lg["kill"]["lost_acknowledged"] == 0, lg["kill"]
    assert lg["kill"]["all_acknowledged_received_s"] is not None
    assert lg["kill"]["killed_at_s"] is not None
    cfg = lg["config"]
    assert cfg["partitions"] >= 1 and cfg["max_records_per_trigger"] > 0 and cfg["trigger_interval_s"] > 0
    assert cfg["forward_by"] == "auto" and cfg["live_interval_ms"] > 0  # lakegate run forwards live

    modes = out["ack_modes"]
    _lat_ok(modes["capture_puback_ms"], ("p50", "p99"))
    _lat_ok(modes["forward_puback_ms"], ("p50", "p99"))
    # "forward" waits for the AMQP peer's acceptance, "capture" only for the fsync
    assert modes["forward_puback_ms"]["p50"] > modes["capture_puback_ms"]["p50"]
    assert modes["difference_ms"]["p50"] == pytest.approx(
        modes["forward_puback_ms"]["p50"] - modes["capture_puback_ms"]["p50"], abs=0.02)

    ratios = out["ratios"]
    assert ratios["e2e_p50_lakegate_to_glue"] > 0
    assert "sustained_rate_lakegate_to_glue" in ratios
    assert out["consumer_queue"].startswith(("deleted 1 queue", "rabbitmqctl not found")), out["consumer_queue"]
