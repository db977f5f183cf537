"""``framework.concurrent``: the same prompts alone and inside a concurrent batch give the same answers.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.frameworks.base import GenRequest, ScoreRequest, ScoringUnsupported
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.agreement import compare
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.lifecycle import Active, run_with_framework
from adaptcheck.steps.frameworks.params import DEFAULT_TIE_MARGIN, TeacherSize, TeacherSized
from adaptcheck.steps.frameworks.probes import (
    TOP_K,
    Tok,
    local_tokenizer,
    speaks_openai,
    strip_eos,
    subcheck,
    teacher_and_control,
    tie_margin_for,
    usage_row,
    verdict,
)


class ConcurrentParams(TeacherSized):
    """``framework.concurrent``."""

    batch: int = Field(default=8, ge=2, description="Requests sent together.")
    max_tokens: int = Field(default=24, gt=0, description="Tokens per request (varied ±50% across the batch).")
    top_n: int = Field(default=5, ge=1, le=20, description="Logprobs requested per position.")
    tie_margin: float | None = Field(default=None, ge=0, description="Tie margin in nats; default by dtype "
                                     f"{DEFAULT_TIE_MARGIN}.")
    stream: bool = Field(default=True, description="Endpoints: also compare streamed with non-streamed answers.")


class ConcurrentCheck(FrameworkCheck):
    """The same prompts alone and in a concurrent batch give the same answers."""

    kind = "framework.concurrent"
    step = 4
    description = "Alone vs inside a concurrent batch gives the same tokens; stream vs non-stream; usage counts."
    params_model = ConcurrentParams
    label = "alone vs batched"
    compares = "batched vs alone"

    def run(self, ctx: CheckContext, params: ConcurrentParams) -> Outcome:
        return run_with_framework(ctx, params, concurrent)


def _batch_requests(n: int, max_tokens: int, logprobs: int) -> list[GenRequest]:
    """Distinct prompts with varied lengths, plus one prompt repeated (it must not matter)."""
    reqs = []
    for i in range(n - 1):
        length = max(1, int(max_tokens * (0.5 + (i % 3) * 0.5)))
        reqs.append(GenRequest(prompt=prompts.SHORT_PROMPTS[i % len(prompts.SHORT_PROMPTS)] + ("" if i < 8 else f" ({i})"),
                               max_tokens=length, logprobs=logprobs))
    reqs.append(GenRequest(prompt=reqs[0].prompt, max_tokens=reqs[0].max_tokens, logprobs=logprobs))
    return reqs


def concurrent(ctx: CheckContext, active: Active, p: ConcurrentParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    eos = tok.eos_ids()
    reqs = _batch_requests(p.batch, p.max_tokens, p.top_n)
    # A multimodal teacher's image prompts join the batch: pictures of two sizes among text rows.
    reqs += [GenRequest(messages=[{"role": "user", "content": text}], images=[image], max_tokens=p.max_tokens,
                        logprobs=p.top_n) for text, image in prompts.image_prompts(p.teacher.images)]
    alone = [fw.generate([r])[0] for r in reqs]
    together = [g for g in fw.generate(reqs)]
    margin = tie_margin_for(p.tie_margin, active.options.dtype)
    cmp = compare([strip_eos(g, eos) for g in alone], [strip_eos(g, eos) for g in together],
                  mode="near_tie", top_n=p.top_n, tie_margin=margin, codec=tok.codec())
    rows = [subcheck(f"alone vs in a batch of {len(reqs)}", cmp.ok, cmp.summary())]
    rows.append(usage_row("usage counts in the batch", together, eos, required=speaks_openai(fw),
                           max_tokens=[r.max_tokens for r in reqs]))
    metrics: dict[str, float | None] = {**cmp.metrics(), "batch": len(reqs), "tie_margin": margin}
    tf_rows, distribution = _scored_alone_vs_batched(ctx, active, tok, p.teacher)
    rows.extend(tf_rows)
    if p.stream and getattr(fw, "supports_stream", False):
        streamed = fw.generate([GenRequest(prompt=r.prompt, messages=r.messages, images=r.images,
                                           max_tokens=r.max_tokens, stream=True) for r in reqs])
        diff = [f"request {i}: {a.text!r} vs streamed {b.text!r}" for i, (a, b) in enumerate(zip(together, streamed, strict=False))
                if a.text != b.text]
        rows.append(subcheck("stream vs non-stream", not diff, "; ".join(diff[:2]) or f"{len(reqs)} streamed answers identical"))
        rows.append(usage_row("usage counts when streaming", streamed, eos, required=speaks_openai(fw),
                               max_tokens=[r.max_tokens for r in reqs]))
    elif p.stream:
        rows.append(subcheck("stream vs non-stream", None, f"{fw.display_name} has no streaming API"))
    return verdict(rows, "batch consistency", metrics=metrics,
                    details={"comparison": cmp.details(), "distribution": distribution})


def _scored_alone_vs_batched(ctx: CheckContext, active: Active, tok: Tok,
                             size: TeacherSize) -> tuple[list[SubcheckRow], dict[str, Any] | None]:
    """Teacher-forced: the reference sequences scored one per request and all in one batch,
    compared with each other (same-framework rule) and each against float64 (batched vs alone)."""
    name = "teacher-forced distributions alone vs batched"
    found = teacher_and_control(ctx, active, tok, size)
    if found is None:
        return [subcheck(name, None, "no local copy of the weights: no reference sequences or control")], None
    teacher, control_sum = found
    try:
        alone = tf_rules.score_alone(active.framework, teacher.sequences, TOP_K)
        together = active.framework.score([ScoreRequest(s.token_ids, s.start, TOP_K, list(s.images)) for s in teacher.sequences])
    except ScoringUnsupported as exc:
        return [subcheck(name, None, f"not possible here: {exc}")], None
    policy, dtype = load_numerics(), active.options.dtype
    row, distribution = tf_rules.same_framework_row(name, alone, together, control_sum, policy, dtype)
    ref_row, vs_reference = tf_rules.batched_vs_alone_row(
        "teacher-forced distributions batched vs float64, relative to alone", teacher.scores, alone, together,
        policy, dtype)
    # Both rules hold or the distribution evidence does not: the report shows the two together.
    distribution["vs_reference"] = vs_reference
    distribution["ok"] = bool(distribution.get("ok")) and vs_reference["ok"]
    return [SubcheckRow.model_validate(row), SubcheckRow.model_validate(ref_row)], distribution
