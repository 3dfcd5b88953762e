"""``lakegate bench edge`` end to end with tiny numbers: both servers measured
in one run, every field of the JSON present, every acknowledged frame captured."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bridge.cli import main


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                    reason="mosquitto is not installed (scripts/services up installs it)")
def test_bench_edge_json(tmp_path, capsys):
    code = main(["bench", "edge", "--json", "--connections", "2", "--messages", "3000",
                 "--acked-messages", "1000", "--window", "50", "--repeat", "1",
                 "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for server in ("edge", "mosquitto"):
        for q in ("qos0", "qos1", "qos2"):
            phase = out[server][q]
            assert phase["complete"] and phase["msgs_per_s"] > 0, (server, q, phase)
        lat = out[server]["qos1"]["puback_latency_ms"]
        assert 0 < lat["p50"] <= lat["p99"]
    assert set(out["ratio_edge_to_mosquitto"]) == {"qos0", "qos1", "qos2"}
    cap = out["edge_capture"]
    assert cap["all_acknowledged_captured"] and cap["publish"] == 3000 + 1000 + 1000
    assert cap["pubrel"] == 1000
