"""``framework.long_context``: a prompt near the context limit answers like the float64 reference,
one past the limit is refused cleanly (and the engine keeps serving), and chunked prefill gives
the same distributions as prefilling the prompt in one step.

The prompt is ``max_model_len - max_tokens - margin`` tokens of the instance's own context
length. It is compared twice: on the plain shared instance against an instance whose token
budget per step (vLLM's ``max_num_batched_tokens``) is smaller than the prompt, so its prefill
is split into chunks, by the same-framework rules; and on the chunked instance, teacher-forced
against the float64 reference. The chunks are proven from the engine, not assumed: chunked
prefill on and a budget below the prompt in the resolved config, and (in process) the
scheduler's own per-step token counts for the prompt. An over-length request must fail as a
request (in process a ``ValueError``; served a 4xx with a message), and the next request answer.
Docs: docs/features.md "Long context and chunked prefill"; the shared body is
:mod:`adaptcheck.steps.frameworks.feature`.

Under ``--serve`` the instance is the deployment's (:func:`~adaptcheck.steps.frameworks.lifecycle.acquire`
loads its engine arguments), so the prompt follows the deployment's ``max_model_len``: the length is
read from the loaded instance, never from the ladder. ``chunked: false`` keeps only the near-limit
and over-length rows on the shared instance (no second engine), and ``deployment_only: true`` runs
the check only for a ``--serve`` deployment: together they are the quick ladder's cheap
"near max_model_len as deployed" check (docs/features.md, "KV-cache capacity").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.framework_evidence import FeatureProof, SubcheckRow
from adaptcheck.frameworks.base import FrameworkUnavailable, GenRequest, ScoreRequest, ScoringUnsupported
from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import prompts
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.device_generates import teacher_for
from adaptcheck.steps.frameworks.feature import (
    FeatureParams,
    Proof,
    engine_row,
    facts_of,
    feature_vs_plain,
    lacks_engine_args,
)
from adaptcheck.steps.frameworks.lifecycle import (
    Active,
    deployed_here,
    not_loaded,
    run_with_framework,
    with_evidence,
)
from adaptcheck.steps.frameworks.params import LoadOverrides
from adaptcheck.steps.frameworks.probes import (
    TOP_K,
    local_tokenizer,
    not_applicable,
    subcheck,
    teacher_and_control,
    verdict,
)
from adaptcheck.steps.frameworks.reference import ReferenceUnavailable
from adaptcheck.steps.frameworks.teacher import score_alone

ENGINE_ARGS = frozenset({"enable_chunked_prefill", "max_num_batched_tokens"})
REQUEST_ERRORS = frozenset({"ValueError", "VLLMClientError"})
"""Exception classes (by name, anywhere in the raised one's MRO) that mean "this request is invalid"."""


class LongContextParams(FeatureParams):
    """``framework.long_context``: the near-limit prompt, the over-length one, the chunk budget."""

    prompts: int = Field(default=1, ge=1, description="Near-limit prompts compared chunked vs not (each a different "
                         "stretch of text).")
    max_tokens: int = Field(default=16, gt=0, description="Tokens generated after each near-limit prompt.")
    margin: int = Field(default=8, ge=0, description="Tokens left free below max_model_len besides max_tokens: the "
                        "prompt is max_model_len - max_tokens - margin tokens.")
    over_by: int = Field(default=16, ge=1, description="Tokens past max_model_len of the over-length request's prompt.")
    chunk_tokens: int = Field(default=256, ge=32, description="Token budget per engine step of the chunked instance "
                              "(vLLM's max_num_batched_tokens): below the prompt's length, so its prefill is split.")
    chunked: bool = Field(default=True, description="Compare chunked prefill on vs off (one more engine: the chunked "
                          "instance). false: only the near-limit prompt vs float64 and the over-length refusal, on the "
                          "shared instance (under --serve, the deployment as deployed).")
    deployment_only: bool = Field(default=False, description="Run only for a --serve deployment of this framework's "
                                  "engine (otherwise skipped, not tested): a cheap near-max_model_len check of the "
                                  "deployment for a ladder that leaves the full one out.")


def near_limit_tokens(max_model_len: int, max_tokens: int, margin: int) -> int:
    """The near-limit prompt's length: what leaves room for the answer and the margin."""
    n = max_model_len - max_tokens - margin
    if n < 2:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for a prompt beside max_tokens={max_tokens} "
                         f"and margin={margin}: lower them")
    return n


def expected_chunks(prompt_tokens: int, budget: int) -> int:
    """Engine steps a prompt's prefill takes alone under a per-step token budget."""
    return -(-prompt_tokens // budget)


def judge_chunks(steps: list[int] | None, prompt_tokens: int, budget: int) -> tuple[bool | None, str]:
    """The scheduler's per-step token counts of one prompt's prefill (None: not observable):
    split into at least two steps, none above the budget, covering the whole prompt."""
    if steps is None:
        return None, "the scheduler is not observable here (served engine): the resolved settings are the proof"
    want = expected_chunks(prompt_tokens, budget)
    shown = "+".join(str(s) for s in steps) if len(steps) <= 12 else f"{steps[0]}+...+{steps[-1]}"
    what = f"the scheduler prefilled the {prompt_tokens}-token prompt in {len(steps)} steps ({shown})"
    if len(steps) < 2:
        return False, f"{what}: not chunked (expected {want} chunks of <= {budget})"
    if max(steps) > budget:
        return False, f"{what}: a step exceeded the {budget}-token budget"
    if sum(steps) != prompt_tokens:
        return False, f"{what}: {sum(steps)} tokens scheduled, not the prompt's {prompt_tokens}"
    return True, f"{what}, each <= {budget} (expected {want})"


def judge_refusal(exc: BaseException | None, served: bool) -> tuple[bool, str]:
    """An over-length request's fate: refused as a request (in process a ValueError; served an
    HTTP 4xx with a message), not answered, not a crash or a 5xx."""
    if exc is None:
        return False, "the over-length request was answered instead of refused"
    line = exception_line(exc, with_type=False)
    status = getattr(exc, "status", None)
    if served:
        msg = str(getattr(exc, "server_message", "") or "").strip()
        if isinstance(status, int) and 400 <= status < 500 and msg:
            return True, f"HTTP {status}: {msg.splitlines()[0][:200]}"
        return False, f"not a clean 4xx with a message: {line[:300]}"
    # vLLM's request-validation errors: a ValueError, or (newer vLLM) its client-error class,
    # the one its server maps to a 4xx.
    if any(c.__name__ in REQUEST_ERRORS for c in type(exc).__mro__):
        return True, f"{type(exc).__name__}: {line[:300]}"
    return False, f"refused with {type(exc).__name__}, not a request error (ValueError): {line[:300]}"


class LongContextCheck(FrameworkCheck):
    """Near the context limit: chunked vs one-step prefill agree, the chunked answer matches the
    float64 reference, and an over-length request is a clean request error."""

    kind = "framework.long_context"
    step = 4
    description = ("A prompt near max_model_len matches float64; over-length is a clean error; chunked prefill "
                   "on vs off give the same distributions.")
    params_model = LongContextParams
    label = "long context and chunked prefill"
    compares = "one-step prefill vs chunked prefill"
    typical_s = 30.0

    def run(self, ctx: CheckContext, params: LongContextParams) -> Outcome:
        cls = framework_class(params.framework)
        if params.deployment_only and not deployed_here(ctx, cls, params.model):
            # Not n/a: the feature can run here, this ladder leaves it to a deployment (or to the
            # standard ladder's full check), so the features table says "not tested".
            return with_evidence(Outcome.skipped(
                f"runs only for a --serve deployment that {params.framework} runs (the standard ladder's "
                "framework.long_context checks adaptcheck's own deployment)"), not_loaded(params.framework))
        if not params.chunked:
            return run_with_framework(ctx, params, _near_limit_only)
        lacking = lacks_engine_args(cls, ENGINE_ARGS, "chunked-prefill settings")
        if lacking is not None:
            return not_applicable(params, lacking)
        seen: dict[str, Any] = {}
        feature: LoadOverrides = {
            "engine_args": {"enable_chunked_prefill": True, "max_num_batched_tokens": params.chunk_tokens}}
        return feature_vs_plain(ctx, params, "long context", feature,
                                lambda active: _requests(ctx, active, params, seen),
                                lambda active, deltas: _prove(active, deltas, params, seen),
                                names=("one-step prefill", f"prefill in {params.chunk_tokens}-token chunks"),
                                extra_rows=lambda active: _limit_rows(ctx, active, params, seen))


def _limit(active: Active) -> int:
    """The instance's context length as the engine resolved it (else as it was asked)."""
    got = facts_of(active).get("max_model_len")
    return got if isinstance(got, int) else active.options.max_model_len


def near_limit_requests(ctx: CheckContext, active: Active, p: LongContextParams) -> tuple[int, list[GenRequest]]:
    """The instance's context length (as the engine resolved it: the deployment's under --serve)
    and the near-limit prompts (token ids of the seed's long text) that leave room for the answer."""
    tok = local_tokenizer(active)
    if tok.hf is None:
        raise FrameworkUnavailable("no local tokenizer of the served weights: the near-limit prompt is built "
                                   "from token ids (pass --model PATH)")
    limit = _limit(active)
    n = near_limit_tokens(limit, p.max_tokens, p.margin)
    return limit, [GenRequest(prompt_ids=prompts.long_prompt_ids(tok.hf, n, seed=ctx.seed * 1000 + i),
                              max_tokens=p.max_tokens, logprobs=p.top_n) for i in range(p.prompts)]


def _near_limit_only(ctx: CheckContext, active: Active, p: LongContextParams) -> Outcome:
    """``chunked: false``: on the shared instance alone, the near-limit prompt vs float64, the
    over-length refusal and the request after it."""
    limit, reqs = near_limit_requests(ctx, active, p)
    seen: dict[str, Any] = {"limit": limit, "prompt_tokens": len(reqs[0].prompt_ids or []),
                            "first_ids": reqs[0].prompt_ids}
    rows = [_reference_row(ctx, active, p, seen), *_over_length_rows(active, p)]
    return verdict(rows, "long context", metrics={"prompt_tokens": seen["prompt_tokens"], "max_model_len": limit})


def _requests(ctx: CheckContext, active: Active, p: LongContextParams, seen: dict[str, Any]) -> list[GenRequest]:
    """The near-limit prompts; notes the plain instance's facts and scores the first prompt on it."""
    limit, reqs = near_limit_requests(ctx, active, p)
    n = len(reqs[0].prompt_ids or [])
    seen.update(plain=facts_of(active), limit=limit, prompt_tokens=n, first_ids=reqs[0].prompt_ids)
    # The whole prompt teacher-forced on the one-step instance, for the chunked one to be held
    # to position by position: the generated tokens alone see a chunk defect only through the
    # cache it left, the prompt's own positions see it directly.
    try:
        seen["plain_scores"] = score_alone(active.framework, [_prompt_score(reqs[0])], TOP_K)
    except ScoringUnsupported as exc:
        seen["plain_scores_error"] = exception_line(exc, with_type=False)
    # Scoring filled the prefix cache: the compared answer must prefill the prompt in one step.
    reset = getattr(active.framework, "reset_prefix_cache", None)
    if callable(reset):
        reset()
    return reqs


def _prompt_score(req: GenRequest) -> ScoreRequest:
    """Every position of the prompt after the first, scored from the tokens before it."""
    return ScoreRequest(token_ids=list(req.prompt_ids or []), start=1, top_k=TOP_K)


def _scheduler(fw: Any) -> Any:
    """The in-process engine core's scheduler, or None (a server, another adapter)."""
    obj = getattr(fw, "llm", None)
    for attr in ("llm_engine", "engine_core", "engine_core", "scheduler"):
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


def scheduled_steps(fw: Any, run: Callable[[], object]) -> list[int] | None:
    """Tokens the scheduler scheduled per engine step while ``run`` ran (steps with none
    left out), or None where the scheduler is not in this process."""
    sched = _scheduler(fw)
    if sched is None or not callable(getattr(sched, "schedule", None)):
        run()
        return None
    original = sched.schedule
    steps: list[int] = []

    def watching(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        total = sum(int(v) for v in (getattr(out, "num_scheduled_tokens", None) or {}).values())
        if total:
            steps.append(total)
        return out

    sched.schedule = watching
    try:
        run()
    finally:
        del sched.schedule  # the class's method again
    return steps


def _prove(active: Active, deltas: dict[str, float], p: LongContextParams, seen: dict[str, Any]) -> Proof:
    """Chunked prefill on with a budget below the prompt (read back), the plain instance's budget
    above it, and the scheduler really splitting the prompt (in process)."""
    facts, plain = facts_of(active), seen.get("plain", {})
    n = int(seen.get("prompt_tokens", 0))
    budget, on = facts.get("max_num_batched_tokens"), facts.get("enable_chunked_prefill")
    problems = []
    if on is False:
        problems.append("the engine has chunked prefill off")
    if isinstance(budget, int) and budget >= n:
        problems.append(f"its step budget {budget} holds the whole {n}-token prompt: nothing to chunk")
    plain_budget = plain.get("max_num_batched_tokens")
    if isinstance(plain_budget, int) and plain_budget < n and plain.get("enable_chunked_prefill"):
        problems.append(f"the plain instance's budget {plain_budget} is below the prompt too: both sides chunk, "
                        "so the comparison shows nothing (raise its max_num_batched_tokens)")
    # The prompt again, alone, after the compared answers: the prefix cache would hand it back
    # in one step, so it is emptied first.
    reset = getattr(active.framework, "reset_prefix_cache", None)
    if callable(reset):
        reset()
    probe = GenRequest(prompt_ids=list(seen.get("first_ids") or []), max_tokens=1)
    steps = (scheduled_steps(active.framework, lambda: active.framework.generate([probe]))
             if probe.prompt_ids else None)
    chunks_ok, chunk_how = judge_chunks(steps, n, budget if isinstance(budget, int) else p.chunk_tokens)
    if chunks_ok is False:
        problems.append(chunk_how)
    how = (f"engine: chunked prefill {on}, max_num_batched_tokens {budget} for a {n}-token prompt (plain instance: "
           f"{plain_budget}); {chunk_how}")
    ok: bool | None = not problems
    if ok and on is None and budget is None and steps is None:
        # Nothing read back (a server without engine facts): what was asked is no proof.
        ok, how = None, (f"not observable here: the engine reports neither its chunked-prefill settings nor its "
                         f"scheduler's steps (asked: max_num_batched_tokens {p.chunk_tokens} for a {n}-token prompt)")
    detail = how if ok is not False else "; ".join(problems)
    record = FeatureProof(feature="chunked_prefill", active=ok, how=detail, engine=facts, counters=deltas)
    metrics: dict[str, float | str | None] = {"prompt_tokens": n, "prefill_chunks": len(steps) if steps else None,
                                              "max_num_batched_tokens": budget if isinstance(budget, int) else None}
    return Proof(rows=[engine_row("chunked prefill", ok, detail)], record=record, metrics=metrics)


def _limit_rows(ctx: CheckContext, active: Active, p: LongContextParams, seen: dict[str, Any]) -> list[SubcheckRow]:
    """On the chunked instance: the near-limit prompt vs float64, the over-length refusal, and
    the request after it."""
    return [_prompt_row(ctx, active, p, seen), _reference_row(ctx, active, p, seen), *_over_length_rows(active, p)]


def _prompt_row(ctx: CheckContext, active: Active, p: LongContextParams, seen: dict[str, Any]) -> SubcheckRow:
    """The near-limit prompt's own distributions, one-step vs chunked, by the same-framework rule."""
    name = "prompt distributions: one-step vs chunked prefill"
    plain = seen.get("plain_scores")
    ids = seen.get("first_ids")
    if plain is None or not ids:
        return subcheck(name, None, f"not possible here: {seen.get('plain_scores_error', 'no near-limit prompt')}")
    try:
        chunked = score_alone(active.framework, [_prompt_score(GenRequest(prompt_ids=list(ids)))], TOP_K)
    except ScoringUnsupported as exc:
        return subcheck(name, None, f"not possible here: {exception_line(exc, with_type=False)}")
    found = teacher_and_control(ctx, active, local_tokenizer(active), p.teacher)
    row, _distribution = tf_rules.same_framework_row(name, plain, chunked, found[1] if found else None,
                                                    load_numerics(), active.options.dtype)
    return SubcheckRow.model_validate(row)


def _reference_row(ctx: CheckContext, active: Active, p: LongContextParams, seen: dict[str, Any]) -> SubcheckRow:
    name = "near-limit prompt vs float64 reference"
    ids = seen.get("first_ids")
    if not ids:
        return subcheck(name, None, "no near-limit prompt was built")
    policy = load_numerics()
    req = GenRequest(prompt_ids=list(ids), max_tokens=p.max_tokens, logprobs=p.top_n)
    try:
        teacher, _device = teacher_for(ctx, active, [req], policy.reference_top_k)
        row, _record, _metrics = tf_rules.reference_verdict(ctx, active, teacher, policy, 20)
    except (ReferenceUnavailable, ScoringUnsupported) as exc:
        return subcheck(name, None, f"not possible here: {exception_line(exc, with_type=False)}")
    return subcheck(name, row.ok, f"{len(ids)}-token prompt of a {seen.get('limit')}-token context: {row.detail}")


def _over_length_rows(active: Active, p: LongContextParams) -> list[SubcheckRow]:
    limit = _limit(active)
    served = bool(getattr(active.framework, "openai_api", False))
    tok = local_tokenizer(active)
    ids = prompts.long_prompt_ids(tok.hf, limit + p.over_by, seed=7) if tok.hf is not None else None
    if ids is None:
        return [subcheck("over-length request refused", None, "no local tokenizer to build it from")]
    caught: BaseException | None = None
    try:
        active.framework.generate([GenRequest(prompt_ids=ids, max_tokens=p.max_tokens)])
    except Exception as exc:  # noqa: BLE001 - how it fails is what is judged
        caught = exc
    ok, detail = judge_refusal(caught, served)
    rows = [subcheck("over-length request refused", ok,
                     f"{len(ids)}-token prompt for a {limit}-token context: {detail}")]
    try:
        after = active.framework.generate([GenRequest(prompt_ids=ids[:16], max_tokens=4)])[0]
        n = len(after.token_ids or [])
        rows.append(subcheck("serves the next request", n > 0, f"the next request answered {n} tokens"))
    except Exception as exc:  # noqa: BLE001 - a dead engine is this row's failure
        rows.append(subcheck("serves the next request", False,
                             f"the next request failed: {exception_line(exc, with_type=False)[:300]}"))
    return rows
