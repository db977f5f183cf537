"""matrices/*.yaml load strictly: the shipped files are valid, and every kind of mistake is
refused with the file and line named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from adaptcheck.base.paths import data_dir
from adaptcheck.base.yamldata import MatrixError, parse_model
from adaptcheck.compat.known_good import KnownGoodFile, load_known_good
from adaptcheck.compat.rules import RulesFile, load_rules


def test_shipped_files_are_valid_and_sourced() -> None:
    rules = load_rules()
    types = {r.type for r in rules.rules}
    assert {"cuda_driver_minimum", "requirement", "plugin_requires_vllm", "extension_matches_torch",
            "dependencies_satisfied"} <= types
    assert all(r.source.strip() for r in rules.rules)
    known = load_known_good()
    assert any(e.backend == "cpu" and e.basis == "measured" for e in known.entries)
    assert any(e.backend == "cuda" and e.device and "H100" in e.device for e in known.entries)
    assert all(e.source.strip() for e in known.entries)
    assert (data_dir("matrices") / "README.md").is_file()


def test_shipped_cuda_table_matches_nvidia_minimums() -> None:
    rule = next(r for r in load_rules().rules if r.type == "cuda_driver_minimum")
    assert {m.major: m.min_driver for m in rule.majors} == {11: "450.80.02", 12: "525.60.13", 13: "580"}


RULE_OK = """\
schema_version: 1
rules:
  - id: pin
    type: requirement
    description: d
    source: s
    requirer: [vllm]
    target: torch
"""


def _rules_error(text: str) -> str:
    with pytest.raises(MatrixError) as info:
        parse_model(textwrap.dedent(text), "my_rules.yaml", RulesFile, MatrixError)
    return str(info.value)


def test_valid_minimal_rules() -> None:
    assert parse_model(RULE_OK, "r.yaml", RulesFile).rules[0].id == "pin"


def test_unknown_key_is_an_error_naming_file_and_line() -> None:
    msg = _rules_error(RULE_OK + "    targt: torch\n")
    assert msg.startswith("my_rules.yaml:9:")
    assert "targt" in msg and "unknown key" in msg


def test_unknown_top_level_key() -> None:
    # the misspelt key is named, not the "rules: Field required" it causes
    assert _rules_error(RULE_OK.replace("rules:", "rulez:")) == "my_rules.yaml:2: rulez: unknown key"


def test_unknown_rule_type() -> None:
    msg = _rules_error(RULE_OK.replace("type: requirement", "type: requirment"))
    assert msg.startswith("my_rules.yaml:4:") and "requirment" in msg


def test_missing_source_is_refused() -> None:
    msg = _rules_error(RULE_OK.replace("    source: s\n", ""))
    assert "my_rules.yaml" in msg and "source" in msg and "Field required" in msg


def test_duplicate_key_and_duplicate_id() -> None:
    assert "my_rules.yaml:9: duplicate key 'target'" in _rules_error(RULE_OK + "    target: numpy\n")
    doubled = RULE_OK + RULE_OK.split("rules:\n", 1)[1]
    assert "duplicate rule ids: pin" in _rules_error(doubled)


def test_malformed_yaml_and_wrong_schema_version() -> None:
    assert "my_rules.yaml:4: malformed YAML" in _rules_error("schema_version: 1\nrules:\n  - id: [unclosed\n")
    assert "schema_version" in _rules_error(RULE_OK.replace("schema_version: 1", "schema_version: 2"))
    assert "my_rules.yaml:1: expected a YAML mapping" in _rules_error("- just\n- a list\n")


def test_bad_cuda_driver_value() -> None:
    msg = _rules_error("""\
        schema_version: 1
        rules:
          - id: cuda
            type: cuda_driver_minimum
            description: d
            source: s
            majors:
              - {major: 12, min_driver: "five-two-five"}
        """)
    assert msg.startswith("my_rules.yaml:8:") and "five-two-five" in msg


KG_OK = """\
schema_version: 1
entries:
  - id: e
    description: d
    backend: cpu
    versions: {torch: "==2.13.*"}
    source: s
    date: "2026-11"
    basis: measured
"""


def _kg_error(text: str) -> str:
    with pytest.raises(MatrixError) as info:
        parse_model(text, "kg.yaml", KnownGoodFile, MatrixError)
    return str(info.value)


def test_known_good_validation() -> None:
    assert parse_model(KG_OK, "kg.yaml", KnownGoodFile).entries[0].id == "e"
    assert "kg.yaml:6:" in _kg_error(KG_OK.replace("torch:", "torchh:"))        # unknown constraint key
    assert "not a PEP 440 version specifier" in _kg_error(KG_OK.replace("==2.13.*", "2.13 or later"))
    assert "basis" in _kg_error(KG_OK.replace("measured", "rumoured"))
    assert "valid regex" in _kg_error(KG_OK.replace("backend: cpu", "backend: cpu\n    device: '(H100'"))
    assert _kg_error(KG_OK + "    notes: x\n") == "kg.yaml:10: entries.0.notes: unknown key"
    # An entry must say when its source was read, and name a backend adaptcheck knows.
    assert "kg.yaml:8:" in _kg_error(KG_OK.replace('"2026-11"', '"last spring"'))
    assert "date" in _kg_error(KG_OK.replace('    date: "2026-11"\n', ""))
    unknown = _kg_error(KG_OK.replace("backend: cpu", "backend: nvidia"))
    assert unknown.startswith("kg.yaml:5:") and "unknown backend 'nvidia'" in unknown


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read"):
        load_rules(tmp_path / "missing.yaml")
