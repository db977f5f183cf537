"""Step 4's teacher-forced verdicts: a framework's distributions against the float64 reference,
and two runs of one framework against each other (method and bounds: docs/step4-numerics.md).

Each verdict is built as its typed record (:mod:`adaptcheck.base.schemas.framework_evidence`);
the functions the kinds call (``steps/frameworks/kinds``) return those records' JSON form, as the
details store them; the ``*_verdict`` functions beside them return the records themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from adaptcheck.base.schemas.framework_evidence import (
    BatchedVsAlone,
    BoundVerdict,
    Distribution,
    DivergenceStats,
    InstanceFacts,
    KlHistogram,
    Localisation,
    SubcheckRow,
    TeacherForced,
)
from adaptcheck.base.schemas.numerics import ModelNumericsPolicy, Rule
from adaptcheck.frameworks.base import (
    Framework,
    Generation,
    Scored,
    ScoreRequest,
)
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.frameworks import divergence as dv
from adaptcheck.steps.frameworks.lifecycle import Active, framework_dir
from adaptcheck.steps.frameworks.reference import Control, TeacherData, control_scores

TEACHER_FORCED = "teacher_forced"
GREEDY_FALLBACK = "greedy_fallback"


def _stats(ref: list[Scored], dev: list[Scored]) -> dv.PositionStats:
    out = dv.PositionStats([], [], [])
    for a, b in zip(ref, dev, strict=False):
        out.extend(dv.compare_positions(a.top_logprobs, a.token_logprobs, b.top_logprobs, b.token_logprobs))
    return out


def _fmt(judged: dict[str, BoundVerdict]) -> str:
    return "; ".join(f"{stat} {v.value:.3g} {'<=' if v.ok else '>'} {v.bound:.3g} "
                     f"({v.multiple:g} x control {v.control:.3g} + {v.floor:g})" for stat, v in judged.items())


def _held(judged: dict[str, BoundVerdict]) -> bool:
    return all(v.ok for v in judged.values())


def score_alone(fw: Framework, seqs: list[ScoreRequest], top_k: int) -> list[Scored]:
    """Each sequence scored in a request of its own (no batching effects)."""
    return [fw.score([ScoreRequest(s.token_ids, s.start, top_k, list(s.images))])[0] for s in seqs]


def against_reference(ctx: CheckContext, active: Active, teacher: TeacherData, policy: ModelNumericsPolicy,
                      top_k: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """(verdict row, details["teacher_forced"], metrics) as JSON: :func:`reference_verdict`'s records."""
    row, record, metrics = reference_verdict(ctx, active, teacher, policy, top_k)
    return row.dump(), record.dump(), metrics


def reference_verdict(ctx: CheckContext, active: Active, teacher: TeacherData, policy: ModelNumericsPolicy,
                      top_k: int) -> tuple[SubcheckRow, TeacherForced, dict[str, float]]:
    """The framework's teacher-forced scores against the reference, held to the cross-framework
    bounds relative to the CPU control; a failure localised where the model runs in this
    process. (verdict row, details["teacher_forced"], metrics). Raises ScoringUnsupported."""
    fw, dtype = active.framework, active.options.dtype
    dev = score_alone(fw, teacher.sequences, top_k)
    control = control_scores(active.model, teacher, dtype, top_k, framework_dir(ctx),
                             reference_memory=ctx.reference_memory)
    ok, judged, dev_pos, ctl_pos = judge_scores(teacher.scores, dev, control.alone, {str(k): v for k, v in policy.cross_framework.items()}, dtype)
    dev_sum, ctl_sum = dv.summarize(dev_pos), dv.summarize(ctl_pos)
    record = TeacherForced(
        method=TEACHER_FORCED, fallback_reason=None, top_k=top_k,
        reference=f"transformers {teacher.dtype} on cpu (attention {teacher.attention})" + how_reference_ran(teacher),
        control=f"transformers {dtype} on cpu (attention {control.attention})",
        sequences=len(teacher.sequences), positions=int(dev_sum["positions"]),
        device=DivergenceStats.model_validate(dev_sum), control_stats=DivergenceStats.model_validate(ctl_sum),
        bounds=judged,
        histogram=KlHistogram(edges=dv.HIST_EDGES, device=dv.histogram(dev_pos.kl), control=dv.histogram(ctl_pos.kl)),
        # The adapter's free-form answer, as JSON (a plugin's tuple becomes a list, as stored before).
        localisation=None, implementations=to_jsonable_python(fw.implementations()),
        worst_sequence=_worst(dev, teacher), reference_run=teacher.run,
    )
    metrics = {"tf_kl_mean": dev_sum["kl_mean"], "tf_kl_p99": dev_sum["kl_p99"], "tf_kl_max": dev_sum["kl_max"],
               "tf_dlogprob_max": dev_sum["dlogprob_max"], "tf_same_top_rate": dev_sum["same_top_rate"],
               "control_kl_mean": ctl_sum["kl_mean"], "control_kl_p99": ctl_sum["kl_p99"]}
    detail = (f"{dev_sum['positions']} positions of {len(teacher.sequences)} sequences, top-{top_k}: " + _fmt(judged)
              + f"; same top token {dev_sum['same_top_rate']:.1%} (control {ctl_sum['same_top_rate']:.1%})")
    if not ok:
        if fw.torch_model() is not None:
            record.localisation = _localise(active, teacher, record.worst_sequence or 0, policy, top_k,
                                            ctx.reference_memory)
            from adaptcheck.steps.frameworks.localise import describe

            detail += f"; first departing module: {describe(record.localisation)}"
        else:
            record.localisation = Localisation(module=None, table=[],
                                               reason=f"{fw.display_name} runs its model outside this process: "
                                                      "no forward hooks (see the reproducer)")
    return SubcheckRow(name="teacher-forced distributions vs float64 reference", ok=ok, detail=detail), record, metrics


def judge_scores(ref: list[Scored], dev: list[Scored], control: list[Scored], rules: Mapping[str, Rule],
                 dtype: str) -> tuple[bool, dict[str, BoundVerdict], dv.PositionStats, dv.PositionStats]:
    """The cross-framework verdict: device and control against the reference, every position."""
    dev_pos, ctl_pos = _stats(ref, dev), _stats(ref, control)
    judged = dv.judge(dv.summarize(dev_pos), dv.summarize(ctl_pos), rules, dtype)
    return _held(judged), judged, dev_pos, ctl_pos


def _worst(dev: list[Scored], teacher: TeacherData) -> int:
    """Index of the sequence with the largest mean KL (the one localisation and repro use)."""
    means = [sum(s.kl) / max(1, len(s.kl)) for s in (_stats([r], [d]) for r, d in zip(teacher.scores, dev, strict=False))]
    return max(range(len(means)), key=means.__getitem__) if means else 0


def how_reference_ran(teacher: TeacherData) -> str:
    """", streamed a layer at a time" / "; device generates, reference scores" where not the default
    (appended to the reference in words)."""
    run = teacher.run
    if run is None:
        return ""
    streamed = ", streamed a layer at a time" if run.mode == "streamed" else ""
    device = f"; {run.generation}" if run.generation and run.generation != "reference generates" else ""
    return streamed + device


def _localise(active: Active, teacher: TeacherData, index: int, policy: ModelNumericsPolicy, top_k: int,
              reference_memory: int | None = None) -> Localisation:
    from adaptcheck.steps.frameworks import localise
    from adaptcheck.steps.frameworks.reference import cpu_transformers

    seq = teacher.sequences[index]
    seq = ScoreRequest(seq.token_ids, seq.start, top_k, list(seq.images))
    try:
        device = localise.trace(active.framework, seq)
        sides = []
        for dtype in (teacher.dtype, active.options.dtype):  # the reference, then the control
            side = cpu_transformers(active.model, dtype, reference_memory)
            try:
                sides.append(localise.trace(side, seq))
            finally:
                side.shutdown()
        ref_events, ctl_events = sides
        result = localise.first_departure(device, ref_events, ctl_events, policy.localisation, active.options.dtype)
    except Exception as exc:  # noqa: BLE001 - localisation is extra evidence; the verdict stands without it
        return Localisation(module=None, table=[], reason=f"localisation failed: {type(exc).__name__}: {exc}")
    result.sequence = index
    return result


def greedy_fallback(reason: str) -> dict[str, Any]:
    """details["teacher_forced"] (JSON) for a framework that cannot score a given sequence."""
    return TeacherForced(method=GREEDY_FALLBACK, fallback_reason=reason, localisation=None).dump()


def same_framework_row(name: str, first: list[Scored], second: list[Scored], control_sum: dict[str, float] | None,
                       policy: ModelNumericsPolicy, dtype: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(row, details["distribution"]) as JSON: :func:`same_framework_verdict`'s records."""
    row, record = same_framework_verdict(name, first, second, control_sum, policy, dtype)
    return row.dump(), record.dump()


def same_framework_verdict(name: str, first: list[Scored], second: list[Scored], control_sum: dict[str, float] | None,
                           policy: ModelNumericsPolicy, dtype: str) -> tuple[SubcheckRow, Distribution]:
    """Two runs of one framework, position by position, under the same-framework rule."""
    summ = dv.summarize(_stats(first, second))
    if control_sum is None:
        return (SubcheckRow(name=name, ok=None, detail="no CPU control for this model (no local weights), so no bound"),
                Distribution.model_validate({**summ, "ok": None}))
    judged = dv.judge(summ, control_sum, {str(k): v for k, v in policy.same_framework.items()}, dtype)
    ok = _held(judged)
    detail = f"{summ['positions']} positions: " + _fmt(judged)
    return (SubcheckRow(name=name, ok=ok, detail=detail),
            Distribution.model_validate({**summ, "bounds": judged, "ok": ok}))


def batched_vs_alone_row(name: str, ref: list[Scored], alone: list[Scored], together: list[Scored],
                         policy: ModelNumericsPolicy, dtype: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(row, details["distribution"]["vs_reference"]) as JSON: :func:`batched_vs_alone_verdict`'s records."""
    row, record = batched_vs_alone_verdict(name, ref, alone, together, policy, dtype)
    return row.dump(), record.dump()


def batched_vs_alone_verdict(name: str, ref: list[Scored], alone: list[Scored], together: list[Scored],
                             policy: ModelNumericsPolicy, dtype: str) -> tuple[SubcheckRow, BatchedVsAlone]:
    """The batched run's divergence from the float64 reference, held to the same framework's
    divergence alone (``model_numerics.batched_vs_alone``; why each side against float64 and
    not the two runs against each other: docs/step4-numerics.md)."""
    alone_sum, batched_sum = dv.summarize(_stats(ref, alone)), dv.summarize(_stats(ref, together))
    judged = dv.judge(batched_sum, alone_sum, {str(k): v for k, v in policy.batched_vs_alone.items()}, dtype)
    ok = _held(judged)
    detail = (f"{batched_sum['positions']} positions, batched vs float64 against alone vs float64: "
              + _fmt(judged).replace("x control", "x alone"))
    return (SubcheckRow(name=name, ok=ok, detail=detail),
            BatchedVsAlone(alone=DivergenceStats.model_validate(alone_sum),
                           batched=DivergenceStats.model_validate(batched_sum), bounds=judged, ok=ok))


def common_prefix_scores(a: list[Generation], b: list[Generation]) -> tuple[list[Scored], list[Scored]]:
    """The positions two greedy runs share (same tokens so far: same conditioning), as scores."""
    sa: list[Scored] = []
    sb: list[Scored] = []
    for x, y in zip(a, b, strict=False):
        if not x.token_ids or not y.token_ids or not x.top_logprobs or not y.top_logprobs:
            continue
        n = 0
        while n < min(len(x.token_ids), len(y.token_ids)) and x.token_ids[n] == y.token_ids[n]:
            n += 1
        n = min(n, len(x.top_logprobs), len(y.top_logprobs))
        tops_a, tops_b = x.top_logprobs[:n], y.top_logprobs[:n]
        toks = x.token_ids[:n]
        sa.append(Scored([t.get(k, min(t.values())) for t, k in zip(tops_a, toks, strict=False)], tops_a))
        sb.append(Scored([t.get(k, min(t.values())) for t, k in zip(tops_b, toks, strict=False)], tops_b))
    return sa, sb


def control_summary(control: Control, teacher: TeacherData) -> dict[str, float]:
    """The control's own divergence from the reference (the same-framework rule's scale)."""
    return dv.summarize(_stats(teacher.scores, control.alone))


def write_repro(ctx: CheckContext, active: Active, teacher: TeacherData, details: Mapping[str, object], top_k: int,
                reference_top_k: int) -> str | None:
    """The standalone reproducer of a failing comparison; its path relative to the run folder.

    ``details`` is details["teacher_forced"] as the probe holds it (JSON), read as its record.
    """
    from adaptcheck.repro.model import ModelReproSpec, ReproSequence, write_model_repro

    record = TeacherForced.model_validate(details)
    fw = active.framework
    facts = InstanceFacts.model_validate(fw.describe())
    bounds = record.bounds or {}
    device = record.device or DivergenceStats()
    spec = ModelReproSpec(
        # The adapter's registry name: a plugin or subclass of the transformers adapter
        # reproduces as transformers (the script cannot import the plugin).
        framework=fw.name, model_path=str(active.model.path), dtype=active.options.dtype,
        device=str(ctx.device), attn_implementation=facts.attention,
        sequences=[ReproSequence(token_ids=s.token_ids, start=s.start) for s in teacher.sequences],
        top_k=top_k, bound_kl_mean=_bound(bounds, "kl_mean"), bound_kl_p99=_bound(bounds, "kl_p99"),
        observed_kl_mean=float(device.kl_mean or 0.0), observed_kl_p99=float(device.kl_p99 or 0.0),
        endpoint_url=facts.url if fw.name == "endpoint" else None,
        served_model=facts.served_model, reference_top_k=reference_top_k, reference_dtype=teacher.dtype,
        reference_attn_implementation=teacher.attention,
    )
    path: Path = write_model_repro(ctx.run_dir, ctx.check_id, spec)
    return str(path.relative_to(ctx.run_dir)) if path.is_relative_to(ctx.run_dir) else str(path)


def _bound(bounds: dict[str, BoundVerdict], stat: str) -> float:
    """A statistic's bound for the reproducer (0 when the verdict did not bound it)."""
    verdict = bounds.get(stat)
    return float(verdict.bound) if verdict is not None and verdict.bound is not None else 0.0
