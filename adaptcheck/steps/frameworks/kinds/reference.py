"""``framework.reference``: greedy answers and teacher-forced distributions match the CPU float64 reference.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.frameworks.base import Framework, Generation, GenRequest, ScoringUnsupported
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.agreement import compare
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.device_generates import teacher_for
from adaptcheck.steps.frameworks.lifecycle import Active, run_with_framework
from adaptcheck.steps.frameworks.params import FrameworkParams, TeacherSize
from adaptcheck.steps.frameworks.probes import (
    Tok,
    local_tokenizer,
    reference_requests,
    strip_eos,
    subcheck,
    verdict,
)
from adaptcheck.steps.frameworks.reference import ReferenceUnavailable


class ReferenceParams(FrameworkParams, TeacherSize):
    """``framework.reference``: its own size fields are the teacher's requests."""

    top_k: int = Field(default=20, ge=1, le=20, description="Alternatives per position in the teacher-forced comparison "
                       "(the KL estimator's buckets; vLLM's default cap is 20).")
    greedy: bool = Field(default=True, description="Also compare greedy answers with the reference's (the visible "
                         "symptom; the whole verdict where the framework cannot score a given sequence).")

    @property
    def teacher(self) -> TeacherSize:
        return TeacherSize(prompts=self.prompts, long_prompt_tokens=self.long_prompt_tokens, chat=self.chat,
                           max_tokens=self.max_tokens, top_n=self.top_n, images=self.images)


class ReferenceCheck(FrameworkCheck):
    """Greedy answers match the CPU float64 reference of the same weights."""

    kind = "framework.reference"
    step = 4
    description = "Greedy token ids match a CPU float64 reference of the same weights (top-N rule at a divergence)."
    params_model = ReferenceParams
    label = "vs CPU reference"
    typical_s = 10.0

    def run(self, ctx: CheckContext, params: ReferenceParams) -> Outcome:
        return run_with_framework(ctx, params, reference)


def reference(ctx: CheckContext, active: Active, p: ReferenceParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    if tok.hf is None:
        return Outcome.skipped("no local copy of the served weights: pass --model PATH (the same weights as the "
                               "endpoint) to compare with a CPU reference")
    reqs = reference_requests(tok, p, ctx.seed)
    policy = load_numerics()
    try:
        teacher, device = teacher_for(ctx, active, reqs, policy.reference_top_k)
    except ReferenceUnavailable as exc:
        return Outcome.skipped(str(exc))
    ctx.progress(1, 3, "parts", note="teacher-forced scoring vs the float64 reference")
    metrics: dict[str, float | str | None] = {"reference_dtype": teacher.dtype, "top_n": p.top_n}
    rows: list[SubcheckRow] = []
    if device is not None:
        from adaptcheck.steps.frameworks.device_generates import device_rows

        rows.extend(device_rows(reqs, device, teacher, tok.eos_ids()))
    try:
        row, tf, tf_metrics = tf_rules.against_reference(ctx, active, teacher, policy, p.top_k)
        rows.append(SubcheckRow.model_validate(row))
        metrics.update(tf_metrics)
    except ScoringUnsupported as exc:
        # Never a silent pass: the greedy comparison below is then the whole verdict, and says so.
        tf = tf_rules.greedy_fallback(str(exc))
        rows.append(subcheck("teacher-forced distributions vs float64 reference", None,
                         f"not possible here: {exc}; greedy comparison only"))
    except ValueError as exc:  # scores that do not line up with the sequences (a broken server)
        tf = tf_rules.greedy_fallback(str(exc))
        rows.append(subcheck("teacher-forced distributions vs float64 reference", False, f"unusable scores: {exc}"))
    if teacher.run is not None:
        tf["reference_run"] = teacher.run.dump()
    if p.greedy or device is not None:
        # Where the device generated, its answers are what the reference scored: always compared.
        ctx.progress(2, 3, "parts", note="greedy answers vs the float64 reference")
        rows.extend(_greedy_rows(fw, tok, reqs, teacher.generations, p, metrics, tf, device))
    if any(r.images for r in reqs):
        rows.append(_images_deterministic_row(fw, [r for r in reqs if r.images]))
    compared_as_text = tf.get("greedy", {}).get("compared_as_text")
    repro: dict[str, str] = {}  # the reproducer's run-folder path, or why it could not be written
    if any(r.ok is False for r in rows) and tf.get("method") == "teacher_forced":
        try:
            rel = tf_rules.write_repro(ctx, active, teacher, tf, p.top_k, policy.reference_top_k)
        except Exception as exc:  # noqa: BLE001 - the verdict stands without its reproducer
            rel, repro["repro_error"] = None, f"{type(exc).__name__}: {exc}"
        if rel:
            repro["repro"] = rel
    return verdict(rows, "reference agreement", metrics=metrics,
                   details={"teacher_forced": tf, "reference": f"transformers {teacher.dtype} on CPU" + tf_rules.how_reference_ran(teacher),
                            "compared_as_text": compared_as_text, **repro})


def _images_deterministic_row(fw: Framework, reqs: list[GenRequest]) -> SubcheckRow:
    """The same image requests twice: identical prompt ids (the widened placeholders) and answers.

    vLLM's own processor tests require this of a multimodal processor (its cached and uncached
    paths, text and token prompts, give the same inputs); the second pass here is the one a
    processor cache would serve.
    """
    first, second = fw.generate(list(reqs)), fw.generate(list(reqs))
    differ = [f"image prompt {i}: " + ("prompt ids differ" if a.prompt_ids != b.prompt_ids else "answers differ")
              for i, (a, b) in enumerate(zip(first, second, strict=True))
              if a.prompt_ids != b.prompt_ids or a.token_ids != b.token_ids]
    return subcheck("image inputs deterministic (the same images processed twice)", not differ,
                    "; ".join(differ) or f"{len(reqs)} image prompts: identical prompt ids and answers twice")


def _greedy_rows(fw: Framework, tok: Tok, reqs: list[GenRequest], ref: list[Generation], p: ReferenceParams,
                 metrics: dict[str, float | str | None], tf: dict[str, Any],
                 device: list[Generation] | None = None) -> list[SubcheckRow]:
    """Greedy answers against the reference's: the user-visible symptom, and the whole
    verdict where the framework cannot score (top-N rule at the first divergence). ``device``:
    the answers the reference scored, where the device generated (not asked again)."""
    # One request at a time: this is the single-request answer; batching is framework.concurrent's.
    dev = device if device is not None else [fw.generate([r])[0] for r in reqs]
    eos = tok.eos_ids()
    cmp = compare([strip_eos(g, eos) for g in ref], [strip_eos(g, eos) for g in dev], mode="top_n", top_n=p.top_n,
                  codec=tok.codec())
    rows = [subcheck("greedy tokens vs CPU reference", cmp.ok, cmp.summary())]
    finish = [f"prompt {i}: {a.finish_reason} vs {b.finish_reason}" for i, (a, b) in enumerate(zip(ref, dev, strict=False))
              if cmp.pairs[i].exact and a.finish_reason != b.finish_reason]
    rows.append(subcheck("finish reasons agree", not finish, "; ".join(finish) or "same finish reason for identical answers"))
    metrics.update(cmp.metrics())
    tf["greedy"] = {"comparison": cmp.details(), "compared_as_text": sum(x.by_text for x in cmp.pairs)}
    return rows
