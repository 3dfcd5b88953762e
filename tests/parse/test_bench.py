"""``lakegate bench parse``: a small run works, (a) and (b) agree, and the
generated mix looks like the one documented."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from bridge.bench.parse import floor, measure
from bridge.bench.parse_mix import generate
from bridge.commands.bench import BENCHES
from bridge.parse import parse_frames


def test_parse_is_registered():
    assert BENCHES["parse"][0] == "bridge.bench.parse"


def test_generated_mix():
    frames, levels, alias = generate(20_000, seed=3)
    table = parse_frames(frames, levels, alias)
    types = table.column("packet_type").to_numpy()
    assert 0.97 < np.mean(types == 3) < 0.995
    assert 0.01 < np.mean(np.isin(types, [4, 5, 6, 7])) < 0.02
    invalid = 1 - np.mean(table.column("valid").to_numpy(zero_copy_only=False))
    assert 0.015 < invalid < 0.05
    topic_len = np.array([len(t) for t in table.column("topic").drop_null().to_pylist()])
    assert np.mean((topic_len >= 20) & (topic_len <= 60)) > 0.95
    size = table.column("payload_size").drop_null().to_numpy()
    assert size.min() >= 9 and size.max() <= 4096   # one byte short for cut records
    topics, payloads = floor(frames)
    assert topics.null_count == payloads.null_count == np.sum(types != 3)


def test_small_measurement():
    res = measure(3000, scalar_frames=3000, rounds=3)
    assert res["a_and_b_agree"] is True
    # interleaved: every round timed (a) on the whole batch and (b) on a third
    assert [r["b_frames"] for r in res["per_round"]] == [1000, 1000, 1000]
    assert all(r["a_s"] > 0 and r["a_copy_s"] > 0 and r["b_s"] > 0 for r in res["per_round"])
    assert set(res["rates_frames_per_s"]) == {"vectorised", "vectorised_copied_payloads", "scalar",
                                              "scalar_decode_only", "floor"}
    assert res["per_row_python"]["rows"] > 0
    assert 0 <= res["per_row_python"]["share_of_vectorised"] < 1


@pytest.mark.subprocess
def test_cli_json(lakegate_cmd):
    out = subprocess.run(lakegate_cmd + ["bench", "parse", "--frames", "2000", "--rounds", "1", "--json"],
                         capture_output=True, text=True, timeout=300, check=True)
    res = json.loads(out.stdout)
    assert {"a_over_b", "a_over_c", "rates_frames_per_s"} <= set(res)
