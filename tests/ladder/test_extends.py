"""Ladders that extend another (``extends:``): the merge rules, the one-line file:line errors,
and the shipped quick ladder written as the standard ladder plus its differences."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptcheck.base.errors import LadderError
from adaptcheck.base.paths import data_dir
from adaptcheck.ladder.loader import load_ladder, parse_ladder
from tests.conftest import ladder_text

PARENT_CHECKS: list[dict[str, object]] = [
    {"id": "a", "step": 2, "kind": "dummy.pass"},
    {"id": "mm", "step": 2, "kind": "smoke.matmul", "timeout_s": 30,
     "params": {"dtypes": ["fp32", "bf16"], "max_n": 256, "budget_s": 1.0}},
    {"id": "conc", "step": 4, "kind": "framework.concurrent", "description": "batched vs alone",
     "params": {"framework": "transformers", "batch": 6, "teacher": {"prompts": 3, "max_tokens": 16}}},
    {"id": "b", "step": 2, "kind": "dummy.pass"},
    {"id": "last", "step": 5, "kind": "dummy.pass"},
]


def _family(tmp_path: Path, child: str, parent: str | None = None) -> Path:
    """parent.yaml (the checks above unless given) and child.yaml (``child``, dedented) in tmp_path."""
    (tmp_path / "parent.yaml").write_text(parent if parent is not None else ladder_text(PARENT_CHECKS))
    path = tmp_path / "child.yaml"
    path.write_text(textwrap.dedent(child).lstrip("\n"))
    return path


def _error(path: Path) -> str:
    with pytest.raises(LadderError) as err:
        load_ladder(str(path))
    line = err.value.one_line()
    assert "\n" not in line
    return line


def _checks(path: Path) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in load_ladder(str(path)).data["checks"]}


# --- the shipped ladders --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["quick", "standard"])
def test_what_a_run_stores_reads_back_alone_as_the_same_ladder(name: str) -> None:
    """The resolved text a run folder keeps (ladder.yaml) needs no parent file to load again.

    When quick became ``extends: standard`` (issue 28), both resolved ladders were compared
    with the flat files of commit 7340125 (specs, data as written and run order: equal); that
    one-off snapshot is not kept, so that changing a shipped ladder on purpose touches the
    ladder alone."""
    now = load_ladder(name)
    assert parse_ladder(now.text, "ladder.yaml") == now.spec
    assert yaml.safe_load(now.text) == now.data


def test_quick_extends_standard_and_says_only_what_differs() -> None:
    quick = load_ladder("quick")
    assert quick.parents == ("builtin:standard",)
    assert load_ladder("standard").parents == ()
    raw = yaml.safe_load((data_dir("ladders") / "quick.yaml").read_text(encoding="utf-8"))
    assert raw["extends"] == "standard" and isinstance(raw["checks"], dict)
    assert len(raw["checks"]) < len(quick.spec.checks)
    # Untouched checks come from standard alone; changed ones from both files, standard first.
    assert quick.origins["matrix.capture"] == ("builtin:standard",)
    assert quick.origins["smoke.matmul"] == ("builtin:standard", "builtin:quick")
    # The snapshot a run stores names both files, and needs neither.
    assert quick.text.startswith("# The ladder quick extends standard, resolved")
    assert "extends" not in yaml.safe_load(quick.text)


# --- the merge rules ------------------------------------------------------------------------------

def test_an_override_deep_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    checks = _checks(_family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        checks:
          mm:
            params: {dtypes: [fp16], max_n: 128}
          conc:
            params: {teacher: {max_tokens: 8}}
        """))
    # a list is one value: replaced, never concatenated; other params stay the parent's
    assert checks["mm"]["params"] == {"dtypes": ["fp16"], "max_n": 128, "budget_s": 1.0}
    assert checks["mm"]["timeout_s"] == 30 and checks["mm"]["kind"] == "smoke.matmul"
    # mappings merge at every depth
    assert checks["conc"]["params"] == {"framework": "transformers", "batch": 6,
                                        "teacher": {"prompts": 3, "max_tokens": 8}}
    assert checks["conc"]["description"] == "batched vs alone"


def test_unset_removes_parent_keys_before_the_override_merges(tmp_path: Path) -> None:
    checks = _checks(_family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        checks:
          mm:
            unset: [params.budget_s, timeout_s]
            params: {max_n: 64}
          conc:
            unset: [params.teacher.prompts]
        """))
    assert checks["mm"]["params"] == {"dtypes": ["fp32", "bf16"], "max_n": 64}
    assert "timeout_s" not in checks["mm"]
    assert checks["conc"]["params"]["teacher"] == {"max_tokens": 16}
    # the parent's own tree is untouched by the child's unset
    assert _checks(tmp_path / "parent.yaml")["mm"]["params"]["budget_s"] == 1.0


def test_without_drops_and_add_places_new_checks_in_a_fixed_order(tmp_path: Path) -> None:
    path = _family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        without: [b]
        add:
          - {id: n1, step: 2, kind: dummy.pass, after: a}
          - {id: n2, step: 2, kind: dummy.pass, after: a}
          - {id: n3, step: 5, kind: dummy.pass, before: last}
          - {id: n4, step: 5, kind: dummy.pass, before: last}
          - {id: n5, step: 5, kind: dummy.pass}
          - {id: n6, step: 2, kind: dummy.pass, after: n5}
        """)
    # the parent's order; several at one place in the child's order; without a place, at the end
    assert [c.id for c in load_ladder(str(path)).spec.checks] == [
        "a", "n1", "n2", "mm", "conc", "n3", "n4", "last", "n5", "n6"]


def test_dropped_then_added_again_replaces_a_check_whole(tmp_path: Path) -> None:
    checks = _checks(_family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        without: [mm]
        add:
          - {id: mm, step: 2, kind: smoke.matmul, after: a}
        """))
    assert list(checks) == ["a", "mm", "conc", "b", "last"]
    assert "params" not in checks["mm"] and "timeout_s" not in checks["mm"]


def test_top_level_sections_merge_and_grade_is_replaced_or_inherited(tmp_path: Path) -> None:
    inherited = load_ladder(str(_family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        description: the small one
        defaults: {timeout_s: 5}
        model: {precision: fp16}
        steps: {5: perf}
        """)))
    parent = load_ladder(str(tmp_path / "parent.yaml"))
    assert inherited.spec.id == "child" and inherited.spec.version == parent.spec.version
    assert inherited.spec.defaults.timeout_s == 5 and inherited.spec.model.precision == "fp16"
    assert inherited.spec.model.name == parent.spec.model.name
    assert inherited.spec.grade == parent.spec.grade  # no grade: the parent's rules
    # The merge is of what the files write: parent.yaml writes no steps, so the child's are all.
    assert inherited.data["steps"] == {5: "perf"}

    replaced = load_ladder(str(_family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: child
        grade:
          levels:
            - level: L1
              name: only
              conditions:
                - {id: smoke, description: d, steps: [2]}
        """)))
    assert [c.id for lv in replaced.spec.grade.levels for c in lv.conditions] == ["smoke"]


def test_a_chain_of_three_and_a_grade_include_in_the_child(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "g.yaml").write_text(
        "levels:\n  - level: L1\n    name: usable\n    conditions:\n"
        "      - {id: smoke, description: smoke passes, steps: [2]}\n"
        "      - {id: extra, description: one more, checks: [mm]}\n")
    _family(tmp_path, """
        schema_version: 1
        extends: parent.yaml
        id: middle
        checks:
          mm: {params: {max_n: 128}}
        """)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "top.yaml").write_text(textwrap.dedent("""\
        schema_version: 1
        extends: ../child.yaml
        id: top
        checks:
          mm: {timeout_s: 7}
        grade: {include: ../rules/g.yaml, without: [extra]}
        """))
    top = load_ladder(str(tmp_path / "sub" / "top.yaml"))
    assert [Path(p).resolve() for p in top.parents] == [tmp_path / "child.yaml", tmp_path / "parent.yaml"]
    mm = next(c for c in top.spec.checks if c.id == "mm")
    assert mm.params["max_n"] == 128 and mm.timeout_s == 7
    assert [c.id for lv in top.spec.grade.levels for c in lv.conditions] == ["smoke"]


# --- errors: one line, the file and line, and what to write ---------------------------------------

@pytest.mark.parametrize(("child", "expected"), [
    # an unknown id overridden: the closest ids, and where a new check goes
    ("checks:\n  mn:\n    params: {max_n: 1}\n",
     r"child.yaml:5: checks: parent.yaml has no check 'mn' \(did you mean 'mm'.*a new check goes under add:"),
    # an unknown key in an override
    ("checks:\n  mm:\n    parms: {max_n: 1}\n", r"child.yaml:6: checks.mm.parms: unknown key .*did you mean 'params'"),
    # an unknown top-level key
    ("withuot: [b]\n", r"child.yaml:4: withuot: unknown key .*did you mean 'without'"),
    # a type error in an override: the child's line, the merged check's id
    ("checks:\n  mm:\n    timeout_s: fast\n", r"child.yaml:6: checks\.1\.timeout_s: .*number.*\(check 'mm'\)"),
    # a param of the kind misspelt in an override
    ("checks:\n  mm:\n    params: {max_nn: 1}\n", r"child.yaml:6: checks\.1\.params\.max_nn: unknown key \(check 'mm'\)"),
    ("checks:\n  mm:\n    params: {max_n: -5}\n", r"child.yaml:6: checks\.1\.params\.max_n: .*greater than"),
    ("checks:\n  mm: 5\n", r"child.yaml:5: checks.mm: expected the fields that change"),
    ("checks:\n  - {id: mm}\n", r"child.yaml:5: checks: in a ladder that extends another, checks maps a check id"),
    ("checks:\n  mm: {id: mm2}\n", r"child.yaml:5: checks.mm.id: the id is the key"),
    ("checks:\n  mm: {unset: [params.budget]}\n", r"child.yaml:5: checks.mm.unset: the parent's entry has no "
     r"'params.budget' \(did you mean 'budget_s'"),
    ("checks:\n  mm: {unset: [params.max_n], params: {max_n: 3}}\n", r"checks.mm.unset: 'params.max_n' is also set"),
    ("checks:\n  mm: {unset: [timeout_s.x]}\n", r"'timeout_s' of the parent's entry is no mapping"),
    ("without: [bb]\n", r"child.yaml:4: without: parent.yaml has no check 'bb' \(did you mean 'b'"),
    ("without: b\n", r"child.yaml:4: without: expected a list of check ids"),
    ("without: [b]\nchecks:\n  b: {timeout_s: 1}\n", r"child.yaml:6: checks: 'b' is both changed here and dropped"),
    ("add:\n  - {id: b, step: 2, kind: dummy.pass}\n", r"child.yaml:5: add.0: 'b' is a check already"),
    ("add:\n  - {step: 2, kind: dummy.pass}\n", r"child.yaml:5: add.0: an added check needs its id"),
    ("add:\n  - {id: n, step: 2, kind: dummy.pass, after: nope}\n", r"child.yaml:5: add.n.after: no check 'nope'"),
    ("add:\n  - {id: n, step: 2, kind: dummy.pass, after: a, before: b}\n", r"give after: or before:, not both"),
    ("add:\n  - {id: n, step: 2, kind: dummy.pass, aftr: a}\n", r"add.0.aftr: unknown key .*did you mean 'after'"),
    ("add:\n  - {id: n, step: 2, kind: dummy.pas}\n", r"child.yaml:5: check 'n': unknown check kind 'dummy.pas'"),
])
def test_a_mistake_in_a_child_is_one_line_naming_its_file_and_line(tmp_path: Path, child: str,
                                                                   expected: str) -> None:
    path = _family(tmp_path, "schema_version: 1\nextends: parent.yaml\nid: child\n" + child)
    assert re.search(expected, _error(path)), _error(path)


def test_a_child_states_its_own_id(tmp_path: Path) -> None:
    path = _family(tmp_path, "schema_version: 1\nextends: parent.yaml\ndefaults: {timeout_s: 5}\n")
    assert "child.yaml:1: a ladder that extends another states its own id" in _error(path)


def test_a_cycle_of_extends_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("schema_version: 1\nextends: b.yaml\nid: a\n")
    (tmp_path / "b.yaml").write_text("schema_version: 1\nextends: a.yaml\nid: b\n")
    line = _error(tmp_path / "a.yaml")
    assert line.startswith(f"{tmp_path / 'b.yaml'}:2: extends: a cycle (")
    assert "remove one of these extends" in line
    (tmp_path / "self.yaml").write_text("schema_version: 1\nid: s\nextends: ./self.yaml\n")
    assert f"{tmp_path / 'self.yaml'}:3: extends: a cycle" in _error(tmp_path / "self.yaml")


def test_a_missing_or_unknown_parent_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "m.yaml"
    missing.write_text("schema_version: 1\nextends: nosuch.yaml\nid: m\n")
    assert f"{missing}:2: extends: no such ladder file 'nosuch.yaml'" in _error(missing)
    unknown = tmp_path / "u.yaml"
    unknown.write_text("schema_version: 1\nextends: standart\nid: u\n")
    assert f"{unknown}:2: extends: no built-in ladder 'standart' (did you mean 'standard'" in _error(unknown)


def test_an_invalid_parent_is_reported_in_the_parents_file(tmp_path: Path) -> None:
    bad_parent = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass", "timeout": 5}])
    path = _family(tmp_path, "schema_version: 1\nextends: parent.yaml\nid: child\n", parent=bad_parent)
    assert f"{tmp_path / 'parent.yaml'}:" in _error(path) and "checks.0.timeout: unknown key" in _error(path)


def test_only_a_child_may_drop_or_add_and_a_text_cannot_extend(tmp_path: Path) -> None:
    flat = tmp_path / "flat.yaml"
    flat.write_text(ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}]) + "without: [a]\n")
    assert "without: only a ladder that extends another" in _error(flat)
    with pytest.raises(LadderError, match=r"l.yaml:1: extends: this ladder text cannot be read alone"):
        parse_ladder("extends: standard\nid: x\n", "l.yaml")


def test_a_condition_left_without_checks_names_the_shared_rules_line(tmp_path: Path) -> None:
    """A child that drops the only check a grade condition selects: the error points at the
    condition in the file that wrote it (here the inherited parent's), not at a made-up line."""
    path = _family(tmp_path, "schema_version: 1\nextends: parent.yaml\nid: child\nwithout: [a]\n")
    line = _error(path)
    parent_lines = (tmp_path / "parent.yaml").read_text().splitlines()
    assert line.startswith(f"{tmp_path / 'parent.yaml'}:")
    assert "checks: [a]" in parent_lines[int(line.split(":")[1]) - 1]
    assert "condition 'first' selects 'a', which matches no check" in line
