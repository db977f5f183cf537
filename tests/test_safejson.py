"""Bounded parsing: the JSON (adaptcheck.base.safejson) and YAML (adaptcheck.base.yamldata) limits.

Each limit is tested at its edge (the limit itself is read, one more is refused with the
file and line), and the loaders that use them are checked to go through them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from adaptcheck.base import safejson, yamldata
from adaptcheck.base.errors import InvalidInputError, LadderError


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- JSON -------------------------------------------------------------------------------


def test_depth_prescan_ignores_brackets_inside_strings() -> None:
    assert safejson.nesting_depth('{"a": "[[[[{{{{", "b": "\\"[[[["}') == 1
    assert safejson.nesting_depth('{"a": [1, {"b": [2]}]}') == 4
    assert safejson.nesting_depth("3") == 0


def test_depth_limit_edge_and_line() -> None:
    limit = safejson.MAX_JSON_DEPTH
    assert safejson.loads(nested(limit), "ok.json") is not None
    text = '{\n"a":\n' + nested(limit) + "}"  # the object is level 1, so the array's last bracket is one too many
    with pytest.raises(safejson.JsonLimitError, match=rf"^deep\.json:3: nested deeper than {limit} levels"):
        safejson.loads(text, "deep.json")


def test_100000_deep_is_refused_quickly_and_without_recursion_error() -> None:
    start = time.perf_counter()
    with pytest.raises(safejson.JsonLimitError, match="nested deeper"):
        safejson.loads(nested(100_000), "deep.json")
    assert time.perf_counter() - start < 1.0


def test_integer_digit_limit_edge_and_line() -> None:
    limit = safejson.MAX_INT_DIGITS
    assert safejson.loads("-" + "9" * limit, "ok.json") == -int("9" * limit)
    text = '{\n  "seed": 1,\n  "n": ' + "9" * (limit + 1) + "\n}"
    with pytest.raises(safejson.JsonLimitError, match=rf"^n\.json:3: an integer has {limit + 1} digits"):
        safejson.loads(text, "n.json")
    # Python's own limit (4300 digits) must never surface as a bare ValueError.
    with pytest.raises(safejson.JsonLimitError):
        safejson.loads("7" * 100_000, "n.json")


def test_malformed_json_names_line_and_column() -> None:
    with pytest.raises(safejson.JsonFormatError, match=r"^bad\.json: not a readable JSON file: .*\(line 2 column \d+\)"):
        safejson.loads('{"a": 1,\n "b": }', "bad.json")


def test_hook_exceptions_pass_through() -> None:
    class Found(ValueError):
        pass

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        raise Found("mine")

    with pytest.raises(Found):
        safejson.loads('{"a": 1}', "x.json", object_pairs_hook=hook)


def test_size_limit_reads_no_more_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text("[" + "0," * 600 + "0]")
    assert safejson.read_text(path, max_bytes=2000).startswith("[0,")
    with pytest.raises(safejson.JsonLimitError, match=r"big.json: file larger than"):
        safejson.read_text(path, max_bytes=1000)


def test_load_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no such results file"):
        safejson.load_file(tmp_path / "missing.json", what="results file")
    (tmp_path / "l1.json").write_bytes(b'{"x": "\xfc"}')
    with pytest.raises(safejson.JsonFormatError, match="not UTF-8 text"):
        safejson.load_file(tmp_path / "l1.json")
    with pytest.raises(InvalidInputError, match="is a folder"):
        safejson.load_file(tmp_path)


def test_prescan_is_cheap_on_a_large_realistic_file() -> None:
    row = json.dumps({"id": "ops.x", "metrics": {"a": [1.5, 2, 3]}, "details": {"msg": "[ { not json } ]"}})
    text = "[" + ",".join([row] * 100_000) + "]"  # about 8 MB
    start = time.perf_counter()
    assert safejson.nesting_depth(text) == 4
    assert time.perf_counter() - start < 2.0


def test_user_file_loaders_are_bounded(tmp_path: Path) -> None:
    """results (grade/report/merge/baseline), verify, and saved comparisons all go through the limits."""
    from adaptcheck.base.integrity import Integrity, verify_file
    from adaptcheck.base.schemas.results import RunResults
    from adaptcheck.compare.model import Comparison

    deep = tmp_path / "deep.json"
    deep.write_text('{"schema_version": "1.1", "x": ' + nested(100_000) + "}")
    with pytest.raises(safejson.JsonLimitError, match="nested deeper"):
        RunResults.load(deep)
    with pytest.raises(safejson.JsonLimitError, match="nested deeper"):
        Comparison.load(deep)
    check = verify_file(deep)
    assert check.status is Integrity.UNREADABLE and "nested deeper" in check.message


# --- YAML -------------------------------------------------------------------------------


def parse(text: str) -> dict[str, object]:
    return yamldata.parse_yaml(text, "f.yaml", LadderError)[0]


def test_yaml_depth_limit_edge_flow_and_block() -> None:
    limit = yamldata.MAX_YAML_DEPTH
    assert parse("a: " + nested(limit - 1))  # the top mapping is level 1
    with pytest.raises(LadderError, match=rf"^f\.yaml:1: YAML refused: nested deeper than {limit} levels"):
        parse("a: " + nested(limit))
    block = "a:\n" + "".join("  " * i + "- \n" for i in range(limit + 5))
    with pytest.raises(LadderError, match=rf"^f\.yaml:{limit + 1}: YAML refused: nested deeper"):
        parse(block)


def test_yaml_aliases_refused_anchors_alone_allowed() -> None:
    assert parse("a: &x 1\nb: 2") == {"a": 1, "b": 2}
    with pytest.raises(LadderError, match=r"^f\.yaml:2: YAML refused: alias \*x refused"):
        parse("a: &x [1, 2]\nb: *x\n")
    with pytest.raises(LadderError, match="alias"):
        parse("base: &b {x: 1}\nother:\n  <<: *b\n")


def test_shipped_data_files_use_no_aliases_and_stay_within_limits() -> None:
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "ladders").glob("*.yaml")) + sorted((root / "matrices").glob("*.yaml"))
    assert files
    for path in files:
        data = parse(path.read_text(encoding="utf-8"))
        assert data, path


def test_yaml_integer_and_bad_value_errors_name_the_line() -> None:
    limit = yamldata.MAX_INT_DIGITS
    assert parse("n: " + "9" * limit)["n"] == int("9" * limit)
    with pytest.raises(LadderError, match=rf"^f\.yaml:2: YAML refused: an integer has {limit + 1} digits"):
        parse("a: 1\nn: " + "9" * (limit + 1))
    with pytest.raises(LadderError, match=r"^f\.yaml:2: malformed YAML: cannot read this value"):
        parse("a: 1\nwhen: 2024-13-45\n")


def test_yaml_size_limit(tmp_path: Path) -> None:
    with pytest.raises(LadderError, match="larger than 4 Mi characters"):
        parse("a: 1\n#" + "x" * yamldata.MAX_YAML_CHARS)
    path = tmp_path / "big.yaml"
    path.write_text("#" + "x" * (yamldata.MAX_YAML_CHARS + 1))
    with pytest.raises(LadderError, match=r"big.yaml: ladder larger than"):
        yamldata.read_text(path, LadderError, "ladder")
    with pytest.raises(LadderError, match="no such ladder"):
        yamldata.read_text(tmp_path / "none.yaml", LadderError, "ladder")


def test_duplicate_check_id_names_the_duplicate_line() -> None:
    from adaptcheck.ladder.loader import parse_ladder
    from tests.conftest import ladder_text

    text = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass"}, {"id": "b", "step": 2, "kind": "dummy.pass"},
                        {"id": "a", "step": 2, "kind": "dummy.fail"}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    line = int(err.value.message.split(":")[1])
    assert text.splitlines()[line - 1] == "- id: a" and line > 10  # the third check, not the first
    assert "checks.2.id: duplicate check id 'a'" in err.value.message
