"""``framework.fp8_kv_cache``: the KV cache stored in fp8 (e4m3, e5m2) against ``auto``, its
distributions held to the float64 reference by an fp8 bound, and proof that fp8 was really stored.

fp8 changes the numerics on purpose, so neither greedy identity with the plain run nor the
same-framework bound is the rule here. Per format, one outcome (``subid`` = the format): the
same prompts on the plain instance and on one loaded with ``kv_cache_dtype``; greedy tokens by the
top-N rule at the first divergence (the visible symptom); the fp8 instance's teacher-forced
scores against the float64 teacher, held to ``model_numerics.fp8_kv_cache`` in tolerances.yaml:
``multiple x control x (1 + kv_share x (u_cache / u_served)^2) + floor`` (:func:`fp8_rules`); and
the cache read back from the engine (its config) and from the worker (every attention layer's
cache tensor: its element size and dtype). Where vLLM refuses fp8 here (no AVX-512/AMX on a CPU,
a head size it cannot tile), the outcome is n/a with vLLM's own sentence. Everything of the kind
lives here (docs/adding-a-check-kind.md); the method and the measured bound: docs/features.md
("FP8 KV cache").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, JsonValue, field_validator

from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.framework_evidence import (
    BoundVerdict,
    DivergenceStats,
    FeatureProof,
    KlHistogram,
    SubcheckRow,
    TeacherForced,
)
from adaptcheck.base.schemas.numerics import Fp8KvCachePolicy, Rule
from adaptcheck.frameworks.base import Framework, GenRequest, ScoringUnsupported
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import divergence as dv
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.device_generates import teacher_for
from adaptcheck.steps.frameworks.feature import FeatureParams, Proof, engine_row, facts_of, feature_vs_plain
from adaptcheck.steps.frameworks.lifecycle import Active, framework_dir
from adaptcheck.steps.frameworks.probes import TOP_K, local_tokenizer, not_applicable, reference_requests, subcheck
from adaptcheck.steps.frameworks.reference import ReferenceUnavailable, control_scores

CacheDtype = Literal["fp8_e4m3", "fp8_e5m2"]
FORMATS: tuple[CacheDtype, ...] = ("fp8_e4m3", "fp8_e5m2")

UNIT_ROUNDOFF: dict[str, float] = {
    "fp8_e4m3": 2.0 ** -4,  # 3 stored mantissa bits
    "fp8_e5m2": 2.0 ** -3,  # 2 stored mantissa bits
    "bf16": 2.0 ** -8,
    "fp16": 2.0 ** -11,
    "fp32": 2.0 ** -24,
}
"""Relative rounding error of round-to-nearest, half an ulp at 1 (2^-p, p the significand bits)."""

TF_ROW = "teacher-forced distributions vs float64 reference"


class Fp8KvCacheParams(FeatureParams):
    """``framework.fp8_kv_cache``: which fp8 formats, each against ``auto``."""

    formats: list[CacheDtype] = Field(default_factory=lambda: list(FORMATS), min_length=1,
                                      description="KV-cache formats, each compared with 'auto' in an outcome of its "
                                                  "own (fp8_e4m3, fp8_e5m2).")

    @field_validator("formats")
    @classmethod
    def _once_each(cls, v: list[CacheDtype]) -> list[CacheDtype]:
        if len(set(v)) != len(v):
            raise ValueError(f"formats lists a format twice: {v}; give each once")
        return v

    @field_validator("engine_args")
    @classmethod
    def _cache_dtype_is_ours(cls, v: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if "kv_cache_dtype" in v:
            raise ValueError("engine_args.kv_cache_dtype is set by framework.fp8_kv_cache itself (the plain instance "
                             "is 'auto'); list the fp8 formats in 'formats' instead")
        return v


class Fp8KvCacheCheck(FrameworkCheck):
    """fp8 KV cache vs auto: fp8 really stored, greedy answers by the top-N rule, and the fp8
    instance's distributions within the fp8 bound of the float64 reference."""

    kind = "framework.fp8_kv_cache"
    step = 4
    description = ("FP8 KV cache (e4m3, e5m2) vs auto: the cache is really fp8, and the distributions stay within "
                   "the fp8 bound of the float64 reference.")
    params_model = Fp8KvCacheParams
    label = "FP8 KV cache vs auto"
    compares = "KV cache auto vs fp8"
    typical_s = 60.0

    def run(self, ctx: CheckContext, params: Fp8KvCacheParams) -> list[Outcome]:
        cls = framework_class(params.framework)
        accepted = cls.accepted_engine_args()
        if accepted is not None and "kv_cache_dtype" not in accepted:
            why = f"{cls.display_name} takes no kv_cache_dtype engine argument"
            return [not_applicable(params, why).model_copy(update={"subid": f}) for f in params.formats]
        return [_one_format(ctx, params, f).model_copy(update={"subid": f}) for f in params.formats]


# ------------------------------------------------------------------------- the bound --

def fp8_scale(policy: Fp8KvCachePolicy, cache: str, served: str) -> float:
    """``1 + kv_share x (u_cache / u_served)^2``: the control's KL grown to what fp8 storage of K
    and V adds (KL is quadratic in a small perturbation, so it grows with the roundoff squared)."""
    if cache not in UNIT_ROUNDOFF or served not in UNIT_ROUNDOFF:
        raise KeyError(f"no unit roundoff for {cache!r} or {served!r}")
    return 1.0 + policy.kv_share * (UNIT_ROUNDOFF[cache] / UNIT_ROUNDOFF[served]) ** 2


def fp8_rules(policy: Fp8KvCachePolicy, cache: str, served: str) -> dict[str, Rule]:
    """The fp8 bound as ordinary rules (``multiple x control + floor``): the multiple carries the
    fp8 scale, so the verdict and the report read like every other step-4 bound."""
    scale = fp8_scale(policy, cache, served)
    return {stat: Rule(multiple=rule.multiple * scale, floor=rule.floor, reason=rule.reason)
            for stat, rule in policy.bounds.items()}


def describe_bounds(judged: dict[str, BoundVerdict], policy: Fp8KvCachePolicy, cache: str, served: str) -> str:
    """One line: each statistic against its bound, and how the bound was made."""
    scale = fp8_scale(policy, cache, served)
    ratio = UNIT_ROUNDOFF[cache] / UNIT_ROUNDOFF[served]
    parts = [f"{stat} {v.value:.3g} {'<=' if v.ok else '>'} {v.bound:.3g}" for stat, v in judged.items()]
    return ("; ".join(parts) + f" (bound: {policy.bounds['kl_mean'].multiple:g} x control x (1 + {policy.kv_share:g} x "
            f"{ratio:g}^2 = {scale:.4g}) + floor; control kl_mean {judged['kl_mean'].control:.3g})"
            if "kl_mean" in judged else "; ".join(parts))


# ------------------------------------------------------------------------ one format --

def _one_format(ctx: CheckContext, p: Fp8KvCacheParams, cache: CacheDtype) -> Outcome:
    found: dict[str, Any] = {}

    def tf_rows(active: Active) -> list[SubcheckRow]:
        row, record, metrics = against_reference(ctx, active, p, cache)
        found.update(record=record, metrics=metrics)
        return [row]

    outcome = feature_vs_plain(
        ctx, p, f"{cache} KV cache", {"engine_args": {"kv_cache_dtype": cache}}, lambda active: _requests(p),
        lambda active, deltas: prove(active, cache), names=("auto KV cache", f"{cache} KV cache"),
        extra_rows=tf_rows, distributions=False, refused=lambda exc: vllm_refusal(exc, cache))
    # The fp8 instance's teacher-forced record, beside the comparison feature_vs_plain wrote.
    if "record" in found:
        outcome.details["teacher_forced"] = found["record"]
        outcome.metrics.update(found["metrics"])
    return outcome


def _requests(p: Fp8KvCacheParams) -> list[GenRequest]:
    return [GenRequest(prompt=t, max_tokens=p.max_tokens, logprobs=p.top_n)
            for t in (prompts.SHORT_PROMPTS * 4)[: p.prompts]]


def vllm_refusal(exc: BaseException, cache: str) -> str | None:
    """vLLM's own sentence when it cannot store an fp8 KV cache here (it raises
    NotImplementedError: no AVX-512/AMX on a CPU, a head size not a multiple of 32 …), else None.

    The load's exception chain holds vLLM's exception; a load that failed earlier in the run
    is known only by its recorded line (``<type>: <message>``), read the same way.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NotImplementedError):
            said = str(seen).strip().splitlines()
            return f"{cache} KV cache cannot run here; vLLM says: {said[0] if said else 'not implemented'}"
        seen = seen.__cause__ or seen.__context__
    marker = "NotImplementedError: "
    text = str(exc)
    if marker in text:
        return f"{cache} KV cache cannot run here; vLLM says: {text.split(marker, 1)[1].splitlines()[0].strip()}"
    return None


# ---------------------------------------------------------------- proof of activity --

def kv_cache_layers(model: Any) -> list[dict[str, JsonValue]]:
    """In the worker (``LLM.apply_model``): each attention layer's bound KV-cache tensor, as stored."""
    import torch

    out: list[dict[str, JsonValue]] = []
    for name, module in model.named_modules():
        cache = getattr(module, "kv_cache", None)
        declared = getattr(module, "kv_cache_dtype", None)
        if not isinstance(cache, torch.Tensor) or not isinstance(declared, str) or cache.numel() == 0:
            continue
        try:
            written: int | None = int(torch.count_nonzero(cache.view(torch.uint8)))
        except RuntimeError:  # a layout that cannot be viewed as bytes: the other facts stand
            written = None
        impl = getattr(module, "impl", None)
        out.append({"layer": name, "declared": declared, "storage": str(cache.dtype).replace("torch.", ""),
                    "element_bytes": cache.element_size(), "backend": getattr(impl, "kv_cache_dtype", None),
                    "k_scale": _float(getattr(module, "_k_scale_float", None)),
                    "v_scale": _float(getattr(module, "_v_scale_float", None)), "bytes_written": written})
    return out


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def worker_layers(fw: Framework) -> list[dict[str, JsonValue]] | str:
    """:func:`kv_cache_layers` of an in-process vLLM (first worker), or why it cannot be read."""
    llm = getattr(fw, "llm", None)
    if llm is None or not hasattr(llm, "apply_model"):
        return f"{fw.display_name} runs its engine outside this process: its cache tensors cannot be read"
    try:
        return list(llm.apply_model(kv_cache_layers)[0])
    except Exception as exc:  # noqa: BLE001 - evidence; the engine's config still speaks
        return f"reading the cache tensors failed: {exception_line(exc)}"


def judge_activity(cache: str, facts: dict[str, JsonValue], layers: list[dict[str, JsonValue]] | str) -> tuple[bool, str]:
    """Whether the engine's config and the worker's tensors both show ``cache`` in use (pure).

    What counts: the engine resolved ``kv_cache_dtype`` to the format; every attention layer
    declares it, its backend stores it, its cache elements are one byte, and the compared
    requests wrote into it. Either source may be unreadable (a served engine has no tensors
    here), never both.
    """
    problems: list[str] = []
    said: list[str] = []
    engine = facts.get("kv_cache_dtype")
    if engine is not None:
        said.append(f"engine kv_cache_dtype {engine!r}")
        if engine != cache:
            problems.append(f"the engine resolved kv_cache_dtype {engine!r}, not {cache!r}")
    if isinstance(layers, str):
        said.append(layers)
    elif not layers:
        said.append("no attention layer with a bound KV cache was found in the worker")
        problems.append("no KV-cache tensor to read")
    else:
        bad = [f"{x['layer']}: declared {x['declared']!r}, backend {x['backend']!r}, {x['storage']} "
               f"({x['element_bytes']} byte(s) per element)" for x in layers
               if x["declared"] != cache or x["backend"] not in (None, cache) or x["element_bytes"] != 1]
        written = [x["bytes_written"] for x in layers if isinstance(x["bytes_written"], int)]
        first = layers[0]
        said.append(f"{len(layers)} attention layers store {first['storage']} at {first['element_bytes']} byte(s) per "
                    f"element ({first['backend']} in the backend), k/v scale {first['k_scale']}/{first['v_scale']}"
                    + (f", {sum(written):,} cache bytes written" if written else ""))
        if bad:
            problems.append(f"{len(bad)}/{len(layers)} layers do not store {cache}: {bad[0]}")
        if written and sum(written) == 0:
            problems.append("nothing was written into the cache")
    if engine is None and isinstance(layers, str):
        problems.append("neither the engine's config nor its cache tensors could be read")
    how = "; ".join(s for s in said if s)
    return not problems, how + (": " + "; ".join(problems) if problems else "")


def prove(active: Active, cache: str) -> Proof:
    """The fp8 instance's cache read back: its config (engine facts) and its tensors (worker)."""
    facts = facts_of(active)
    layers = worker_layers(active.framework)
    ok, how = judge_activity(cache, facts, layers)
    # Evidence models keep extra fields: the per-layer tensors ride along as ``layers``.
    record = FeatureProof.model_validate({"feature": "fp8_kv_cache", "active": ok, "how": how, "engine": facts,
                                          **({"layers": layers} if not isinstance(layers, str) else {})})
    metrics: dict[str, float | str | None] = {"kv_cache_blocks": _number(facts.get("num_gpu_blocks"))}
    if not isinstance(layers, str) and layers:
        metrics["kv_cache_element_bytes"] = _number(layers[0]["element_bytes"])
    return Proof(rows=[engine_row(f"{cache} KV cache", ok, how)], record=record, metrics=metrics)


def _number(x: JsonValue) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


# ---------------------------------------------------------- against the float64 teacher --

def against_reference(ctx: CheckContext, active: Active, p: Fp8KvCacheParams,
                      cache: str) -> tuple[SubcheckRow, dict[str, Any] | None, dict[str, float | str | None]]:
    """The fp8 instance's teacher-forced scores vs the float64 teacher, under the fp8 bound:
    (row, details["teacher_forced"] as JSON or None, metrics)."""
    name = f"{TF_ROW} ({cache} KV cache)"
    policy = load_numerics()
    if policy.fp8_kv_cache is None:
        return subcheck(name, False, "tolerances.yaml has no model_numerics.fp8_kv_cache section: add the fp8 "
                                     "bound (docs/features.md)"), None, {}
    tok = local_tokenizer(active)
    if tok.hf is None:
        return subcheck(name, None, "no local copy of the served weights, so no float64 reference"), None, {}
    reqs = reference_requests(tok, p.teacher, ctx.seed)
    try:
        teacher, _device = teacher_for(ctx, active, reqs, policy.reference_top_k)
    except ReferenceUnavailable as exc:
        return subcheck(name, None, str(exc)), None, {}
    dtype = active.options.dtype
    control = control_scores(active.model, teacher, dtype, TOP_K, framework_dir(ctx),
                             reference_memory=ctx.reference_memory)
    try:
        dev = tf_rules.score_alone(active.framework, teacher.sequences, TOP_K)
    except ScoringUnsupported as exc:
        return subcheck(name, None, f"not possible here: {exc}"), None, {}
    fp8 = policy.fp8_kv_cache
    ok, judged, dev_pos, ctl_pos = tf_rules.judge_scores(teacher.scores, dev, control.alone,
                                                         fp8_rules(fp8, cache, dtype), dtype)
    dev_sum, ctl_sum = dv.summarize(dev_pos), dv.summarize(ctl_pos)
    record = TeacherForced(
        method=tf_rules.TEACHER_FORCED, fallback_reason=None, top_k=TOP_K,
        reference=f"transformers {teacher.dtype} on cpu (attention {teacher.attention})",
        control=f"transformers {dtype} on cpu (attention {control.attention})",
        sequences=len(teacher.sequences), positions=int(dev_sum["positions"]),
        device=DivergenceStats.model_validate(dev_sum), control_stats=DivergenceStats.model_validate(ctl_sum),
        bounds=judged, localisation=None,
        histogram=KlHistogram(edges=dv.HIST_EDGES, device=dv.histogram(dev_pos.kl), control=dv.histogram(ctl_pos.kl)),
    )
    detail = (f"{dev_sum['positions']} positions of {len(teacher.sequences)} sequences, top-{TOP_K}: "
              + describe_bounds(judged, fp8, cache, dtype)
              + f"; same top token {dev_sum['same_top_rate']:.1%} (control {ctl_sum['same_top_rate']:.1%})")
    mean_bound = judged["kl_mean"].bound if "kl_mean" in judged else None
    metrics: dict[str, float | str | None] = {
        "tf_kl_mean": dev_sum["kl_mean"], "tf_kl_p99": dev_sum["kl_p99"], "tf_kl_max": dev_sum["kl_max"],
        "control_kl_mean": ctl_sum["kl_mean"], "control_kl_p99": ctl_sum["kl_p99"],
        "fp8_scale": fp8_scale(fp8, cache, dtype),
        "tf_kl_mean_x_control": dev_sum["kl_mean"] / ctl_sum["kl_mean"] if ctl_sum["kl_mean"] else None,
        "tf_kl_mean_of_bound": dev_sum["kl_mean"] / mean_bound if mean_bound else None,
    }
    return subcheck(name, ok, detail), record.dump(), metrics

