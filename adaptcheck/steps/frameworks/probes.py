"""What each step-4 check does with a loaded framework (the checks module only wires these up).

Each probe builds requests, asks the framework, and judges the answers with explicit
rules, recording every sub-check as a row ``{name, ok, detail}`` so the report shows what
held and what did not. ``ok: None`` means a sub-check could not run here (the reason is
in ``detail``) — it never counts as held.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from adaptcheck.base.procs import tree_rss_mib
from adaptcheck.frameworks.base import (
    Framework,
    FrameworkError,
    Generation,
    GenRequest,
    ScoreRequest,
    ScoringUnsupported,
)
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.agreement import Comparison, TextCodec, compare
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.lifecycle import (
    Active,
    acquire,
    framework_dir,
    not_loaded,
    release,
    run_with_framework,
    with_evidence,
)
from adaptcheck.steps.frameworks.params import (
    DEFAULT_TIE_MARGIN,
    CompileParams,
    ConcurrentParams,
    FrameworkParams,
    KvCacheParams,
    ReferenceParams,
    SingleRequestParams,
    TeacherSize,
    TensorParallelParams,
)
from adaptcheck.steps.frameworks.reference import (
    ReferenceUnavailable,
    control_scores,
    teacher_data,
)

Row = dict[str, Any]

TOP_K = 20
"""Alternatives per position in the same-framework teacher-forced comparisons (the control is
scored with the same K, so the two figures are comparable)."""


def _row(name: str, ok: bool | None, detail: str, **extra: Any) -> Row:
    return {"name": name, "ok": ok, "detail": detail, **extra}


def _verdict(rows: list[Row], what: str, **kw: Any) -> Outcome:
    """pass when every row held and at least one ran; fail naming the first that did not."""
    failed = [r for r in rows if r["ok"] is False]
    ran = [r for r in rows if r["ok"] is not None]
    details = {"subchecks": rows, **kw.pop("details", {})}
    if failed:
        return Outcome.failed(f"{failed[0]['name']}: {failed[0]['detail']}"
                              + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""), details=details, **kw)
    if not ran:
        return Outcome.skipped(f"nothing of {what} could run here", details=details, **kw)
    not_run = [r["name"] for r in rows if r["ok"] is None]
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


def _strip_eos(g: Generation, eos: set[int]) -> Generation:
    """The generation without a trailing EOS id: frameworks differ in whether they list it,
    and whether the sequence stopped is judged by ``finish_reason``."""
    ids = g.token_ids
    if ids and ids[-1] in eos:
        return Generation(token_ids=ids[:-1], text=g.text, finish_reason=g.finish_reason,
                          prompt_tokens=g.prompt_tokens, completion_tokens=g.completion_tokens,
                          top_logprobs=g.top_logprobs, prompt_ids=g.prompt_ids, extra=g.extra)
    return g


def _usage_row(name: str, gens: list[Generation], eos: set[int], *, required: bool = False,
               max_tokens: list[int] | None = None) -> Row:
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
        return _row(name, None, f"the framework reports {why}")
    return _row(name, not bad, "; ".join(bad) or f"{checked} answers: usage matches the tokens returned")


def _speaks_openai(fw: Framework) -> bool:
    """The framework is an OpenAI-compatible HTTP server, whose answers must carry usage."""
    return bool(getattr(fw, "openai_api", False))


def _tie_margin(value: float | None, dtype: str) -> float:
    return value if value is not None else DEFAULT_TIE_MARGIN[dtype]


# --------------------------------------------------------------------------- the load --

def load_outcome(ctx: CheckContext, active: Active) -> Outcome:
    reused = active.loaded_by != ctx.check_id
    metrics = {"load_s": round(active.load_s, 3)}
    if active.model.generated_s is not None:
        metrics["model_generation_s"] = round(active.model.generated_s, 3)
    tok = local_tokenizer(active)
    gen = active.framework.generate([GenRequest(prompt=prompts.SHORT_PROMPTS[0], max_tokens=4)])[0]
    if not gen.text and not gen.token_ids:
        return Outcome.failed("the model loaded but its first request returned nothing", metrics=metrics)
    what = "reused" if reused else "loaded"
    eos_note = "" if tok.hf is not None else " (endpoint of unknown weights: no local tokenizer)"
    return Outcome.passed(f"{active.framework.display_name} {what} {active.model.name} in {active.load_s:.1f} s; "
                          f"first answer {gen.text[:40]!r}{eos_note}", metrics=metrics)


# -------------------------------------------------------------------- single requests --

def single_request(ctx: CheckContext, active: Active, p: SingleRequestParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    eos = tok.eos_ids()
    rows: list[Row] = []
    prompt = prompts.SHORT_PROMPTS[0]
    by_len: dict[int, Generation] = {}
    for n in sorted(set(p.output_lengths)):
        g = fw.generate([GenRequest(prompt=prompt, max_tokens=n)])[0]
        by_len[n] = g
        rows.append(_length_row(f"short prompt, max_tokens={n}", g, n, eos))
    rows.append(_prefix_row(by_len))
    tiny = [fw.generate([GenRequest(prompt=t, max_tokens=4)])[0] for t in prompts.TINY_PROMPTS]
    rows.extend(_length_row(f"tiny prompt {t!r}, max_tokens=4", g, 4, eos) for t, g in zip(prompts.TINY_PROMPTS, tiny, strict=False))
    long_text = tok.long_prompt(p.long_prompt_tokens)
    g = fw.generate([GenRequest(prompt=long_text, max_tokens=p.long_max_tokens)])[0]
    row = _length_row(f"long prompt (~{p.long_prompt_tokens} tokens), max_tokens={p.long_max_tokens}", g,
                      p.long_max_tokens, eos)
    if g.prompt_tokens is not None and tok.hf is not None:
        want = len(tok.hf(long_text)["input_ids"])
        if g.prompt_tokens != want:
            row.update(ok=False, detail=row["detail"] + f"; usage.prompt_tokens {g.prompt_tokens} != {want} "
                       "from the model's tokenizer")
    rows.append(row)
    rows.append(_usage_row("usage counts", [*by_len.values(), g], eos, required=_speaks_openai(fw),
                           max_tokens=[*by_len, p.long_max_tokens]))
    rows.append(_stop_row(active))
    rows.extend(_eos_rows(active))
    return _verdict(rows, "single requests", metrics={"requests": len(by_len) + len(tiny) + 4})


def _length_row(name: str, g: Generation, max_tokens: int, eos: set[int]) -> Row:
    n = len(g.token_ids) if g.token_ids is not None else g.completion_tokens
    fr = g.finish_reason
    if n is None:
        return _row(name, None, "the framework returns neither token ids nor usage")
    ends_eos = bool(g.token_ids) and g.token_ids[-1] in eos  # type: ignore[index]
    tokens_wo_eos = n - (1 if ends_eos else 0)
    if fr == "length":
        ok = tokens_wo_eos == max_tokens or n == max_tokens
        why = f"finish 'length' after {n} tokens"
    elif fr == "stop":
        ok = n <= max_tokens and (ends_eos or g.token_ids is None)
        why = f"finish 'stop' after {n} tokens" + ("" if ok else " without EOS or a stop string")
    else:
        ok, why = False, f"unexpected finish_reason {fr!r} after {n} tokens"
    if n > max_tokens:
        ok, why = False, f"{n} tokens returned for max_tokens={max_tokens}"
    return _row(name, ok, why)


def _prefix_row(by_len: dict[int, Generation]) -> Row:
    """Greedy decoding is causal: the answer to max_tokens=8 is the start of max_tokens=32."""
    lens = sorted(by_len)
    if len(lens) < 2:
        return _row("shorter answers are prefixes", None, "only one output length requested")
    bad = []
    for short, long in itertools.pairwise(lens):
        a, b = by_len[short], by_len[long]
        if a.token_ids is not None and b.token_ids is not None:
            same = b.token_ids[: len(a.token_ids)] == a.token_ids
        else:
            same = b.text.startswith(a.text)
        if not same:
            bad.append(f"max_tokens={short} is not the start of max_tokens={long}")
    return _row("shorter answers are prefixes", not bad, "; ".join(bad) or f"lengths {lens} agree")


def _stop_row(active: Active) -> Row:
    """A stop string cuts the answer right before it. The probe comes from the synthetic
    model's recorded output, or from this framework's own greedy answer for any model."""
    fw = active.framework
    probe = (active.model.synthetic or {}).get("stop_probe") if fw.serves_local_weights() else None
    prompt, max_tokens = (probe["prompt"], int(probe["max_tokens"])) if probe else (prompts.SHORT_PROMPTS[2], 24)
    full = fw.generate([GenRequest(prompt=prompt, max_tokens=max_tokens)])[0].text
    stop = probe["stop"] if probe else _pick_stop(full)
    if stop is None:
        return _row("stop string honoured", None, f"the answer {full[:40]!r} has no usable stop string")
    where = full.find(stop)
    if where < 0:
        return _row("stop string honoured", None, f"this framework's answer does not contain {stop!r}: "
                    "it diverged from the reference before it (see framework.reference)")
    g = fw.generate([GenRequest(prompt=prompt, max_tokens=max_tokens, stop=[stop])])[0]
    want = full[:where]
    ok = g.finish_reason == "stop" and g.text in (want, want + stop)
    if not ok:
        detail = f"stop {stop!r}: expected {want!r} with finish 'stop', got {g.text!r} with finish {g.finish_reason!r}"
    elif g.text == want:
        detail = f"stop {stop!r}: answer cut to {len(g.text)} chars, finish 'stop'"
    else:
        # Generation did stop there; only the returned text differs from OpenAI's rule.
        detail = (f"stop {stop!r}: stopped at the stop string, but the text includes it "
                  "(OpenAI-compatible servers leave it out)")
    return _row("stop string honoured", ok, detail, includes_stop_string=ok and g.text != want)


def _pick_stop(text: str) -> str | None:
    """A word from the second half of ``text`` whose first occurrence is there."""
    words = [w for w in text.split() if len(w) >= 3 and w.isascii() and w.isprintable()]
    for w in words[len(words) // 2:]:
        at = text.find(w)
        if at >= len(text) // 3:
            return w
    return None


def _eos_rows(active: Active) -> list[Row]:
    fw = active.framework
    meta = active.model.synthetic if fw.serves_local_weights() else None
    if not meta or "eos_step" not in meta:
        return [_row("EOS honoured", None, "no prompt is known to end in EOS for this model (synthetic models have one)")]
    prompt, k = meta["eos_probe_prompt"], int(meta["eos_step"])
    g = fw.generate([GenRequest(prompt=prompt, max_tokens=k + 8)])[0]
    n = len(g.token_ids) if g.token_ids is not None else g.completion_tokens
    ok = g.finish_reason == "stop" and n in (k, k + 1)
    rows = [_row("EOS honoured", ok, f"reference ends with EOS after {k} tokens; framework: finish "
                 f"{g.finish_reason!r} after {n} tokens")]
    try:
        g2 = fw.generate([GenRequest(prompt=prompt, max_tokens=k + 8, ignore_eos=True)])[0]
    except FrameworkError as exc:
        rows.append(_row("ignore_eos honoured", None, f"not supported: {exc}"))
        return rows
    if g2.extra.get("ignore_eos_unsupported"):
        rows.append(_row("ignore_eos honoured", None, "the server does not accept ignore_eos"))
    else:
        n2 = len(g2.token_ids) if g2.token_ids is not None else g2.completion_tokens
        rows.append(_row("ignore_eos honoured", g2.finish_reason == "length" and n2 == k + 8,
                         f"finish {g2.finish_reason!r} after {n2} tokens (max_tokens {k + 8})"))
    return rows


# -------------------------------------------------------------------------- reference --

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
    return reqs


def reference(ctx: CheckContext, active: Active, p: ReferenceParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    if tok.hf is None:
        return Outcome.skipped("no local copy of the served weights: pass --model PATH (the same weights as the "
                               "endpoint) to compare with a CPU reference")
    reqs = reference_requests(tok, p, ctx.seed)
    policy = load_numerics()
    try:
        teacher = teacher_data(active.model, reqs, framework_dir(ctx), policy.reference_top_k)
    except ReferenceUnavailable as exc:
        return Outcome.skipped(str(exc))
    ctx.progress(1, 3, "parts", note="teacher-forced scoring vs the float64 reference")
    metrics: dict[str, Any] = {"reference_dtype": teacher.dtype, "top_n": p.top_n}
    rows: list[Row] = []
    try:
        row, tf, tf_metrics = tf_rules.against_reference(ctx, active, teacher, policy, p.top_k)
        rows.append(row)
        metrics.update(tf_metrics)
    except ScoringUnsupported as exc:
        # Never a silent pass: the greedy comparison below is then the whole verdict, and says so.
        tf = tf_rules.greedy_fallback(str(exc))
        rows.append(_row("teacher-forced distributions vs float64 reference", None,
                         f"not possible here: {exc}; greedy comparison only"))
    except ValueError as exc:  # scores that do not line up with the sequences (a broken server)
        tf = tf_rules.greedy_fallback(str(exc))
        rows.append(_row("teacher-forced distributions vs float64 reference", False, f"unusable scores: {exc}"))
    if p.greedy:
        ctx.progress(2, 3, "parts", note="greedy answers vs the float64 reference")
        rows.extend(_greedy_rows(fw, tok, reqs, teacher.generations, p, metrics, tf))
    details: dict[str, Any] = {"teacher_forced": tf, "reference": f"transformers {teacher.dtype} on CPU",
                               "compared_as_text": tf.get("greedy", {}).get("compared_as_text")}
    if any(r["ok"] is False for r in rows) and tf.get("method") == "teacher_forced":
        try:
            rel = tf_rules.write_repro(ctx, active, teacher, tf, p.top_k, policy.reference_top_k)
        except Exception as exc:  # noqa: BLE001 - the verdict stands without its reproducer
            rel, details["repro_error"] = None, f"{type(exc).__name__}: {exc}"
        if rel:
            details["repro"] = rel
    return _verdict(rows, "reference agreement", metrics=metrics, details=details)


def _greedy_rows(fw: Framework, tok: Tok, reqs: list[GenRequest], ref: list[Generation], p: ReferenceParams,
                 metrics: dict[str, Any], tf: dict[str, Any]) -> list[Row]:
    """Greedy answers against the reference's: the user-visible symptom, and the whole
    verdict where the framework cannot score (top-N rule at the first divergence)."""
    # One request at a time: this is the single-request answer; batching is framework.concurrent's.
    dev = [fw.generate([r])[0] for r in reqs]
    eos = tok.eos_ids()
    cmp = compare([_strip_eos(g, eos) for g in ref], [_strip_eos(g, eos) for g in dev], mode="top_n", top_n=p.top_n,
                  codec=tok.codec())
    rows = [_row("greedy tokens vs CPU reference", cmp.ok, cmp.summary())]
    finish = [f"prompt {i}: {a.finish_reason} vs {b.finish_reason}" for i, (a, b) in enumerate(zip(ref, dev, strict=False))
              if cmp.pairs[i].exact and a.finish_reason != b.finish_reason]
    rows.append(_row("finish reasons agree", not finish, "; ".join(finish) or "same finish reason for identical answers"))
    metrics.update(cmp.metrics())
    tf["greedy"] = {"comparison": cmp.details(), "compared_as_text": sum(x.by_text for x in cmp.pairs)}
    return rows


# ------------------------------------------------------------------------- concurrency --

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
    alone = [fw.generate([r])[0] for r in reqs]
    together = [g for g in fw.generate(reqs)]
    margin = _tie_margin(p.tie_margin, active.options.dtype)
    cmp = compare([_strip_eos(g, eos) for g in alone], [_strip_eos(g, eos) for g in together],
                  mode="near_tie", top_n=p.top_n, tie_margin=margin, codec=tok.codec())
    rows = [_row(f"alone vs in a batch of {len(reqs)}", cmp.ok, cmp.summary())]
    rows.append(_usage_row("usage counts in the batch", together, eos, required=_speaks_openai(fw),
                           max_tokens=[r.max_tokens for r in reqs]))
    metrics: dict[str, Any] = {**cmp.metrics(), "batch": len(reqs), "tie_margin": margin}
    tf_rows, distribution = _scored_alone_vs_batched(ctx, active, tok, p.teacher)
    rows.extend(tf_rows)
    if p.stream and getattr(fw, "supports_stream", False):
        streamed = fw.generate([GenRequest(prompt=r.prompt, max_tokens=r.max_tokens, stream=True) for r in reqs])
        diff = [f"request {i}: {a.text!r} vs streamed {b.text!r}" for i, (a, b) in enumerate(zip(together, streamed, strict=False))
                if a.text != b.text]
        rows.append(_row("stream vs non-stream", not diff, "; ".join(diff[:2]) or f"{len(reqs)} streamed answers identical"))
        rows.append(_usage_row("usage counts when streaming", streamed, eos, required=_speaks_openai(fw),
                               max_tokens=[r.max_tokens for r in reqs]))
    elif p.stream:
        rows.append(_row("stream vs non-stream", None, f"{fw.display_name} has no streaming API"))
    return _verdict(rows, "batch consistency", metrics=metrics,
                    details={"comparison": cmp.details(), "distribution": distribution})


# ------------------------------------------------- same-framework distribution rule --

def _control_sum(ctx: CheckContext, active: Active, tok: Tok, size: TeacherSize) -> tuple[Any, dict[str, float]] | None:
    """The reference's teacher data and the CPU control's divergence from it (cached), or
    None where there is no local copy of the weights or no room for the reference."""
    if tok.hf is None:
        return None
    policy = load_numerics()
    reqs = reference_requests(tok, size, ctx.seed)
    try:
        teacher = teacher_data(active.model, reqs, framework_dir(ctx), policy.reference_top_k)
    except ReferenceUnavailable:
        return None
    control = control_scores(active.model, teacher, active.options.dtype, TOP_K, framework_dir(ctx))
    return teacher, tf_rules.control_summary(control, teacher)


def _scored_alone_vs_batched(ctx: CheckContext, active: Active, tok: Tok,
                             size: TeacherSize) -> tuple[list[Row], dict[str, Any] | None]:
    """Teacher-forced: the reference sequences scored one per request and all in one batch,
    compared with each other (same-framework rule) and each against float64 (batched vs alone)."""
    name = "teacher-forced distributions alone vs batched"
    found = _control_sum(ctx, active, tok, size)
    if found is None:
        return [_row(name, None, "no local copy of the weights: no reference sequences or control")], None
    teacher, control_sum = found
    try:
        alone = tf_rules.score_alone(active.framework, teacher.sequences, TOP_K)
        together = active.framework.score([ScoreRequest(s.token_ids, s.start, TOP_K) for s in teacher.sequences])
    except ScoringUnsupported as exc:
        return [_row(name, None, f"not possible here: {exc}")], None
    policy, dtype = load_numerics(), active.options.dtype
    row, distribution = tf_rules.same_framework_row(name, alone, together, control_sum, policy, dtype)
    ref_row, vs_reference = tf_rules.batched_vs_alone_row(
        "teacher-forced distributions batched vs float64, relative to alone", teacher.scores, alone, together,
        policy, dtype)
    # Both rules hold or the distribution evidence does not: the report shows the two together.
    distribution["vs_reference"] = vs_reference
    distribution["ok"] = bool(distribution.get("ok")) and vs_reference["ok"]
    return [row, ref_row], distribution


def _generations_distribution_row(ctx: CheckContext, active: Active, tok: Tok, size: TeacherSize, name: str,
                                  a: list[Generation], b: list[Generation]) -> tuple[Row, dict[str, Any] | None]:
    """Two greedy runs of one framework: their top-N distributions where the tokens so far agree."""
    sa, sb = tf_rules.common_prefix_scores(a, b)
    if not any(x.token_logprobs for x in sa):
        return _row(name, None, "the answers carry no logprobs to compare"), None
    found = _control_sum(ctx, active, tok, size)
    return tf_rules.same_framework_row(name, sa, sb, found[1] if found else None, load_numerics(),
                                       active.options.dtype)


# ---------------------------------------------------------------------------- kv cache --

def _rss_mib() -> float:
    """Resident memory of this process and its descendants (a launched server included), MiB;
    0 where unreadable (not Linux), so the growth reads as none rather than failing."""
    return tree_rss_mib(os.getpid()) or 0.0


def _kv_requests(tok: Tok, p: KvCacheParams) -> list[GenRequest]:
    prefix = tok.long_prompt(p.prefix_tokens, seed=7) if p.prefix_tokens else ""
    return [GenRequest(prompt=f"{prefix} {prompts.SHORT_PROMPTS[i % len(prompts.SHORT_PROMPTS)]}".strip(),
                       max_tokens=p.max_tokens, logprobs=p.top_n) for i in range(p.batch)]


def kv_cache(ctx: CheckContext, active: Active, p: KvCacheParams) -> Outcome:
    fw, tok = active.framework, local_tokenizer(active)
    eos = tok.eos_ids()
    margin = _tie_margin(p.tie_margin, active.options.dtype)
    reqs = _kv_requests(tok, p)
    first = [g for g in fw.generate(reqs)]  # warm-up round: fills caches and pools
    base_state, base_rss, hits_before = fw.memory_state(), _rss_mib(), _prefix_hits(fw)
    rows: list[Row] = []
    worst: Comparison | None = None
    for _ in range(p.rounds):
        again = [g for g in fw.generate(reqs)]
        cmp = compare([_strip_eos(g, eos) for g in first], [_strip_eos(g, eos) for g in again],
                      mode="near_tie", top_n=p.top_n, tie_margin=margin, codec=tok.codec())
        if worst is None or not cmp.ok:
            worst = cmp
    assert worst is not None
    rows.append(_row(f"{p.rounds} more rounds give the same answers (cached prefixes reused)", worst.ok, worst.summary()))
    dist_row, distribution = _generations_distribution_row(ctx, active, tok, p.teacher,
                                                           "distributions: cached rounds vs the first", first, again)
    rows.append(dist_row)
    state, rss = fw.memory_state(), _rss_mib()
    metrics: dict[str, Any] = {"rounds": p.rounds, "batch": p.batch, "rss_growth_mib": round(rss - base_rss, 1)}
    kv_keys = [k for k in state if "kv_cache_usage" in k or "cache_usage" in k]
    if kv_keys:
        k = kv_keys[0]
        metrics.update(kv_usage_before=base_state.get(k), kv_usage_after=state[k])
        busy = state.get("vllm:num_requests_running", 0.0) + state.get("vllm:num_requests_waiting", 0.0)
        ok = state[k] <= max(base_state.get(k, 0.0), 0.0) + 1e-6 and busy == 0
        rows.append(_row("KV cache back at baseline", ok, f"{k} {base_state.get(k)} → {state[k]}, requests in flight {busy:g}"))
    elif not fw.runs_here():
        rows.append(_row("memory back at baseline", None, "the server runs elsewhere and exposes no KV-cache gauge"))
    else:
        growth = rss - base_rss
        rows.append(_row("memory back at baseline", growth <= p.memory_growth_mib,
                         f"no KV-cache gauge readable; process RSS grew {growth:.1f} MiB over {p.rounds} rounds "
                         f"(bound {p.memory_growth_mib:g} MiB)"))
    rows.append(_prefix_hits_row(active, hits_before, _prefix_hits(fw)))
    if p.compare_prefix_off:
        rows.append(_prefix_off_row(ctx, active, p, reqs, first, eos))
    return _verdict(rows, "KV cache", metrics=metrics, details={"distribution": distribution})


def _prefix_hits(fw: Framework) -> float | None:
    values = [v for k, v in fw.metrics().items() if "prefix_cache_hits" in k]
    return sum(values) if values else None


def _prefix_hits_row(active: Active, before: float | None, after: float | None) -> Row:
    """The repeated rounds really were served from the prefix cache (else nothing was tested)."""
    fw = active.framework
    if not fw.supports_prefix_caching or active.options.enable_prefix_caching is False:
        return _row("prefix cache hit", None, f"prefix caching is not in use on {fw.display_name}")
    if before is None or after is None:
        return _row("prefix cache hit", None, "the framework exposes no prefix-cache counter")
    return _row("prefix cache hit", after > before, f"prefix-cache hit tokens {before:g} → {after:g} over the rounds")


def _prefix_off_row(ctx: CheckContext, active: Active, p: KvCacheParams, reqs: list[GenRequest],
                    cached: list[Generation], eos: set[int]) -> Row:
    if not active.framework.supports_prefix_caching:
        return _row("prefix cache on vs off", None, f"{active.framework.display_name} has no prefix-caching switch")
    params = p.model_copy(update={"prefix_caching": False})
    other = acquire(ctx, p.framework, ctx.check_id, **params.load_overrides())
    tok = local_tokenizer(other)
    off = [g for g in other.framework.generate(reqs)]
    cmp = compare([_strip_eos(g, eos) for g in cached], [_strip_eos(g, eos) for g in off], mode="top_n", top_n=p.top_n,
                  codec=tok.codec())
    release(ctx)
    return _row("prefix cache on vs off", cmp.ok, cmp.summary())


# ----------------------------------------------------------------- on/off comparisons --

def toggle(ctx: CheckContext, p: CompileParams | TensorParallelParams, toggle: str) -> Outcome:
    """Load the framework two ways and compare greedy answers (compile off/on; TP 1 vs n).

    Not-applicable answers come from the adapter's declared capabilities before anything
    is loaded; the first variant is the instance the shared loader brings up.
    """
    from adaptcheck.frameworks.registry import framework_class

    cls = framework_class(p.framework)

    def not_applicable(why: str) -> Outcome:
        # Nothing was loaded, but the outcome still names its framework (same shape as a load).
        return with_evidence(Outcome.skipped(why, applicable=False), not_loaded(p.framework))

    if toggle == "compile":
        if not cls.supports_compile_toggle:
            return not_applicable(f"{cls.display_name} has no graph-capture / compile switch")
        variants: list[tuple[str, dict[str, Any]]] = [("compile off", {"compile": False}), ("compile on", {"compile": True})]
    else:
        if ctx.device_count < 2:
            return not_applicable("tensor parallel needs more than one device")
        if not cls.supports_tensor_parallel:
            return not_applicable(f"{cls.display_name} has no tensor parallelism")
        variants = [("1 device", {"tensor_parallel_size": 1}),
                    (f"{ctx.device_count} devices", {"tensor_parallel_size": ctx.device_count})]
    first = p.model_copy(update={"compile": False}) if toggle == "compile" else p

    def body(ctx: CheckContext, active: Active, params: FrameworkParams) -> Outcome:
        tok = local_tokenizer(active)
        eos = tok.eos_ids()
        reqs = [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n)
                for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]
        answers = [[_strip_eos(g, eos) for g in active.framework.generate(reqs)]]
        loads = {f"load_s[{variants[0][0]}]": round(active.load_s, 2)}
        other = acquire(ctx, p.framework, ctx.check_id, **{**params.load_overrides(), **variants[1][1]})
        loads[f"load_s[{variants[1][0]}]"] = round(other.load_s, 2)
        answers.append([_strip_eos(g, eos) for g in other.framework.generate(reqs)])
        release(ctx)
        cmp = compare(answers[0], answers[1], mode="top_n", top_n=p.top_n, codec=tok.codec())
        rows = [_row(f"{variants[0][0]} vs {variants[1][0]}", cmp.ok, cmp.summary())]
        dist_row, distribution = _generations_distribution_row(
            ctx, active, tok, p.teacher, f"distributions: {variants[0][0]} vs {variants[1][0]}", answers[0], answers[1])
        rows.append(dist_row)
        return _verdict(rows, toggle.replace("_", " "), metrics={**cmp.metrics(), **loads},
                        details={"comparison": cmp.details(), "distribution": distribution})

    return run_with_framework(ctx, first, body)
