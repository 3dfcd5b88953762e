"""Modules with one job (issue 40, item 4): a module of bridge/ over
:data:`LIMIT` lines is split where a second job lives inside it, or its
module docstring says in a paragraph starting "One piece:" why it is one
(ARCHITECTURE.md, "Who owns what", lists the modules of each package)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500
MARK = "One piece:"


def _lines(path: Path) -> int:
    """Lines as ``wc -l`` counts them."""
    return path.read_bytes().count(b"\n")


def _says_one_piece(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return any(p.strip().startswith(MARK) for p in re.split(r"\n[ \t]*\n", doc))


def test_every_long_module_is_split_or_says_why_it_is_one_piece():
    long = sorted((_lines(p), str(p.relative_to(ROOT))) for p in (ROOT / "bridge").rglob("*.py")
                  if _lines(p) > LIMIT)
    silent = [f"{path} ({n} lines)" for n, path in long if not _says_one_piece(ROOT / path)]
    assert not silent, (
        f"over {LIMIT} lines, and no paragraph of the module docstring starts with {MARK!r}: "
        "split the module where a second job lives in it, or say why it is one piece:\n  "
        + "\n  ".join(silent))


def test_the_check_sees_a_paragraph_only_where_one_starts(tmp_path):
    ok = tmp_path / "ok.py"
    ok.write_text('"""Title.\n\nOne piece: the reasons.\n"""\n')
    inline = tmp_path / "inline.py"
    inline.write_text('"""Title. One piece: not a paragraph of its own.\n"""\n')
    none = tmp_path / "none.py"
    none.write_text("x = 1\n")
    assert _says_one_piece(ok)
    assert not _says_one_piece(inline)
    assert not _says_one_piece(none)
