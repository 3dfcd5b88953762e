"""The README's capture log example runs as written."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_examples(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end if end > 0 else None], re.S)


def test_capture_log_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEGATE_DATA_DIR", str(tmp_path))
    code = readme_examples("Capture log")[0]
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "capture" / "meta.json").exists()
