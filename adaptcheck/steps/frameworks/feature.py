"""A serving feature against the same framework without it: the shared body of the feature kinds
(``framework.spec_decode``, ``framework.fp8_kv_cache``, ``framework.preemption`` …; docs/features.md).

Every feature check has the same three parts, and only the first and last differ by feature:

1. the same requests on the shared plain instance (the one the ladder's other checks reuse) and
   on an instance loaded with the feature's engine arguments;
2. the answers compared by the same-framework rules: greedy tokens by the top-N rule at the first
   divergence, teacher-forced distributions scaled by the CPU control (docs/step4-numerics.md);
3. proof that the feature really ran, read back from the engine: its own counters' deltas over
   the feature instance's requests and its resolved settings. A feature that silently fell back
   (vLLM ignoring a setting, a drafter that never drafted) fails on this row, never passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, JsonValue

from adaptcheck.base.schemas.framework_evidence import FeatureProof, SubcheckRow
from adaptcheck.frameworks.base import (
    Framework,
    FrameworkError,
    Generation,
    GenRequest,
    Scored,
    ScoreRequest,
    ScoringUnsupported,
)
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks import teacher as tf_rules
from adaptcheck.steps.frameworks.agreement import compare
from adaptcheck.steps.frameworks.bounds import load_numerics
from adaptcheck.steps.frameworks.lifecycle import FEATURE_OFF, Active, acquire, release, run_with_framework
from adaptcheck.steps.frameworks.params import LoadOverrides, VariantsParams
from adaptcheck.steps.frameworks.probes import (
    TOP_K,
    Tok,
    generations_distribution_row,
    local_tokenizer,
    strip_eos,
    subcheck,
    teacher_and_control,
    verdict,
)


class FeatureParams(VariantsParams):
    """A feature kind's params: the prompts compared, and how they are submitted. The check's
    ``engine_args`` apply to both instances; the feature's own arguments come from the kind."""

    together: bool = Field(default=False, description="Submit the prompts together (one batch) on both instances, "
                           "instead of one at a time.")


@dataclass
class Proof:
    """What :data:`Prover` found: the feature's activity row(s), figures for the metrics, and the record."""

    rows: list[SubcheckRow]
    record: FeatureProof
    metrics: dict[str, float | str | None] = field(default_factory=dict)


Prover = Callable[[Active, dict[str, float]], Proof]
"""Reads the feature instance (its ``engine_facts()``) and its counters' deltas over the
compared requests; returns the activity rows (one ``ok=False`` row when the feature did not run)."""


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters that moved between two ``Framework.metrics()`` readings (gauges included when they moved)."""
    return {k: round(after[k] - before.get(k, 0.0), 6) for k in after if after[k] != before.get(k, 0.0)}


def answer(fw: Framework, reqs: list[GenRequest], together: bool) -> list[Generation]:
    """The requests as one batch, or one at a time (each alone in the engine)."""
    return fw.generate(reqs) if together else [fw.generate([r])[0] for r in reqs]


def feature_vs_plain(ctx: CheckContext, p: FeatureParams, what: str, feature: LoadOverrides,
                     requests: Callable[[Active], list[GenRequest]], prove: Prover, *,
                     names: tuple[str, str] = ("without", "with"), plain: LoadOverrides | None = None,
                     extra_rows: Callable[[Active], list[SubcheckRow]] | None = None,
                     tie_margin: Callable[[Active], float] | None = None,
                     distributions: bool = True,
                     refused: Callable[[FrameworkError], str | None] | None = None,
                     submit: Callable[[Framework, list[GenRequest]], list[Generation]] | None = None,
                     vs_float64: bool = False, feature_name: str | None = None) -> Outcome:
    """Compare the plain instance with one loaded with ``feature`` merged onto the check's own
    load options (``engine_args`` merged key by key), and prove the feature ran.

    ``plain`` overrides the plain instance's options (default: the check's, which is the shared
    instance the other checks reuse). ``extra_rows`` runs on the feature instance after the
    compared requests (an over-length request, a second probe) and adds its rows. ``submit``
    sends the requests to each instance (default: :func:`answer` with ``together``); both
    instances get the same submission, and the answers it returns are compared in order.
    ``vs_float64`` replaces the distributions row with the teacher's sequences scored on both
    instances, the feature's divergence from float64 held to the plain instance's (the
    ``batched_vs_alone`` rule): for a feature that rounds differently on purpose (tensor
    parallel's partial sums), the same figure on both sides, not a tail statistic of two
    roundings against a control measured elsewhere.
    ``tie_margin`` (nats, from the plain instance) compares greedy tokens by the near-tie rule
    instead of the top-N rule: for a feature that must not change which token wins, only numerics
    (bf16 rounding of another batch shape) may part the answers, and only at a near-tie.
    ``distributions=False`` leaves out the same-framework distribution row, for a feature that
    changes numerics on purpose and is held to the float64 reference in ``extra_rows`` instead
    (fp8 KV cache). ``refused`` reads a failed load of the feature instance: the reason the
    framework itself gives for not running the feature here (the outcome is then n/a with it),
    or None for a real failure (an error, as before).

    With a ``--serve`` deployment (:func:`~adaptcheck.steps.frameworks.lifecycle.deployed_here`), both
    instances are the deployment with only this feature toggled: where the deployment already turns
    ``feature_name`` on, the deployed instance is the one "with" it and the other has it turned off
    (:data:`~adaptcheck.steps.frameworks.lifecycle.FEATURE_OFF`), so the feature is certified as deployed.
    """
    base = p.load_overrides()
    dep = ctx.deployment
    if dep is not None and feature_name is not None and feature_name in dep.features and feature_name in FEATURE_OFF:
        # The kind's own "without" side, where it names one (TP: the smallest size that fits), wins.
        plain = {**FEATURE_OFF[feature_name], **(plain or {})}
        feature = {}

    def send(fw: Framework, reqs: list[GenRequest]) -> list[Generation]:
        return submit(fw, reqs) if submit is not None else answer(fw, reqs, p.together)

    def body(ctx: CheckContext, active: Active, params: FeatureParams) -> Outcome:
        tok = local_tokenizer(active)
        eos = tok.eos_ids()
        reqs = requests(active)
        plain_answers = [strip_eos(g, eos) for g in send(active.framework, reqs)]
        loads: dict[str, float | str | None] = {f"load_s[{names[0]}]": round(active.load_s, 2)}
        forced = _TeacherForced.start(ctx, active, tok, p) if vs_float64 else None
        try:
            other = acquire(ctx, p.framework, ctx.check_id, toggles=feature, **base)
        except FrameworkError as exc:
            why = refused(exc) if refused is not None else None
            if why is None:
                raise
            return Outcome.skipped(why, applicable=False, metrics=loads)
        try:
            loads[f"load_s[{names[1]}]"] = round(other.load_s, 2)
            before = other.framework.metrics()
            feat_answers = [strip_eos(g, eos) for g in send(other.framework, reqs)]
            proof = prove(other, counter_deltas(before, other.framework.metrics()))
            forced_row = forced.finish(other, names) if forced is not None else None
            more = extra_rows(other) if extra_rows is not None else []
        finally:
            release(ctx)
        if tie_margin is None:
            cmp = compare(plain_answers, feat_answers, mode="top_n", top_n=p.top_n, codec=tok.codec())
        else:
            loads["tie_margin"] = margin = tie_margin(active)
            cmp = compare(plain_answers, feat_answers, mode="near_tie", top_n=p.top_n, tie_margin=margin,
                          codec=tok.codec())
        rows = [*proof.rows, subcheck(f"greedy tokens: {names[0]} vs {names[1]}", cmp.ok, cmp.summary())]
        distribution = None
        if forced_row is not None:
            rows.append(forced_row[0])
            distribution = forced_row[1]
        elif distributions:
            dist_row, distribution = generations_distribution_row(
                ctx, active, tok, p.teacher, f"distributions: {names[0]} vs {names[1]}", plain_answers, feat_answers)
            rows.append(dist_row)
        rows.extend(more)
        return verdict(rows, what, metrics={**cmp.metrics(), **loads, **proof.metrics},
                       details={"comparison": cmp.details(), "distribution": distribution,
                                "feature": proof.record.dump()})

    return run_with_framework(ctx, p, body, toggles=plain)


@dataclass
class _TeacherForced:
    """The teacher's sequences scored on the plain instance (before it is released), then on
    the feature instance, judged by the ``batched_vs_alone`` rule."""

    teacher: Any
    plain: list[Scored]
    dtype: str

    @classmethod
    def start(cls, ctx: CheckContext, active: Active, tok: Tok, p: FeatureParams) -> _TeacherForced | None:
        found = teacher_and_control(ctx, active, tok, p.teacher)
        if found is None:
            return None
        teacher = found[0]
        try:
            plain = active.framework.score([ScoreRequest(s.token_ids, s.start, TOP_K, list(s.images)) for s in teacher.sequences])
        except ScoringUnsupported:
            return None
        return cls(teacher, plain, active.options.dtype)

    def finish(self, other: Active, names: tuple[str, str]) -> tuple[SubcheckRow, dict[str, Any]]:
        feat = other.framework.score([ScoreRequest(s.token_ids, s.start, TOP_K, list(s.images)) for s in self.teacher.sequences])
        row, record = tf_rules.batched_vs_alone_row(
            f"teacher-forced distributions: {names[1]} vs float64, relative to {names[0]}", self.teacher.scores,
            self.plain, feat, load_numerics(), self.dtype)
        return SubcheckRow.model_validate(row), record


def lacks_engine_args(cls: type[Framework], wanted: set[str] | frozenset[str], what: str) -> str | None:
    """Why ``cls`` cannot load the feature (it takes none of these engine arguments), else None;
    an adapter that does not say which it takes is given the benefit (its load says)."""
    names = cls.accepted_engine_args()
    if names is not None and not wanted <= names:
        return f"{cls.display_name} has no {what} ({', '.join(sorted(wanted))})"
    return None


def engine_row(name: str, ok: bool | None, detail: str) -> SubcheckRow:
    """The activity row a prover returns (named so the report groups it with the feature)."""
    return subcheck(f"feature active: {name}", ok, detail)


def facts_of(active: Active) -> dict[str, JsonValue]:
    """The feature instance's engine facts ({} where the adapter reads none back)."""
    return active.framework.engine_facts()
