"""The README's edge example runs as written."""

from bridge.capture import LogReader
from tests.capture.test_readme import readme_examples


def test_edge_embedding_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEGATE_DATA_DIR", str(tmp_path))
    code = readme_examples("MQTT edge")[0]
    exec(compile(code, "README.md", "exec"), {})
    reader = LogReader(tmp_path / "capture")
    durable = reader.durable_offsets()
    values = [r.value for p in range(reader.partitions) for r in reader.records(p, 0, durable[p])]
    assert any(v[:1] == b"\x32" and v.endswith(b"21.5") for v in values)
