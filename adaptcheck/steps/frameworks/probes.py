"""What the step-4 kinds share when they probe a loaded framework (each kind's own probe is in its
module under ``kinds/``; docs/adding-a-check-kind.md).

Each probe builds requests, asks the framework, and judges the answers with explicit rules,
recording every sub-check as a row ``{name, ok, detail}`` (:func:`subcheck`) so the report
shows what held and what did not; ``ok: None`` means a sub-check could not run here (the
reason is in ``detail``) and never counts as held. :func:`verdict` turns the rows into the outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptcheck.base.schemas.framework_evidence import SubcheckRow
from adaptcheck.frameworks.base import Framework, Generation, GenRequest
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.agreement import TextCodec
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.device_generates import teacher_for
from adaptcheck.steps.frameworks.lifecycle import (
    Active,
    framework_dir,
    not_loaded,
    with_evidence,
)
from adaptcheck.steps.frameworks.params import (
    DEFAULT_TIE_MARGIN,
    FrameworkParams,
    TeacherSize,
)
from adaptcheck.steps.frameworks.reference import (
    ReferenceUnavailable,
    control_scores,
)

TOP_K = 20
"""Alternatives per position in the same-framework teacher-forced comparisons (the control is
scored with the same K, so the two figures are comparable)."""


def subcheck(name: str, ok: bool | None, detail: str, **extra: bool) -> SubcheckRow:
    """One sub-check row; ``extra`` are row facts beyond the three (e.g. ``includes_stop_string``)."""
    return SubcheckRow.model_validate({"name": name, "ok": ok, "detail": detail, **extra})


def verdict(rows: list[SubcheckRow], what: str, **kw: Any) -> Outcome:
    """pass when every row held and at least one ran; fail naming the first that did not."""
    failed = [r for r in rows if r.ok is False]
    ran = [r for r in rows if r.ok is not None]
    details = {"subchecks": [r.dump() for r in rows], **kw.pop("details", {})}
    if failed:
        return Outcome.failed(f"{failed[0].name}: {failed[0].detail}"
                              + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""), details=details, **kw)
    if not ran:
        return Outcome.skipped(f"nothing of {what} could run here", details=details, **kw)
    not_run = [r.name for r in rows if r.ok is None]
    tail = f"; not run here: {', '.join(not_run)}" if not_run else ""
    return Outcome.passed(f"{what}: {len(ran)} sub-checks held{tail}", details=details, **kw)


# ---------------------------------------------------------------------------- helpers --

def local_tokenizer(active: Active) -> Tok:
    """The instance's local tokenizer, loaded by the first check that asks and then shared."""
    if active.tokenizer is None:
        active.tokenizer = Tok(active)
    return active.tokenizer


class Tok:
    """The local tokenizer of the served weights, or None for an endpoint of unknown weights."""

    def __init__(self, active: Active | None, path: Path | None = None) -> None:
        self.hf: Any = None
        if path is None and active is not None and active.framework.serves_local_weights():
            path = active.model.path
        if path is not None:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(path))

    def eos_ids(self) -> set[int]:
        if self.hf is None or self.hf.eos_token_id is None:
            return set()
        return {int(self.hf.eos_token_id)}

    def long_prompt(self, tokens: int, seed: int = 0) -> str:
        if self.hf is None:
            # No tokenizer: about 1.3 tokens per English word in common BPE vocabularies.
            return " ".join(prompts.long_text(seed).split()[: max(1, int(tokens / 1.3))])
        ids = prompts.long_prompt_ids(self.hf, tokens, seed)
        return str(self.hf.decode(ids, skip_special_tokens=True))

    def ids(self, text: str) -> list[int]:
        return [int(t) for t in self.hf(text, add_special_tokens=False)["input_ids"]] if self.hf is not None else []

    def codec(self) -> TextCodec | None:
        """Decode/encode for comparing text-only answers (None without a local tokenizer)."""
        if self.hf is None:
            return None
        hf = self.hf
        return TextCodec(decode=lambda ids: str(hf.decode(ids, skip_special_tokens=True)),
                         encode=lambda text: [int(t) for t in hf(text, add_special_tokens=False)["input_ids"]])

    def has_chat_template(self) -> bool:
        return self.hf is not None and bool(getattr(self.hf, "chat_template", None))


def strip_eos(g: Generation, eos: set[int]) -> Generation:
    """The generation without a trailing EOS id: frameworks differ in whether they list it,
    and whether the sequence stopped is judged by ``finish_reason``."""
    ids = g.token_ids
    if ids and ids[-1] in eos:
        return Generation(token_ids=ids[:-1], text=g.text, finish_reason=g.finish_reason,
                          prompt_tokens=g.prompt_tokens, completion_tokens=g.completion_tokens,
                          top_logprobs=g.top_logprobs, prompt_ids=g.prompt_ids, extra=g.extra)
    return g


def usage_row(name: str, gens: list[Generation], eos: set[int], *, required: bool = False,
               max_tokens: list[int] | None = None) -> SubcheckRow:
    """usage.completion_tokens must equal the tokens actually returned (EOS counted as the framework lists it).

    Without token ids the count is held to what is certain: never more than ``max_tokens``,
    exactly ``max_tokens`` when the answer says ``finish_reason: length``. ``required``
    (an OpenAI-compatible server): an answer without usage fails the row — the OpenAI API
    reports ``usage`` in every non-streamed answer and, with ``stream_options.include_usage``
    (which the client sends), in the last event of a stream; billing, rate limits and
    step 5's load accounting read it (docs/perf.md "Served lengths").
    """
    bad = []
    missing = [i for i, g in enumerate(gens) if g.completion_tokens is None]
    checked = 0
    for i, g in enumerate(gens):
        if g.completion_tokens is None:
            continue
        if g.token_ids is not None:
            checked += 1
            n = len(g.token_ids)
            if g.completion_tokens not in (n, n - 1 if g.token_ids and g.token_ids[-1] in eos else n):
                bad.append(f"request {i}: usage says {g.completion_tokens}, {n} tokens returned")
        elif max_tokens is not None:
            checked += 1
            want = max_tokens[i]
            if g.completion_tokens > want or (g.finish_reason == "length" and g.completion_tokens != want):
                bad.append(f"request {i}: usage says {g.completion_tokens} for max_tokens={want} "
                           f"(finish {g.finish_reason!r})")
    if required and missing:
        stream = " (streamed, with stream_options.include_usage)" if gens[missing[0]].extra.get("stream") else ""
        bad.insert(0, f"{len(missing)}/{len(gens)} answers carry no usage{stream}: the OpenAI API reports "
                      "usage.completion_tokens and prompt_tokens, and load accounting relies on them")
    if not checked and not bad:
        why = "no usage" if missing else "usage without token ids or lengths to hold it to"
        return subcheck(name, None, f"the framework reports {why}")
    return subcheck(name, not bad, "; ".join(bad) or f"{checked} answers: usage matches the tokens returned")


def speaks_openai(fw: Framework) -> bool:
    """The framework is an OpenAI-compatible HTTP server, whose answers must carry usage."""
    return bool(getattr(fw, "openai_api", False))


def tie_margin_for(value: float | None, dtype: str) -> float:
    return value if value is not None else DEFAULT_TIE_MARGIN[dtype]


# ------------------------------------------------- same-framework distribution rule --

def reference_requests(tok: Tok, p: TeacherSize, seed: int = 0) -> list[GenRequest]:
    """What the float64 reference answers for ``framework.reference`` (and the other checks'
    teacher-forced rows): the run seed draws the prompts (see prompts.reference_prompts)."""
    reqs = [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n)
            for t in prompts.reference_prompts(p.prompts, seed)]
    if p.long_prompt_tokens:
        reqs.append(GenRequest(prompt=tok.long_prompt(p.long_prompt_tokens, seed=seed), max_tokens=p.max_tokens,
                               logprobs=p.top_n))
    if p.chat and tok.has_chat_template():
        reqs.extend(GenRequest(messages=list(m), max_tokens=p.max_tokens, logprobs=p.top_n)
                    for m in prompts.CHAT_MESSAGES)
    reqs.extend(GenRequest(messages=[{"role": "user", "content": text}], images=[image], max_tokens=p.max_tokens,
                           logprobs=p.top_n) for text, image in prompts.image_prompts(p.images))
    return reqs


def teacher_and_control(ctx: CheckContext, active: Active, tok: Tok, size: TeacherSize) -> tuple[Any, dict[str, float]] | None:
    """The reference's teacher data and the CPU control's divergence from it (cached), or
    None where there is no local copy of the weights or no room for the reference."""
    if tok.hf is None:
        return None
    policy = load_numerics()
    reqs = reference_requests(tok, size, ctx.seed)
    try:
        teacher, _device = teacher_for(ctx, active, reqs, policy.reference_top_k)
    except ReferenceUnavailable:
        return None
    control = control_scores(active.model, teacher, active.options.dtype, TOP_K, framework_dir(ctx),
                             reference_memory=ctx.reference_memory)
    return teacher, tf_rules.control_summary(control, teacher)


def generations_distribution_row(ctx: CheckContext, active: Active, tok: Tok, size: TeacherSize, name: str,
                                  a: list[Generation], b: list[Generation]) -> tuple[SubcheckRow, dict[str, Any] | None]:
    """Two greedy runs of one framework: their top-N distributions where the tokens so far agree."""
    sa, sb = tf_rules.common_prefix_scores(a, b)
    if not any(x.token_logprobs for x in sa):
        return subcheck(name, None, "the answers carry no logprobs to compare"), None
    found = teacher_and_control(ctx, active, tok, size)
    row, distribution = tf_rules.same_framework_row(name, sa, sb, found[1] if found else None, load_numerics(),
                                                    active.options.dtype)
    return SubcheckRow.model_validate(row), distribution


# ----------------------------------------------------------------- on/off comparisons --

def not_applicable(p: FrameworkParams, why: str) -> Outcome:
    """A kind that does not apply to this framework or machine: nothing was loaded, but the
    outcome still names its framework (the same shape as a load)."""
    return with_evidence(Outcome.skipped(why, applicable=False), not_loaded(p.framework))
