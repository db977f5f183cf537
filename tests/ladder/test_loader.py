"""Ladder YAML: strict validation with file:line, did-you-mean for unknown kinds and ladders."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.base.errors import LadderError, UnknownNameError
from adaptcheck.ladder.loader import builtin_ladders, load_ladder, parse_ladder
from tests.conftest import ladder_text


def test_builtin_ladders_load_and_cover_every_step() -> None:
    assert {"quick", "standard"} <= set(builtin_ladders())
    for name in ("quick", "standard"):
        spec = load_ladder(name).spec
        assert {c.step for c in spec.checks} == {1, 2, 3, 4, 5}
        assert [lv.level for lv in spec.grade.levels] == ["L1", "L2", "L3", "L4", "L5"]


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    text = "schema_version: 1\nid: x\nchecks:\n  - id: a\n    kind: [unclosed\n"
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "bad.yaml")
    assert err.value.message.startswith("bad.yaml:")
    assert "malformed YAML" in err.value.message
    line = int(err.value.message.split(":")[1])
    assert line in (5, 6)


def test_unknown_kind_suggests_the_closest(tmp_path: Path) -> None:
    text = ladder_text([{"id": "m", "step": 2, "kind": "smoke.matmull"}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    msg = err.value.one_line()
    assert "unknown check kind 'smoke.matmull'" in msg
    assert "did you mean 'smoke.matmul'" in msg
    assert msg.startswith("l.yaml:")
    assert ":" in msg and "\n" not in msg


def test_unknown_key_is_an_error_with_its_line() -> None:
    text = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass", "timeout": 5}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    assert "checks.0.timeout" in err.value.message
    lines = text.splitlines()
    line_no = int(err.value.message.split(":")[1])
    assert "timeout" in lines[line_no - 1]


def test_bad_params_are_rejected_with_line() -> None:
    text = ladder_text([{"id": "c", "step": 2, "kind": "dummy.crash", "params": {"how": "x", "extra": 1}}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    assert "checks.0.params.extra: unknown key" in err.value.message and "(check 'c')" in err.value.message


def test_kind_in_wrong_step_is_rejected() -> None:
    text = ladder_text([{"id": "m", "step": 3, "kind": "smoke.matmul"}])
    with pytest.raises(LadderError, match="belongs to step 2"):
        parse_ladder(text, "l.yaml")


def test_duplicate_keys_and_ids_are_rejected() -> None:
    dup_key = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}]).replace("version: '0'", "version: '0'\nversion: '1'")
    with pytest.raises(LadderError, match="duplicate key 'version'"):
        parse_ladder(dup_key, "l.yaml")
    dup_id = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}, {"id": "a", "step": 2, "kind": "dummy.fail"}])
    with pytest.raises(LadderError, match="duplicate check id 'a'"):
        parse_ladder(dup_id, "l.yaml")


def test_condition_selecting_nothing_is_a_typo() -> None:
    grade = """
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - id: c
          description: d
          checks: [smoke.devise_visible]
"""
    text = ladder_text([{"id": "smoke.device_visible", "step": 2, "kind": "dummy.pass"}], grade=grade)
    with pytest.raises(LadderError, match=r"did you mean 'smoke.device_visible'"):
        parse_ladder(text, "l.yaml")


def test_levels_must_be_in_order() -> None:
    grade = """
grade:
  levels:
    - level: L2
      name: x
      conditions:
        - {id: c, description: d, steps: [2]}
"""
    with pytest.raises(LadderError, match="in order starting at L1"):
        parse_ladder(ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}], grade=grade), "l.yaml")


def test_unknown_ladder_name_and_missing_file() -> None:
    with pytest.raises(UnknownNameError) as err:
        load_ladder("quik")
    assert "did you mean 'quick'" in err.value.one_line()
    with pytest.raises(LadderError, match="no such ladder file"):
        load_ladder("/nonexistent/ladder.yaml")


def test_not_a_mapping() -> None:
    with pytest.raises(LadderError, match="expected a YAML mapping at the top level"):
        parse_ladder("- just\n- a list\n", "l.yaml")


# --- shared grade rules: grade: {include: FILE, without: [ids]} ---------------------------------

def test_the_shipped_ladders_share_their_grade_rules() -> None:
    quick, standard = load_ladder("quick"), load_ladder("standard")
    conds = {name: [c.id for lv in lad.spec.grade.levels for c in lv.conditions]
             for name, lad in (("quick", quick), ("standard", standard))}
    # Graph capture is certified beside the level (feature:graph_capture), so both share every condition.
    assert "graph_modes" not in conds["standard"] and conds["standard"] == conds["quick"]
    # The text a run folder snapshots carries the rules themselves: it parses with no other file.
    for lad in (quick, standard):
        assert "include:" not in lad.text.split("\ngrade:\n", 1)[1]
        assert parse_ladder(lad.text, "ladder.yaml").grade == lad.spec.grade


def _with_include(tmp_path: Path, grade_block: str, rules: str | None = None) -> Path:
    shared = tmp_path / "rules.yaml"
    shared.write_text(rules if rules is not None else (
        "levels:\n  - level: L1\n    name: usable\n    conditions:\n"
        "      - {id: smoke, description: smoke passes, steps: [2]}\n"
        "      - {id: extra, description: one more, checks: [b]}\n"))
    ladder = tmp_path / "l.yaml"
    text = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}, {"id": "b", "step": 2, "kind": "dummy.pass"}])
    ladder.write_text(text.split("\ngrade:\n", 1)[0] + "\n" + grade_block)
    return ladder


def test_an_include_with_without_drops_the_named_conditions(tmp_path: Path) -> None:
    lad = load_ladder(str(_with_include(tmp_path, "grade:\n  include: rules.yaml\n  without: [extra]\n")))
    assert [c.id for c in lad.spec.grade.levels[0].conditions] == ["smoke"]


@pytest.mark.parametrize(("block", "rules", "message"), [
    ("grade:\n  include: rules.yaml\n  without: [extr]\n", None, "without names 'extr'.*did you mean 'extra'"),
    ("grade:\n  include: rules.yaml\n  levels: []\n", None, "only 'without' may be given"),
    ("grade:\n  include: nope.yaml\n", None, "nope.yaml"),
    ("grade:\n  include: rules.yaml\n", "levels:\n  - level: L2\n    name: x\n    conditions: []\n",
     r"rules.yaml:\d+: levels\.0\.conditions"),
])
def test_a_bad_include_is_one_line_naming_the_file(tmp_path: Path, block: str, rules: str | None,
                                                  message: str) -> None:
    with pytest.raises(LadderError, match=message):
        load_ladder(str(_with_include(tmp_path, block, rules)))


def test_an_unknown_quantization_tag_is_rejected_with_the_known_ones() -> None:
    text = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass", "tags": ["quant:int4_awq"]}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    assert "unknown quantization format in tag 'quant:int4_awq'" in err.value.message
    assert "quant:int8_w8a8, quant:fp8" in err.value.message


# Which quantization format each quantized op belongs to (the catalog's 'quant' family).
QUANT_OP_FORMAT = {"int8_w8a8_gemm": "int8_w8a8", "scaled_int8_quant": "int8_w8a8",
                   "fp8_quantize": "fp8", "fp8_scaled_gemm": "fp8"}
# The 'quant_weight' family's ops: the int4 GEMM is one op for two checkpoint formats, so each
# of its checks names the format its cases use.
QUANT_WEIGHT_OP_FORMATS = {"int4_w4a16_gemm": {"gptq", "awq"}, "block_fp8_gemm": {"fp8_block"}}


@pytest.mark.parametrize("name", ["quick", "standard"])
def test_shipped_ladders_tag_every_quantized_op_check_with_its_format(name: str) -> None:
    from adaptcheck.steps.ops.catalog import all_ops

    assert {op for op, spec in all_ops().items() if spec.family == "quant"} == set(QUANT_OP_FORMAT)
    assert {op for op, spec in all_ops().items() if spec.family == "quant_weight"} == set(QUANT_WEIGHT_OP_FORMATS)
    spec = load_ladder(name).spec
    assert spec.model.quantization == "none"
    tagged = 0
    for c in spec.checks:
        quant_tags = [t for t in c.tags if t.startswith("quant:")]
        op = c.params.get("op") if c.kind == "ops.op" else None
        if op in QUANT_WEIGHT_OP_FORMATS:
            assert len(quant_tags) == 1 and quant_tags[0][len("quant:"):] in QUANT_WEIGHT_OP_FORMATS[op], c.id
            fmt = quant_tags[0][len("quant:"):]
            assert all(case.get("format", "fp8_block") == fmt for case in c.params["cases"]), c.id
            tagged += 1
            continue
        want = [f"quant:{QUANT_OP_FORMAT[op]}"] if op in QUANT_OP_FORMAT else []
        assert quant_tags == want, c.id
        tagged += bool(want)
    # quick leaves the int4 and block-fp8 ops (the weight-quantized families) to the standard ladder.
    assert tagged == {"standard": 11, "quick": 7}[name]
