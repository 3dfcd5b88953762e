"""``lakegate bench retained-subscribe --json`` end to end at small size:
both servers served every matching retained message, every number present
and sane."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bridge.bench.retained_subscribe import FILTERS
from bridge.cli import main

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                       reason="mosquitto is not installed (scripts/services up installs it)"),
]


def test_bench_retained_subscribe_json(tmp_path, capsys):
    code = main(["bench", "retained-subscribe", "--json", "--topics", "40000", "--big-topics", "5000",
                 "--repeat", "1", "--timeout", "60", "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert [FILTERS[f](40000) for f in FILTERS] == [100, 10_000, 40_000]
    for f, point in out["replay"].items():
        assert point["expected"] == FILTERS[f](40000)
        for server in ("edge", "mosquitto"):
            assert point[server]["complete"], (f, server, point)
            assert point[server]["received"] == [point["expected"]]
            assert point[server]["median_s"] > 0
        assert point["ratio"] > 0
    s = out["startup"]
    assert s["big"]["topics"] == 5000 and s["empty"]["topics"] == 0
    assert 0 < s["empty"]["startup_s"] and 0 < s["big"]["startup_s"]
    assert s["big"]["rss_mb"] > 0 and s["empty"]["rss_mb"] > 0
    assert set(out["targets_met"]) == {"replay_ratio", "rss", "startup"}
