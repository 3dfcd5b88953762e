"""The documentation site builds with every link and anchor resolved, and
the README stays a short page for users."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import yaml

from tests.docs.examples import ROOT, page_text


def test_mkdocs_build_strict_resolves_every_link_and_anchor(tmp_path):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert time.monotonic() - started < 120


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_under_docs_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages
    assert (ROOT / "docs" / "architecture.md").resolve() == (ROOT / "ARCHITECTURE.md").resolve()


def test_the_readme_is_a_short_page_for_users():
    readme = page_text("README.md")
    assert len(readme.splitlines()) < 500
    for heading in ("## Quick start", "### Operator", "### Data engineer", "### Analyst", "## Where to go next"):
        assert heading in readme, heading
    # figures and measurement diaries live on docs/benchmarks.md
    for word in ("msg/s", "p99", "median", "measured"):
        assert word not in readme, word


def test_the_readme_links_every_page_of_the_site():
    readme = page_text("README.md")
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages - linked - {"index.md", "architecture.md"} == set()
