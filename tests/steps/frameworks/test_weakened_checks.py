"""The teacher-forced rule's sensitivity: a weakened rule lets a planted defect through.

In process, on the embedded tiny-llama in bf16: the float64 reference's sequences scored by
the healthy transformers adapter and by one with the planted bf16 SiLU defect. The real rule
passes the first and fails the second; each deliberately weakened variant (bounds 100x
looser, only the first position compared, the control replaced by the device itself) passes
a defect the real rule fails — so a change that weakens the rule fails these tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.numerics import Rule
from adaptcheck.frameworks.base import GenRequest, LoadOptions, Scored
from adaptcheck.frameworks.modelsrc import resolve_model
from adaptcheck.frameworks.transformers_fw import TransformersFramework
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.reference import control_scores, teacher_data
from adaptcheck.steps.frameworks.teacher import judge_scores, score_alone
from tests.steps.frameworks.planted import BadSiluBf16, RopeTableTooShort


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    cache = tmp_path_factory.mktemp("teacher")
    model = resolve_model("embedded:tiny-llama")
    reqs = [GenRequest(prompt=t, max_tokens=32) for t in prompts.SHORT_PROMPTS[:6]]
    teacher = teacher_data(model, reqs, cache, load_numerics().reference_top_k)
    control = control_scores(model, teacher, "bf16", 20, cache)
    out: dict[str, Any] = {"ref": teacher.scores, "control": control.alone}
    for name, cls in (("healthy", TransformersFramework), ("planted", BadSiluBf16), ("late", RopeTableTooShort)):
        fw = cls()
        fw.load(LoadOptions(model_path=Path(model.path), dtype="bf16"), "cpu")
        out[name] = score_alone(fw, teacher.sequences, 20)
        fw.shutdown()
    yield out


def _rules(scale: float = 1.0) -> dict[str, Rule]:
    return {k: Rule(multiple=r.multiple * scale, floor={d: f * scale for d, f in r.floor.items()}, reason=r.reason)
            for k, r in load_numerics().cross_framework.items()}


def _first(scores: list[Scored]) -> list[Scored]:
    return [Scored(s.token_logprobs[:1], s.top_logprobs[:1]) for s in scores]


def test_the_rule_passes_healthy_and_fails_the_planted_defect(figures: dict[str, Any]) -> None:
    assert judge_scores(figures["ref"], figures["healthy"], figures["control"], _rules(), "bf16")[0] is True
    ok, judged, _, _ = judge_scores(figures["ref"], figures["planted"], figures["control"], _rules(), "bf16")
    mean = judged["kl_mean"]
    assert mean.value is not None and mean.bound is not None
    assert ok is False and mean.value > 5 * mean.bound
    # The control is a real measurement: non-zero at bf16, and part of the bound.
    assert (judged["kl_mean"].control or 0.0) > 1e-5


def test_bounds_100x_looser_let_the_defect_through(figures: dict[str, Any]) -> None:
    assert judge_scores(figures["ref"], figures["planted"], figures["control"], _rules(100.0), "bf16")[0] is True


def test_comparing_only_the_first_position_lets_a_late_position_defect_through(figures: dict[str, Any]) -> None:
    # A rotary table that wraps after 24 positions: the short prompts' first scored position
    # is before 24, the later ones are wrong. All positions: caught; the first only: missed.
    assert judge_scores(figures["ref"], figures["late"], figures["control"], _rules(), "bf16")[0] is False
    ok = judge_scores(_first(figures["ref"]), _first(figures["late"]), _first(figures["control"]), _rules(), "bf16")[0]
    assert ok is True


def test_a_control_taken_from_the_device_itself_lets_the_defect_through(figures: dict[str, Any]) -> None:
    assert judge_scores(figures["ref"], figures["planted"], figures["planted"], _rules(), "bf16")[0] is True
