"""The CPU reference run and the healthy control: the same weights, transformers on the CPU.

The *reference* (float64 in memory where it fits the reference's memory budget, else streamed a
decoder layer at a time in float64 or float32, else a skip: :mod:`reference_plan`) answers each
prompt greedily and scores its own sequences teacher-forced; the *control* scores the same
sequences at the served dtype, and sets the scale every step-4 bound is a multiple of. Both are
cached in the run folder by weights, prompts and settings, so every framework of a run is
compared against the same ones (method: docs/step4-numerics.md, docs/reference-at-scale.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from pydantic import BaseModel, Field, JsonValue

from adaptcheck.base.schemas.framework_evidence import ReferenceRun
from adaptcheck.frameworks.base import (
    Generation,
    GenRequest,
    LoadOptions,
    Scored,
    ScoreRequest,
)
from adaptcheck.frameworks.modelsrc import ResolvedModel
from adaptcheck.steps.frameworks.reference_plan import (
    BYTES_PER_PARAM,
    MEMORY_FRACTION,
    Plan,
    ReferenceUnavailable,
    parameter_count,
    reference_path,
    reference_plan,
)

__all__ = ["BYTES_PER_PARAM", "MEMORY_FRACTION", "Control", "ReferenceUnavailable", "TeacherData", "control_scores",
           "cpu_transformers", "parameter_count", "reference_path", "teacher_data"]


def _key(model: ResolvedModel, requests: list[GenRequest], dtype: str) -> str:
    # A text-only request's key is what it was before requests could carry images. Whether the
    # reference streamed is not in the key: streamed and in-memory numbers are identical
    # (tests/steps/frameworks/test_streamed_reference.py).
    reqs = [{k: v for k, v in asdict(r).items() if k != "images" or v} for r in requests]
    blob = json.dumps({"weights": model.weights_sha256, "dtype": dtype, "requests": reqs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _cached(path: Path) -> object | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None  # a torn or foreign file: recompute


def _store(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


@dataclass
class TeacherData:
    """The reference's greedy answers, the sequences they make, and its scores of them."""

    dtype: str
    """The reference's dtype ('fp64', or 'fp32' when not even a float64 layer fits)."""
    attention: str | None
    """The attention implementation the reference ran."""
    generations: list[Generation]
    sequences: list[ScoreRequest]
    """prompt + continuation per request with a non-empty continuation (teacher forcing)."""
    scores: list[Scored]
    """The reference's own teacher-forced scores of ``sequences`` (top ``reference_top_k``)."""
    run: ReferenceRun | None = None
    """How the reference ran (in memory or streamed, budget, peak, who generated)."""


def _sequences(gens: list[Generation], top_k: int) -> list[ScoreRequest]:
    return [ScoreRequest(token_ids=list(g.prompt_ids or []) + list(g.token_ids or []), start=len(g.prompt_ids or []),
                         top_k=top_k, images=_images_of(g))
            for g in gens if g.token_ids and g.prompt_ids]


def _images_of(g: Generation) -> list[str]:
    """The images a generation's prompt showed (adapters record them in ``extra``)."""
    images = g.extra.get("images")
    return [str(x) for x in images] if isinstance(images, list) else []


def cpu_transformers(model: ResolvedModel, dtype: str, reference_memory: int | None = None, *,
                     plan: Plan | None = None) -> Any:
    """transformers on the CPU at ``dtype``: in memory, or streamed a layer at a time where the
    whole model does not fit ``--reference-memory`` (``plan``, when the caller has one)."""
    from adaptcheck.frameworks.transformers_fw import TransformersFramework
    from adaptcheck.steps.frameworks.streaming import StreamedTransformers

    if plan is None:
        plan = reference_plan(model, reference_memory, (dtype,))
    fw = (StreamedTransformers(plan.held_layers or 1) if plan.mode == "streamed" else TransformersFramework())
    fw.load(LoadOptions(model_path=reference_path(model), dtype=plan.dtype), "cpu")
    activations = model.synthetic.get("activation_quant") if model.synthetic else None
    if isinstance(activations, str):
        # A W8A8 checkpoint quantizes every Linear's input as it runs: so does its reference.
        from adaptcheck.frameworks.synthetic_families.quantized import quantize_activations_like

        quantize_activations_like(fw.model, activations)
    return fw


def run_record(fw: Any, plan: Plan, seconds: float, **extra: Any) -> ReferenceRun:
    """How ``fw`` ran under ``plan`` (its streaming figures where it streamed)."""
    from adaptcheck.steps.frameworks.streaming import tensor_bytes

    streamer = getattr(fw, "streamer", None)
    if streamer is None:
        return ReferenceRun(mode="in_memory", dtype=plan.dtype, budget_bytes=plan.budget,
                            peak_bytes=tensor_bytes(fw.model) if fw.model is not None else None,
                            seconds=round(seconds, 3), **extra)
    s = streamer.stats
    return ReferenceRun(mode="streamed", dtype=plan.dtype, budget_bytes=plan.budget, peak_bytes=s.peak_bytes,
                        layers=s.layers, held_layers=s.held_layers, bytes_read=s.bytes_read,
                        load_s=round(s.load_s, 3), seconds=round(seconds, 3), **extra)


def teacher_data(model: ResolvedModel, requests: list[GenRequest], cache_dir: Path, top_k: int,
                 reference_memory: int | None = None) -> TeacherData:
    """Greedy float64 answers to ``requests`` as each gets it alone (drafted in batches, every
    token proven alone: :func:`_greedy_alone`) and their teacher-forced scores; cached in ``cache_dir``.
    ``reference_memory``: ``--reference-memory`` (None: half of the free memory)."""
    plan = reference_plan(model, reference_memory)
    dtype = plan.dtype
    path = cache_dir / f"teacher-{_key(model, requests, dtype)}-k{top_k}.json"
    data = _cached(path)
    if isinstance(data, dict):
        try:
            gens = [load_generation(g) for g in data["generations"]]
            run = ReferenceRun.model_validate({**(data.get("run") or {}), "cached": True})
            return TeacherData(dtype=dtype, attention=data.get("attention"), generations=gens,
                               sequences=_sequences(gens, top_k), scores=[load_scored(x) for x in data["scores"]],
                               run=run)
        except (KeyError, TypeError, ValueError):
            pass
    start = time.perf_counter()
    fw = cpu_transformers(model, dtype, plan=plan)
    try:
        gens, scores, how = _greedy_alone(fw, requests, top_k)
        seqs = _sequences(gens, top_k)
        attention = fw.attn_implementation()
        run = run_record(fw, plan, time.perf_counter() - start, generation="reference generates")
    finally:
        fw.shutdown()
    _store(path, {"generations": [asdict(g) for g in gens], "scores": [asdict(x) for x in scores],
                  "attention": attention, "sequences": [asdict(x) for x in seqs], "dtype": dtype, "generation": how,
                  "run": run.dump()})
    return TeacherData(dtype=dtype, attention=attention, generations=gens, sequences=seqs, scores=scores, run=run)


GROUP_PAD_TOKENS = 32
"""Most left padding a request may get in a batch of the reference's greedy drafts (prompts
within this many tokens of each other share a batch; the long prompt goes alone)."""
GROUP_SIZE = 8
TIE_NATS = 1e-9
"""A draft token whose float64 logprob is this close to the row's maximum is a greedy choice
(float64 rounding between a batched and a single-sequence forward is ~1e-15)."""


class DraftReport(TypedDict):
    """How the reference's answers were generated (the teacher cache file's ``generation``)."""

    drafted_in_batches: list[int]
    regenerated_alone: int
    verified: str


def _greedy_alone(fw: Any, requests: list[GenRequest], top_k: int) -> tuple[list[Generation], list[Scored], DraftReport]:
    """Each request's greedy float64 answer *alone*, and its teacher-forced scores — the answers
    drafted in batches, then proven to be the single-request ones.

    Why: the reference decodes token by token in float64, whose step is memory-bound on the
    weights (8 bytes per parameter); answering the requests one at a time read all weights once
    per token per request, 288 steps for the 9 requests of a quick ladder on the 30-layer default
    model, the largest single cost of step 4 (issue 27, "Time"). A batch reads them once per
    step for all its rows.

    What keeps it the single-request answer: greedy decoding *is* "each token is the argmax of
    the distribution given everything before it". The scores are computed as before, one
    sequence per forward pass (alone, no padding), and cover every generated position. So a
    drafted answer whose every token is the argmax of its own alone float64 distribution (to
    :data:`TIE_NATS`), and that ended as the request says (EOS argmax, or ``max_tokens``), is
    exactly the answer the request gets alone; its logprobs are then taken from those alone
    scores. A draft that fails (a batching or padding defect, a float64 tie) is generated again
    alone, as before. Requests with stop strings or ``ignore_eos`` are generated alone.
    """
    drafts: dict[int, Generation] = {}
    batchable = [i for i, r in enumerate(requests) if not r.stop and not r.ignore_eos and r.logprobs <= top_k]
    lengths = {i: len(fw._prompt_ids(requests[i])) for i in batchable}  # the adapter's own prompt ids
    groups: list[list[int]] = []
    for i in sorted(batchable, key=lambda j: (lengths[j], j)):
        if groups and len(groups[-1]) < GROUP_SIZE and lengths[i] - lengths[groups[-1][0]] <= GROUP_PAD_TOKENS:
            groups[-1].append(i)
        else:
            groups.append([i])
    for group in groups:
        for i, g in zip(group, fw.generate([requests[i] for i in group]), strict=True):
            drafts[i] = g
    gens: list[Generation] = []
    scores: list[Scored] = []
    redone = 0
    for i, req in enumerate(requests):
        g = drafts.get(i)
        if g is None:
            g = fw.generate([req])[0]
        score = _score_one(fw, g, top_k)
        if i in drafts and not _is_greedy(g, req, score, fw):
            redone += 1
            g = fw.generate([req])[0]
            score = _score_one(fw, g, top_k)
        elif i in drafts and req.logprobs and score is not None:
            g = _with_alone_logprobs(g, score, req.logprobs)
        gens.append(g)
        if score is not None:
            scores.append(score)
    how = DraftReport(drafted_in_batches=[len(x) for x in groups if len(x) > 1], regenerated_alone=redone,
                      verified="every drafted token is the argmax of its single-sequence float64 distribution")
    return gens, scores, how


def _score_one(fw: Any, g: Generation, top_k: int) -> Scored | None:
    """The teacher-forced score of one answer, alone (None for an answer _sequences leaves out)."""
    seqs = _sequences([g], top_k)
    return fw.score(seqs)[0] if seqs else None


def _is_greedy(g: Generation, req: GenRequest, score: Scored | None, fw: Any) -> bool:
    """Every token of ``g`` is the argmax of its alone float64 row, and it stopped where alone would."""
    tokens = g.token_ids or []
    if score is None or len(score.top_logprobs) != len(tokens) or not tokens:
        return False
    for lp, row in zip(score.token_logprobs, score.top_logprobs, strict=True):
        if lp < max(row.values()) - TIE_NATS:
            return False
    eos = set(fw._eos_ids())
    ended_eos = tokens[-1] in eos
    if g.finish_reason == "stop":
        return ended_eos and all(t not in eos for t in tokens[:-1])
    return len(tokens) == req.max_tokens and not any(t in eos for t in tokens)


def _with_alone_logprobs(g: Generation, score: Scored, n: int) -> Generation:
    """``g`` with its per-position top-``n`` logprobs from the alone float64 scores (the chosen
    token kept, as generate() keeps it)."""
    tops = []
    for tok, lp, row in zip(g.token_ids or [], score.token_logprobs, score.top_logprobs, strict=True):
        top = dict(sorted(row.items(), key=lambda kv: kv[1], reverse=True)[:n])
        top.setdefault(int(tok), float(lp))
        tops.append(top)
    return Generation(token_ids=g.token_ids, text=g.text, finish_reason=g.finish_reason, prompt_tokens=g.prompt_tokens,
                      completion_tokens=g.completion_tokens, top_logprobs=tops, prompt_ids=g.prompt_ids,
                      extra=dict(g.extra))


@dataclass
class Control:
    """The teacher sequences scored on the CPU at the served dtype, alone (and batched, on request)."""

    dtype: str
    attention: str | None
    alone: list[Scored]
    batched: list[Scored] | None = None
    """All sequences in one left-padded batch; only with ``control_scores(..., batched=True)``."""


def control_scores(model: ResolvedModel, teacher: TeacherData, dtype: str, top_k: int, cache_dir: Path, *,
                   batched: bool = False, reference_memory: int | None = None) -> Control:
    """The healthy control for ``dtype`` (cached in ``cache_dir`` by weights, sequences and K),
    in memory or streamed within ``reference_memory`` as the reference is.

    Every bound of step 4 is a multiple of the control *alone* (cross-framework, same-framework;
    batched-vs-alone holds the framework's batch against its own run alone), so the batched
    control is computed only when asked for: one left-padded batch pads every sequence to the
    longest (the 300-token reference prompt), which cost twice the alone scoring on the 30-layer
    default model (issue 27, "Time") for figures no verdict read.
    """
    blob = json.dumps({"weights": model.weights_sha256, "dtype": dtype, "k": top_k,
                       "seqs": [[s.token_ids, s.start] + ([s.images] if s.images else []) for s in teacher.sequences]})
    path = cache_dir / f"control-{hashlib.sha256(blob.encode()).hexdigest()[:20]}.json"
    data = _cached(path)
    if isinstance(data, dict) and (not batched or data.get("batched") is not None):
        try:
            return Control(dtype=dtype, attention=data.get("attention"), alone=[load_scored(x) for x in data["alone"]],
                           batched=None if data.get("batched") is None else [load_scored(x) for x in data["batched"]])
        except (KeyError, TypeError, ValueError):
            pass
    seqs = [ScoreRequest(token_ids=s.token_ids, start=s.start, top_k=top_k, images=list(s.images))
            for s in teacher.sequences]
    fw = cpu_transformers(model, dtype, reference_memory)
    try:
        alone = [fw.score([s])[0] for s in seqs]
        together = fw.score(seqs) if batched else None
        attention = fw.attn_implementation()
    finally:
        fw.shutdown()
    _store(path, {"alone": [asdict(x) for x in alone],
                  "batched": None if together is None else [asdict(x) for x in together], "attention": attention})
    return Control(dtype=dtype, attention=attention, alone=alone, batched=together)


class _ScoredJson(BaseModel):
    """A cached ``Scored`` as JSON wrote it (token ids turned into strings, read back as ints)."""

    token_logprobs: list[float] = Field(description="Log-probability of each scored token.")
    top_logprobs: list[dict[int, float]] = Field(description="Top alternatives per position.")
    extra: dict[str, JsonValue] | None = Field(default=None, description="How the scores were obtained.")


def load_scored(d: object) -> Scored:
    """A ``Scored`` from its cached JSON form; pydantic's ValidationError (a ValueError) when it is not one."""
    x = _ScoredJson.model_validate(d)
    return Scored(token_logprobs=x.token_logprobs, top_logprobs=x.top_logprobs, extra=dict(x.extra or {}))


def load_generation(d: dict[str, object]) -> Generation:
    """A generation from its JSON form (JSON turned the top-logprob token ids into strings)."""
    g = Generation(**d)  # type: ignore[arg-type]
    if g.top_logprobs is not None:
        g.top_logprobs = [{int(k): float(v) for k, v in row.items()} for row in g.top_logprobs]
    return g
