"""The edge page's embedding example (docs/edge.md) runs as written."""

from bridge.capture import LogReader
from tests.docs.examples import doc_examples


def test_edge_embedding_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEGATE_DATA_DIR", str(tmp_path))
    (code,) = doc_examples("docs/edge.md", "Embedding")
    exec(compile(code, "docs/edge.md", "exec"), {})
    reader = LogReader(tmp_path / "capture")
    durable = reader.durable_offsets()
    values = [r.value for p in range(reader.partitions) for r in reader.records(p, 0, durable[p])]
    assert any(v[:1] == b"\x32" and v.endswith(b"21.5") for v in values)
