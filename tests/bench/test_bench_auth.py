"""``lakegate bench auth`` with tiny numbers: both phases measured in one run,
the flood ran, and the legitimate client was served in both."""

from __future__ import annotations

import json

import pytest

from bridge.cli import main


@pytest.mark.subprocess
def test_bench_auth_json(tmp_path, capsys):
    code = main(["bench", "auth", "--json", "--seconds", "1", "--flood-rate", "50",
                 "--cost-ln", "10", "--interval-ms", "20", "--flood-addresses", "3", "--set", f"data_dir={tmp_path}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for phase in ("quiet", "flood"):
        x = out[phase]
        assert x["ok"] > 0 and x["refused"] == 0, (phase, x)
        assert 0 < x["p50_ms"] <= x["p99_ms"] <= x["max_ms"]
    assert out["flood"]["flood"]["sent"] > 0, out["flood"]["flood"]
    assert out["p99_ratio_flood_to_quiet"] > 0
