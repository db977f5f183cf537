"""One float64 teacher per run: every check that scales a same-framework bound by the CPU
control asks the teacher the same requests as the ladder's ``framework.reference`` (the
teacher is cached by its requests, so equal requests are one computation; unequal ones
silently cost a second float64 decode of a deep model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.frameworks.modelsrc import resolve_model
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.steps.frameworks.kinds.concurrent import ConcurrentParams
from adaptcheck.steps.frameworks.kinds.kv_cache import KvCacheParams
from adaptcheck.steps.frameworks.kinds.reference import ReferenceParams
from adaptcheck.steps.frameworks.params import TeacherSize, TeacherSized
from adaptcheck.steps.frameworks.probes import Tok, reference_requests

LADDERS = Path(__file__).resolve().parents[3] / "ladders"


@pytest.mark.parametrize("ladder", ["quick", "standard"])
def test_every_teacher_sized_check_shares_the_reference_checks_teacher(ladder: str) -> None:
    spec = load_ladder(ladder).spec
    # Per model: checks that name their own model (params.model, e.g. a family's embedded
    # model) have that model's teacher, whatever its size.
    teachers: dict[str | None, dict[str, TeacherSize]] = {}
    references: dict[str | None, list[TeacherSize]] = {}
    for check in spec.checks:
        if check.step != 4:
            continue
        params = get_check_class(check.kind).params_model.model_validate(check.params)
        model = getattr(params, "model", None)
        if isinstance(params, ReferenceParams):
            references.setdefault(model, []).append(params.teacher)
        elif isinstance(params, TeacherSized):
            teachers.setdefault(model, {})[check.id] = params.teacher
    assert references.get(None) and teachers.get(None)
    for model, sized in teachers.items():
        refs = references.get(model) or [next(iter(sized.values()))]  # no reference row: one teacher among them
        assert all(r == refs[0] for r in refs), refs
        wrong = {cid: t for cid, t in sized.items() if t != refs[0]}
        assert not wrong, f"these checks would compute a second float64 teacher: {wrong}"


def test_the_quick_ladder_asks_a_smaller_teacher_than_the_defaults() -> None:
    spec = load_ladder("quick").spec
    ref = next(c for c in spec.checks if c.id == "framework.transformers.reference")
    teacher = ReferenceParams.model_validate(ref.params).teacher
    assert (teacher.prompts, teacher.long_prompt_tokens, teacher.max_tokens) == (3, 128, 16)
    assert teacher != TeacherSize()  # the standard ladder keeps the defaults


def test_equal_sizes_give_the_same_requests_and_unequal_ones_do_not() -> None:
    tok = Tok(None, resolve_model("embedded:tiny-llama").path)
    ref = ReferenceParams(framework="transformers", prompts=2, long_prompt_tokens=40, max_tokens=6)
    same = ConcurrentParams(framework="vllm", teacher={"prompts": 2, "long_prompt_tokens": 40, "max_tokens": 6})
    other = KvCacheParams(framework="vllm", teacher={"prompts": 2, "long_prompt_tokens": 40, "max_tokens": 7})
    by_ref = reference_requests(tok, ref, seed=3)
    assert reference_requests(tok, ref.teacher, seed=3) == by_ref  # the property is the check's own requests
    assert reference_requests(tok, same.teacher, seed=3) == by_ref
    assert reference_requests(tok, other.teacher, seed=3) != by_ref
    assert len(by_ref) == 2 + 1 + (2 if tok.has_chat_template() else 0)
    default = ConcurrentParams(framework="transformers").teacher
    assert default == ReferenceParams(framework="transformers").teacher  # defaults agree too


def test_an_unknown_teacher_field_is_refused() -> None:
    with pytest.raises(ValueError, match="tokens"):
        ConcurrentParams(framework="transformers", teacher={"tokens": 16})
