"""Device generates, reference scores: the teacher of every check scored against the float64
reference (``framework.reference``, and the reference and control rows of the concurrent,
KV-cache, long-context and fp8 checks) where greedy generation on the CPU reference would take
too long for the model's size (docs/reference-at-scale.md). :func:`teacher_for` decides.

The device answers each request greedily, alone; the reference scores each of those sequences
teacher-forced in one forward pass (no decode loop: one read of the weights per sequence instead
of one per generated token). The teacher-forced comparison is then the usual one (the device and
the control score the same sequences, KL per position against the float64 rows). The greedy
comparison becomes: the device's answer must be what the reference would have generated up to
its first non-argmax token, and there the device's token must be among the reference's top-N
(the top-N rule of :mod:`agreement`); :func:`reference_like` writes the reference's side of that
comparison as a generation, so :func:`agreement.compare` judges both modes alike.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcheck.base.schemas.framework_evidence import ReferenceRun, SubcheckRow
from adaptcheck.frameworks.base import Generation, GenRequest, Scored, ScoreRequest
from adaptcheck.frameworks.modelsrc import ResolvedModel
from adaptcheck.steps.frameworks.lifecycle import framework_dir
from adaptcheck.steps.frameworks.reference import (
    TIE_NATS,
    TeacherData,
    _cached,
    _store,
    cpu_transformers,
    load_generation,
    load_scored,
    run_record,
    teacher_data,
)
from adaptcheck.steps.frameworks.reference_plan import GenerationEstimate, generation_estimate, reference_plan

if TYPE_CHECKING:
    from adaptcheck.ladder.check import CheckContext
    from adaptcheck.steps.frameworks.lifecycle import Active


def teacher_for(ctx: CheckContext, active: Active, requests: list[GenRequest],
                top_k: int) -> tuple[TeacherData, list[Generation] | None]:
    """The reference's teacher data for ``requests``, and the device's greedy answers where the
    device generated them (None where the reference generated).

    The reference generates unless its estimated generation time is over the budget
    (:func:`~adaptcheck.steps.frameworks.reference_plan.generation_estimate`: a 72B model streamed
    from disk is days of CPU decoding); then ``active``'s framework answers each request greedily,
    alone, and the reference scores those sequences teacher-forced (:func:`scored_teacher`).
    Raises ReferenceUnavailable where the reference cannot run here at all."""
    estimate = generation_estimate(reference_plan(active.model, ctx.reference_memory), requests)
    if estimate.mode == "reference generates":
        teacher = teacher_data(active.model, requests, framework_dir(ctx), top_k, ctx.reference_memory)
        if teacher.run is not None:
            teacher.run.generation_estimate = estimate.describe()
        return teacher, None
    device = [active.framework.generate([r])[0] for r in requests]
    return scored_teacher(active.model, requests, device, framework_dir(ctx), top_k, ctx.reference_memory,
                          estimate), device


def _key(model: ResolvedModel, dtype: str, requests: list[GenRequest], device: list[Generation]) -> str:
    blob = json.dumps({"weights": model.weights_sha256, "dtype": dtype,
                       "requests": [asdict(r) for r in requests],
                       "device": [[g.prompt_ids, g.token_ids, g.text] for g in device]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def reference_like(tokens: list[int], score: Scored, n: int, finish: str | None, eos: set[int]) -> Generation:
    """The reference's side of the greedy comparison of a device answer ``tokens`` it scored:
    the device's tokens while each is the reference's argmax (to :data:`TIE_NATS`), then the
    reference's argmax at the first that is not, where its own answer would have parted."""
    out: list[int] = []
    tops: list[dict[int, float]] = []
    for tok, lp, row in zip(tokens, score.token_logprobs, score.top_logprobs, strict=False):
        best, best_lp = max(row.items(), key=lambda kv: kv[1])
        top = dict(sorted(row.items(), key=lambda kv: kv[1], reverse=True)[:n])
        if lp >= best_lp - TIE_NATS:
            top.setdefault(int(tok), float(lp))
            out.append(int(tok))
            tops.append(top)
            continue
        out.append(int(best))
        tops.append(top)
        finish = "stop" if best in eos else None
        break
    return Generation(token_ids=out, text="", finish_reason=finish, completion_tokens=len(out), top_logprobs=tops)


def scored_teacher(model: ResolvedModel, requests: list[GenRequest], device: list[Generation], cache_dir: Path,
                   top_k: int, reference_memory: int | None, estimate: GenerationEstimate) -> TeacherData:
    """The reference's teacher-forced scores of the device's greedy answers to ``requests``, as
    :class:`TeacherData` (``generations``: :func:`reference_like`); cached in ``cache_dir`` (the
    file name starts ``teacher-`` so ``adaptcheck repro`` finds the sequences)."""
    plan = reference_plan(model, reference_memory)
    path = cache_dir / f"teacher-scored-{_key(model, plan.dtype, requests, device)}-k{top_k}.json"
    data = _cached(path)
    if isinstance(data, dict):
        try:
            return TeacherData(dtype=plan.dtype, attention=data.get("attention"),
                               generations=[load_generation(g) for g in data["generations"]],
                               sequences=[ScoreRequest(**s) for s in data["sequences"]],
                               scores=[load_scored(x) for x in data["scores"]],
                               run=ReferenceRun.model_validate({**data["run"], "cached": True}))
        except (KeyError, TypeError, ValueError):
            pass
    start = time.perf_counter()
    fw = cpu_transformers(model, plan.dtype, plan=plan)
    try:
        eos = set(fw._eos_ids())
        seqs: list[ScoreRequest] = []
        gens: list[Generation] = []
        scores: list[Scored] = []
        for req, g in zip(requests, device, strict=True):
            # The reference's prompt ids, as in the other mode: every framework is scored on
            # sequences built on the model's own tokenizer and chat template.
            prompt = fw._prompt_ids(req)
            tokens = list(g.token_ids) if g.token_ids is not None else _encode(fw, g.text)
            if g.finish_reason == "stop" and not req.stop and tokens and tokens[-1] not in eos and eos:
                # An answer that stopped at an EOS it does not list: the EOS is scored too, so
                # the reference judges where it stopped (frameworks differ in listing it).
                tokens.append(_eos_token(fw, eos))
            if not tokens:
                gens.append(Generation(token_ids=[], text="", finish_reason=g.finish_reason, prompt_ids=prompt))
                continue
            seq = ScoreRequest(token_ids=prompt + tokens, start=len(prompt), top_k=top_k, images=list(req.images))
            score = fw.score([seq])[0]
            like = reference_like(tokens, score, max(req.logprobs, 1), g.finish_reason, eos)
            like.prompt_ids, like.text = prompt, str(fw.tokenizer.decode(like.token_ids, skip_special_tokens=True))
            seqs.append(seq)
            scores.append(score)
            gens.append(like)
        attention = fw.attn_implementation()
        run = run_record(fw, plan, time.perf_counter() - start, generation=estimate.mode,
                         generation_estimate=estimate.describe())
    finally:
        fw.shutdown()
    _store(path, {"generations": [asdict(g) for g in gens], "scores": [asdict(x) for x in scores],
                  "sequences": [asdict(s) for s in seqs], "attention": attention, "dtype": plan.dtype,
                  "run": run.dump()})
    return TeacherData(dtype=plan.dtype, attention=attention, generations=gens, sequences=seqs, scores=scores, run=run)


def _eos_token(fw: Any, eos: set[int]) -> int:
    """The tokenizer's EOS id where it is one of the model's, else the smallest of them."""
    tok = getattr(fw.tokenizer, "eos_token_id", None)
    return int(tok) if tok in eos else min(eos)


def _encode(fw: Any, text: str) -> list[int]:
    """A text-only answer's tokens, by the model's tokenizer (the sequence both sides then score)."""
    return [int(t) for t in fw.tokenizer(text, add_special_tokens=False)["input_ids"]]


def device_rows(requests: list[GenRequest], device: list[Generation], teacher: TeacherData,
                eos: set[int]) -> list[SubcheckRow]:
    """What the reference cannot see from scores alone: the device read the prompt as the
    model's tokenizer does, and stopped where greedy decoding stops (EOS, max_tokens or a stop
    string; an answer cut short with every token the argmax would otherwise look exact)."""
    def subcheck(name: str, ok: bool | None, detail: str) -> SubcheckRow:
        return SubcheckRow(name=name, ok=ok, detail=detail)

    differ = [i for i, (g, ref) in enumerate(zip(device, teacher.generations, strict=False))
              if g.prompt_ids is not None and ref.prompt_ids is not None and list(g.prompt_ids) != list(ref.prompt_ids)]
    told = sum(g.prompt_ids is not None for g in device)
    prompt_row = subcheck("device prompt tokens match the model's tokenizer", None if not told else not differ,
                          f"prompts {differ} were tokenised differently" if differ else
                          (f"{told} prompts: same token ids" if told else "the framework reports no prompt ids"))
    short = [i for i, (r, g) in enumerate(zip(requests, device, strict=True))
             if g.token_ids is not None and not r.stop and len(g.token_ids) < r.max_tokens
             and not (g.token_ids and g.token_ids[-1] in eos) and g.finish_reason != "stop"]
    end_row = subcheck("device answers end at EOS or max_tokens", not short,
                       f"answers {short} stopped early without EOS" if short else
                       f"{len(device)} answers end where greedy decoding ends")
    return [prompt_row, end_row]
