"""The float64 reference drafts its greedy answers in batches and proves each one alone
(reference._greedy_alone): the answers are the single-request ones, a batch path that gets a
token wrong is caught and the request generated again alone, and the unused batched control is
no longer computed unless asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.frameworks.base import Generation, GenRequest, LoadOptions
from adaptcheck.frameworks.modelsrc import resolve_model
from adaptcheck.frameworks.transformers_fw import TransformersFramework
from adaptcheck.steps.frameworks import prompts, reference


class WrongInBatches(TransformersFramework):
    """A batch answers its last row's final token wrong (a padding defect); alone it is right."""

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        gens = super().generate(requests)
        if len(requests) > 1 and gens[-1].token_ids:
            g = gens[-1]
            g.token_ids = [*g.token_ids[:-1], (g.token_ids[-1] + 1) % 100]
        return gens


def _requests() -> list[GenRequest]:
    return [GenRequest(prompt=t, max_tokens=12, logprobs=5) for t in prompts.SHORT_PROMPTS[:5]]


def _alone(model: Any, reqs: list[GenRequest]) -> list[Generation]:
    fw = TransformersFramework()
    fw.load(LoadOptions(model_path=model.path, dtype="fp64"), "cpu")
    try:
        return [fw.generate([r])[0] for r in reqs]
    finally:
        fw.shutdown()


def test_drafted_answers_are_the_single_request_answers(tmp_path: Path) -> None:
    model = resolve_model("embedded:tiny-llama")
    reqs = _requests()
    teacher = reference.teacher_data(model, reqs, tmp_path, 20)
    alone = _alone(model, reqs)
    assert [g.token_ids for g in teacher.generations] == [g.token_ids for g in alone]
    assert [g.finish_reason for g in teacher.generations] == [g.finish_reason for g in alone]
    for a, b in zip(teacher.generations, alone, strict=True):
        for x, y in zip(a.top_logprobs or [], b.top_logprobs or [], strict=True):
            assert set(x) == set(y) and max(abs(x[k] - y[k]) for k in x) < 1e-4  # float64 alone vs fp32 rounding
    how = json.loads(next(tmp_path.glob("teacher-*.json")).read_text())["generation"]
    assert how["drafted_in_batches"] and how["regenerated_alone"] == 0


def test_a_wrong_batch_token_is_caught_and_generated_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = resolve_model("embedded:tiny-llama")
    reqs = _requests()

    def faulty(m: Any, dtype: str, *_memory: Any, **_plan: Any) -> Any:
        fw = WrongInBatches()
        fw.load(LoadOptions(model_path=m.path, dtype=dtype), "cpu")
        return fw

    monkeypatch.setattr(reference, "cpu_transformers", faulty)
    teacher = reference.teacher_data(model, reqs, tmp_path, 20)
    assert [g.token_ids for g in teacher.generations] == [g.token_ids for g in _alone(model, reqs)]
    how = json.loads(next(tmp_path.glob("teacher-*.json")).read_text())["generation"]
    assert how["regenerated_alone"] >= 1


def test_the_batched_control_only_on_request(tmp_path: Path) -> None:
    model = resolve_model("embedded:tiny-llama")
    teacher = reference.teacher_data(model, _requests()[:3], tmp_path, 20)
    control = reference.control_scores(model, teacher, "bf16", 20, tmp_path)
    assert control.batched is None and len(control.alone) == 3
    both = reference.control_scores(model, teacher, "bf16", 20, tmp_path, batched=True)  # cached alone, batched added
    assert both.batched is not None and len(both.batched) == 3
    assert [s.token_logprobs for s in both.alone] == [s.token_logprobs for s in control.alone]
    again = reference.control_scores(model, teacher, "bf16", 20, tmp_path)
    assert again.batched is not None  # read back from the cache
