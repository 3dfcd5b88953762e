"""The configuration written out: as TOML with each value's source
(:func:`render_toml`, ``lakegate config``), and as JSON over a pipe to a
child process that must see exactly the parent's configuration
(:func:`config_to_wire`, read back by :func:`config_from_wire`).

Loading, the checks and masking secrets are :mod:`bridge.config`'s.
"""

from __future__ import annotations

import json
from typing import Any

from bridge.config import Config, _mask_tree, known_keys

__all__ = ["config_from_wire", "config_to_wire", "render_toml"]


def config_to_wire(cfg: Config) -> str:
    """The whole configuration as JSON, secrets and all, with where each value
    came from (``sources``) and what relative paths are relative to
    (``bases``): for a child process of this one (``lakegate run``'s edge,
    :mod:`bridge.job.edge_process`), which must see exactly the parent's
    configuration -- the same values, and the same "set by the user or
    default" that checks like :mod:`bridge.edge.exposure` depend on. Sent
    over a pipe, never on a command line or in the environment."""
    return json.dumps({"values": cfg.as_dict(), "sources": cfg.sources, "bases": cfg.bases})


def config_from_wire(text: str) -> Config:
    """The configuration :func:`config_to_wire` sent (values as they were: no
    checks again, no environment, no file)."""
    wire = json.loads(text)
    cfg = Config()
    for key in known_keys():
        section, _, name = key.rpartition(".")
        tree = wire["values"][section] if section else wire["values"]
        if name in tree:
            setattr(getattr(cfg, section) if section else cfg, name, tree[name])
    cfg.sources.update(wire["sources"])
    cfg.bases.update(wire["bases"])
    return cfg


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)


def render_toml(cfg: Config, masked: bool = True, with_sources: bool = True) -> str:
    """The effective configuration as TOML, each value's source as a comment."""
    d = cfg.as_dict()
    if masked:
        _mask_tree(d)
    lines: list[str] = []

    def emit(key: str, name: str, value: Any) -> None:
        line = f"{name} = {_toml_value(value)}"
        if with_sources:
            line += f"  # {cfg.sources.get(key, 'default')}"
            if key == "data_dir":  # relative to its file (or conf/ for the default): say where that is
                line += f"; = {cfg.data_path}"
        lines.append(line)

    for k, v in d.items():
        if not isinstance(v, dict):
            emit(k, k, v)
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append("")
            lines.append(f"[{k}]")
            for name, value in v.items():
                emit(f"{k}.{name}", name, value)
    return "\n".join(lines) + "\n"
