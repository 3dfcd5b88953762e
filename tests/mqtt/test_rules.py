"""The rule table: docs/rules.md is generated from it and up to date, every id
the code raises is in it, and every decoder rule is exercised by a test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.mqtt.rules import RULES, SEED_NUMBERING, VECTOR_DEVIATIONS, render_markdown

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "bridge" / "mqtt"
TESTS = Path(__file__).resolve().parent
SEEDS = ROOT.parent / "shared" / "seeds"
RULE_LITERAL = re.compile(r"\"((?:MQTT-\d+(?:\.\d+)*-\d+)|(?:LG-[a-z0-9-]+))\"")


def _literals(paths) -> set[str]:
    found: set[str] = set()
    for path in paths:
        found |= set(RULE_LITERAL.findall(path.read_text(encoding="utf-8")))
    return found


def test_docs_rules_md_is_up_to_date():
    path = ROOT / "docs" / "rules.md"
    assert path.read_text(encoding="utf-8") == render_markdown(), (
        "docs/rules.md is stale: python -m bridge.mqtt > docs/rules.md")


def test_every_rule_id_raised_by_the_code_is_in_the_table():
    used = _literals(p for p in SOURCE.glob("*.py") if p.name != "rules.py")
    assert used - set(RULES) == set()


def test_every_decoder_rule_is_raised_somewhere_and_tested():
    used = _literals(p for p in SOURCE.glob("*.py") if p.name != "rules.py")
    tests = "".join(p.read_text(encoding="utf-8")
                    for p in TESTS.glob("test_*.py") if p.name != "test_rules.py")
    for rule_id, rule in RULES.items():
        if rule.enforced == "decode":
            assert rule_id in used, f"{rule_id} is in the table but never raised"
        assert rule_id in tests, f"{rule_id} has no test"


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_rule_shape(rule_id):
    rule = RULES[rule_id]
    assert re.fullmatch(r"MQTT-\d+(\.\d+)*-\d+|LG-[a-z0-9-]+", rule_id)
    assert rule.kind in ("malformed", "protocol")
    assert rule.enforced in ("decode", "session", "encode")
    if rule.kind == "malformed":
        assert rule.reason_code == 0x81
    else:
        assert rule.reason_code >= 0x80 and rule.reason_code != 0x81
    if rule_id.startswith("LG-"):
        assert rule.note, "project ids must say where they come from"
    if rule.seed:
        assert rule.seed in SEED_NUMBERING


def test_seed_numbering_lists_ids_the_seeds_use():
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not present at {SEEDS}")
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in SEEDS.iterdir())
    for seed_id in SEED_NUMBERING:
        assert f"[{seed_id}]" in text, seed_id


def test_deviations_name_known_rules():
    for d in VECTOR_DEVIATIONS:
        assert d.our_rule in RULES
        assert d.vector_reason != RULES[d.our_rule].reason_code
