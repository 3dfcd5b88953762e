"""The capture log page's example (docs/capture.md) runs as written."""

from tests.docs.examples import doc_examples


def test_capture_log_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEGATE_DATA_DIR", str(tmp_path))
    (code,) = doc_examples("docs/capture.md", "Writing and reading from Python")
    exec(compile(code, "docs/capture.md", "exec"), {})
    assert (tmp_path / "capture" / "meta.json").exists()
