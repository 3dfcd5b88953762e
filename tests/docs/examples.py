"""The examples on the documentation pages, for the tests that run them.

``doc_examples("docs/capture.md", "The Spark source")`` gives the code
blocks of that section (its subsections included), in order, so that a
test runs what the page shows, as written.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")

__all__ = ["ROOT", "doc_examples", "page_text", "section_text"]


def page_text(page: str) -> str:
    """A page's text; ``page`` is relative to the repository (``README.md``, ``docs/edge.md``)."""
    return (ROOT / page).read_text(encoding="utf-8")


def section_text(page: str, section: str) -> str:
    """The text under the heading ``section`` (any level) up to the next
    heading of the same or a higher level; code blocks are not searched for
    headings."""
    lines = page_text(page).split("\n")
    start = level = None
    fence = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
            continue
        m = None if fence else _HEADING.match(line)
        if not m:
            continue
        if start is None:
            if m.group(2) == section:
                start, level = i, len(m.group(1))
        elif len(m.group(1)) <= level:
            return "\n".join(lines[start:i])
    if start is None:
        raise KeyError(f"{page} has no section {section!r}")
    return "\n".join(lines[start:])


def doc_examples(page: str, section: str | None = None, lang: str = "python") -> list[str]:
    """The ``lang`` code blocks of a page's section (the whole page when
    ``section`` is None), in order."""
    text = page_text(page) if section is None else section_text(page, section)
    return re.findall(rf"^```{re.escape(lang)}\n(.*?)^```", text, re.S | re.M)
