"""The import contract of bridge/ (pyproject.toml [tool.importlinter],
ARCHITECTURE.md): no module imports from a layer above its own, lazy
imports included, and the edge never loads Spark."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layers() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in conf["contracts"] if c["type"] == "layers"]
    return layers


def test_the_import_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_every_module_of_bridge_has_a_layer():
    # a new top-level module or package would otherwise sit outside the contract
    named = {name.strip() for layer in _layers() for part in layer.split("|") for name in part.split(":")}
    tops = {f"bridge.{p.stem}" for p in (ROOT / "bridge").glob("*.py") if p.stem != "__init__"}
    tops |= {f"bridge.{p.parent.name}" for p in (ROOT / "bridge").glob("*/__init__.py")}
    assert tops - named == set()
    assert named - tops == set()


def test_the_edge_imports_neither_pyspark_nor_py4j():
    # what the contract says of the import graph, at run time: a fresh
    # interpreter that loads the edge server, the downlink and the retained store
    code = ("import sys, bridge.edge.server, bridge.edge.downlink, bridge.edge.retained.store, "
            "bridge.edge.retained.snapshot; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'delta')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
