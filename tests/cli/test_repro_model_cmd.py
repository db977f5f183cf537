"""``adaptcheck repro`` for a step-4 check without a script: written from its typed evidence
(``details.teacher_forced``) and the run's stored sequences (``framework/teacher-*.json``).

In process, on a recorded check of a real run (tests/base/schemas/data), no model loaded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.cli import cmd_repro
from tests.report.factory import make_results

DATA = json.loads((Path(__file__).parents[1] / "base" / "schemas" / "data" / "framework_details.json").read_text())
REF = next(s for s in DATA["nv.json"] if s["id"] == "framework.transformers.reference")


def _check(details: dict[str, Any]) -> CheckResult:
    return CheckResult(step=4, id=REF["id"], kind=REF["kind"], status=Status.FAIL, details=details)


def _teacher_file(run_dir: Path, sequences: list[dict[str, Any]]) -> None:
    (run_dir / "framework").mkdir(parents=True, exist_ok=True)
    data = {"sequences": sequences, "dtype": "fp64", "attention": "sdpa"}
    (run_dir / "framework" / "teacher-0123456789abcdef0123-k48.json").write_text(json.dumps(data))


def test_the_script_embeds_the_recorded_bounds_and_the_stored_sequences(tmp_path: Path) -> None:
    _teacher_file(tmp_path, [{"token_ids": [1, 2, 3, 4], "start": 2, "top_k": 48}])
    path = cmd_repro._write_model(tmp_path, make_results(), _check(REF["details"]))
    text = path.read_text()
    tf = REF["details"]["teacher_forced"]
    assert path == tmp_path / "repro" / f"{REF['id']}.py"
    assert repr(tf["bounds"]["kl_mean"]["bound"]) in text and repr(tf["device"]["kl_p99"]) in text
    assert '"reference_top_k": 48' in text and "[1, 2, 3, 4]" in text


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["teacher_forced"].update(method="greedy_fallback"), "fell back to greedy comparison"),
    (lambda d: d.pop("teacher_forced"), "records no teacher-forced comparison"),
    (lambda d: d["teacher_forced"]["bounds"].pop("kl_p99"), "record is incomplete"),
    (lambda d: d["teacher_forced"]["device"].update(kl_mean=None), "record is incomplete"),
])
def test_a_record_the_script_cannot_come_from_is_one_clear_error(tmp_path: Path, edit: Any, message: str) -> None:
    _teacher_file(tmp_path, [{"token_ids": [1, 2, 3, 4], "start": 2}])
    details = copy.deepcopy(REF["details"])
    edit(details)
    with pytest.raises(InvalidInputError, match=message):
        cmd_repro._write_model(tmp_path, make_results(), _check(details))


def test_a_teacher_file_without_sequences_is_one_clear_error(tmp_path: Path) -> None:
    _teacher_file(tmp_path, [])
    with pytest.raises(InvalidInputError, match="holds no sequences"):
        cmd_repro._write_model(tmp_path, make_results(), _check(REF["details"]))
    (tmp_path / "framework" / "teacher-0123456789abcdef0123-k48.json").write_text('{"sequences": [{"start": 1}]}')
    with pytest.raises(InvalidInputError, match="not a teacher-forced sequences file"):
        cmd_repro._write_model(tmp_path, make_results(), _check(REF["details"]))
