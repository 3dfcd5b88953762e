"""The pages generated from the code are up to date and complete:
``python -m bridge.commands.docs_reference`` writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge import config as cfgmod
from bridge.commands import docs_reference as ref
from tests.docs.examples import ROOT, page_text


def test_every_generated_page_and_table_is_up_to_date():
    stale = [str(p.relative_to(ROOT)) for p in ref.stale()]
    assert stale == [], f"stale: {stale}: run python -m bridge.commands.docs_reference"


def test_the_check_option_says_so_too():
    assert ref.main(["--check"]) == 0


def test_every_configuration_key_is_on_the_reference_page_with_a_meaning():
    page = page_text("docs/reference/configuration.md")
    keys = ref.config_keys()
    for k in keys:
        assert k.meaning, f"{k.key} has no meaning: give its field a #: comment in bridge/config_sections.py"
        rows = [line for line in page.splitlines() if line.startswith(f"| `{k.key}`<br>")]
        assert len(rows) == 1, k.key
        assert f"`{k.env}`" in rows[0]


def test_the_reference_covers_exactly_the_keys_the_loader_knows():
    keys = {k.key: k.type for k in ref.config_keys()}
    assert keys == cfgmod.known_keys()


def test_each_environment_variable_is_the_one_the_loader_reads():
    for k in ref.config_keys():
        got = [key for key, _text, _src in cfgmod._env_items({k.env: "x"})]
        assert got == [k.key], (k.env, got)


def test_a_meaning_kept_in_the_generator_only_for_fields_without_a_comment():
    keys = {k.key: k for k in ref.config_keys()}
    for key in ref.MEANINGS:
        assert key in keys, f"MEANINGS has {key}, which is no configuration key"
        assert not keys[key].comment, (f"{key} has a #: comment now: delete its entry from MEANINGS "
                                       "(bridge/commands/docs_reference.py)")


def _metric_name_patterns() -> set[str]:
    """Every metric name the sources under bridge/metrics/ spell, f-string
    placeholders as wildcards."""
    found = set()
    for path in (ROOT / "bridge" / "metrics").glob("*.py"):
        for m in re.finditer(r"[\"'](lakegate_[a-z0-9_{}]+)[\"']", path.read_text(encoding="utf-8")):
            found.add(m.group(1))
    return found


def test_every_metric_the_collector_can_serve_is_in_the_table():
    names = [name for name, *_ in ref.metric_families()]
    table = page_text("docs/metrics.md")
    for name in names:
        assert f"| `{name}` |" in table, name
    for spelled in _metric_name_patterns():
        pattern = re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[a-z0-9_]+", re.escape(spelled)) + "(_total)?$")
        assert any(pattern.match(n) for n in names), f"{spelled} (bridge/metrics/) is not in the generated table"


def test_the_home_page_is_the_readme_with_links_into_the_site():
    index = ref.site_index()
    assert "](docs/" not in index and "](ARCHITECTURE.md" not in index
    with pytest.raises(ValueError, match="conf/lakegate.toml"):
        ref.site_index("see [the file](conf/lakegate.toml)")


def test_a_page_without_its_markers_is_an_error(tmp_path):
    (tmp_path / "docs").mkdir()
    for rel in {p for p, _ in ref.BLOCKS}:
        Path(tmp_path / rel).write_text("no markers\n")
    with pytest.raises(ValueError, match="has no block"):
        ref.render(tmp_path)
