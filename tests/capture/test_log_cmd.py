"""``lakegate log stats|dump`` and ``lakegate bench log`` (in-process through bridge.cli.main)."""

import json

import pytest

from bridge.cli import main
from tests.capture.util import append_range, frame, open_log


@pytest.fixture
def data_dir(tmp_path):
    with open_log(tmp_path / "capture", partitions=2) as log:
        append_range(log, 0, 40)
    return tmp_path


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stats_json(data_dir, capsys):
    code, out, _ = _run(capsys, "log", "stats", "--format", "json", "--set", f"data_dir={data_dir}")
    assert code == 0
    doc = json.loads(out)
    assert doc["stream"] == "mqtt-frames" and doc["format"] == 1 and doc["records"] == 40
    parts = doc["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    assert sum(p["records"] for p in parts) == 40
    for p in parts:
        assert p["first_offset"] == 0 and p["next_offset"] == p["records"] and p["bytes"] > 0
        assert p["committed"] == {}


def test_stats_text_shows_consumers(data_dir, capsys):
    from bridge.capture import commit_offsets

    commit_offsets(data_dir / "capture", "spark", {0: 3, 1: 4})
    code, out, _ = _run(capsys, "log", "stats", "--dir", str(data_dir / "capture"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"capture log {data_dir / 'capture'}: stream mqtt-frames, 2 partitions, format 1")
    assert lines[1].split() == ["partition", "first", "next", "records", "bytes", "segments", "committed"]
    assert lines[2].split()[0] == "0" and lines[2].endswith("spark=3")
    assert lines[-1].startswith("total")


def test_dump_shows_headers_and_sizes_not_payloads(data_dir, capsys):
    code, out, _ = _run(capsys, "log", "dump", "--dir", str(data_dir / "capture"), "-p", "0", "-n", "3")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("partition=0 offset=0 seq=")
    assert "value_bytes=" in lines[0] and "conn_id=edge:" in lines[0] and "origin=client" in lines[0]
    assert frame(0).hex() not in out and "t/0|" not in out


def test_dump_payload_json(data_dir, capsys):
    code, out, _ = _run(capsys, "log", "dump", "--dir", str(data_dir / "capture"), "--payload", "--format", "json")
    assert code == 0
    rows = [json.loads(x) for x in out.splitlines()]
    assert len(rows) == 40
    by_seq = {r["seq"]: r for r in rows}
    assert bytes.fromhex(by_seq[0]["value_hex"]) == frame(0)
    assert by_seq[0]["value_bytes"] == len(frame(0))
    assert ["origin", "client"] in by_seq[0]["headers"]


def test_dump_from_offset(data_dir, capsys):
    code, out, _ = _run(capsys, "log", "dump", "--dir", str(data_dir / "capture"), "-p", "1", "--from", "5", "-n", "2")
    assert code == 0
    assert [ln.split()[1] for ln in out.splitlines()] == ["offset=5", "offset=6"]


def test_missing_log_is_a_usage_error(tmp_path, capsys):
    code, _, err = _run(capsys, "log", "stats", "--set", f"data_dir={tmp_path}")
    assert code == 2
    assert err.strip() == f"lakegate: no capture log at {tmp_path / 'capture'} (meta.json is missing)"


def test_bad_partition_is_a_usage_error(data_dir, capsys):
    code, _, err = _run(capsys, "log", "dump", "--dir", str(data_dir / "capture"), "-p", "7")
    assert code == 2 and err.strip() == "lakegate: --partition 7: the log has partitions 0-1"


def test_bench_log_runs_and_reports(tmp_path, capsys):
    code, out, _ = _run(capsys, "bench", "log", "--json", "--no-spark", "--records", "3000", "--disk-mib", "2",
                        "--fsync-seconds", "0.2", "--set", f"data_dir={tmp_path}")
    assert code == 0
    doc = json.loads(out)
    assert doc["append"]["records"] == 3000 and doc["read"]["records"] == 3000
    for k in ("appends_per_s", "durable_wait_p50_ms", "durable_wait_p99_ms"):
        assert doc["append"][k] > 0
    assert doc["disk"]["seq_write_mb_s"] > 0 and doc["disk"]["fsync_per_s"] > 0
    assert doc["policy"]["fsync_interval_ms"] == 2  # the default policy
    assert list(tmp_path.iterdir()) == []  # the benchmark's directory is removed


def test_bench_registry_lists_log():
    from bridge.commands.bench import BENCHES

    assert "log" in BENCHES
