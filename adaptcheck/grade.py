"""Step 6: compute the L0-L5 grade from check results and the ladder's rules alone.

A condition holds only when it selects at least one planned check, every selected check
has a result, at least one of them passed, and every other one passed or is a
*non-applicable* skip (the backend declared it lacks the capability). A check that did
not run — excluded step, interrupted run, crashed worker, skipped for a missing framework
— never counts.

Checks tagged ``quant:FORMAT`` (int8 GEMM, fp8 quantizer …) are graded only for a model
quantized in FORMAT (``model.quantization``; 'other' grades them all): a bf16 model runs no
int8 GEMM, so a host whose int8 path is broken still serves it correctly. Their results
stay in the report, and the grade lists them as left out.

Checks tagged ``family:NAME`` (MLA decode, grouped routing, the Mamba state update …) are
graded only for a model of family NAME (``model.families``, read from its config.json;
'unknown' grades them all), the same way (:mod:`adaptcheck.base.families`). The families
table (:func:`compute_families`) says per family what its tagged checks established.

Beside the level, never folded into it, the features table (:func:`compute_features`): per
known serving feature (:mod:`adaptcheck.base.features`), what the checks tagged
``feature:<name>`` established. ``adaptcheck grade --require-feature`` gates on it. A row is
marked ``deployed`` when the deployment under test (``--serve``) turns the feature on.
"""

from __future__ import annotations

import fnmatch

from adaptcheck.base.families import FAMILIES, FAMILY_TABLE, QUANT_FORMATS, graded_families
from adaptcheck.base.features import FEATURES, Outcome, Planned, feature_names, feature_table
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.ladder import QUANT_TAG, ConditionSpec, GradeSpec
from adaptcheck.base.schemas.results import (
    CheckResult,
    ConditionResult,
    FamilyResult,
    FeatureResult,
    GradeResult,
    LevelResult,
    PlannedCheck,
    Status,
)

LEVEL_NAMES = {"L0": "none"}


def _matches(check_id: str, pattern: str) -> bool:
    """A pattern selects a check id, or the sub-results an expanding check produced."""
    return fnmatch.fnmatchcase(check_id, pattern) or check_id.startswith(pattern + ".")


def _selects(cond: ConditionSpec, check_id: str, step: int, tags: list[str]) -> bool:
    if feature_names(tags):
        # An optimisation feature's check (feature:NAME) is certified beside the level, in the
        # features table: a level demands it only by naming it (its tag or its exact id), never
        # through a wildcard or a whole step (ops.*.bf16 must not fold the fp8 KV-cache kernels
        # into "the operators the model needs").
        return any(p == check_id or check_id.startswith(p + ".") for p in cond.checks) or bool(set(tags) & set(cond.tags))
    return (
        any(_matches(check_id, p) for p in cond.checks)
        or step in cond.steps
        or bool(set(tags) & set(cond.tags))
    )


def _selects_planned(cond: ConditionSpec, check_id: str, step: int, tags: list[str]) -> bool:
    """Like _selects, but a planned check is also selected when the pattern names its
    sub-results ('ops.*.bf16' selects the planned 'ops.gemm', whose results are 'ops.gemm.bf16')."""
    return _selects(cond, check_id, step, tags) or (not feature_names(tags) and any(
        "." in p and fnmatch.fnmatchcase(check_id, p.rsplit(".", 1)[0]) for p in cond.checks))


def substitute(cond: ConditionSpec, precision: str) -> ConditionSpec:
    """Fill ``{precision}`` in check patterns with the model's precision ('ops.*.{precision}')."""
    if not any("{precision}" in p for p in cond.checks):
        return cond
    return cond.model_copy(update={"checks": [p.replace("{precision}", precision) for p in cond.checks]})


def _parent_id(result_id: str, planned_ids: set[str]) -> str:
    """The planned check a (possibly expanded) result id belongs to."""
    rid = result_id
    while rid not in planned_ids and "." in rid:
        rid = rid.rsplit(".", 1)[0]
    return rid


def evaluate_condition(
    cond: ConditionSpec,
    planned: list[PlannedCheck],
    results: list[CheckResult],
    steps_run: list[int],
    device_count: int,
) -> ConditionResult:
    """Evaluate one condition."""
    if cond.when == "multi_device" and device_count <= 1:
        return ConditionResult(id=cond.id, description=cond.description, holds=True,
                               reason="not demanded: only one device is visible")
    sel_planned = [p for p in planned if _selects_planned(cond, p.id, p.step, p.tags)]
    planned_ids = {p.id for p in planned}
    # Results are selected by the condition itself (a pattern covers an expanding check's
    # sub-results), never merely for belonging to a selected planned check: 'ops.*.bf16'
    # must not pull in 'ops.gemm.fp16'.
    sel_results = [r for r in results if _selects(cond, r.id, r.step, r.tags)]
    problems: list[str] = []
    if not sel_planned and not sel_results:
        problems.append("no check of this ladder provides the evidence")
    have = {_parent_id(r.id, planned_ids) for r in sel_results}
    for p in sel_planned:
        if p.id in have:
            continue
        if p.step not in steps_run:
            problems.append(f"{p.id} not run (step {p.step} not selected)")
        else:
            problems.append(f"{p.id} has no result (run interrupted?)")
    passed = 0
    for r in sel_results:
        if r.status is Status.PASS:
            passed += 1
        elif r.not_applicable:
            continue
        else:
            msg = f": {r.message}" if r.message else ""
            problems.append(f"{r.id} {r.status.value}{msg}")
    if not problems and passed == 0:
        if cond.when == "where_applicable" and sel_results:
            return ConditionResult(id=cond.id, description=cond.description, holds=True,
                                   reason="not demanded: no selected check applies here",
                                   checks=sorted(r.id for r in sel_results))
        problems.append("no selected check passed (all were not applicable)")
    return ConditionResult(
        id=cond.id,
        description=cond.description,
        holds=not problems,
        reason="; ".join(problems),
        checks=sorted({r.id for r in sel_results} | {p.id for p in sel_planned if p.id not in have}),
    )


def graded_for(tags: list[str], quantization: str, families: list[str] | None = None) -> bool:
    """Whether a check with ``tags`` counts for a model quantized as ``quantization`` and of
    ``families`` (None: families not known, as in files older than schema 1.6 — only the
    quantization decides)."""
    formats = [t[len(QUANT_TAG):] for t in tags if t.startswith(QUANT_TAG)]
    if formats and not (quantization == "other" or quantization in formats):
        return False
    if families is None:
        return True
    # 'other' is the strict reading of a quantized model: every quantized family's checks count.
    return graded_families(tags, list(families) + (list(QUANT_FORMATS) if quantization == "other" else []))


def compute_grade(
    rules: GradeSpec,
    planned: list[PlannedCheck],
    results: list[CheckResult],
    steps_run: list[int],
    device_count: int,
    precision: str = "bf16",
    quantization: str = "none",
    families: list[str] | None = None,
) -> GradeResult:
    """The highest level whose conditions, and every lower level's, hold; blockers of the next.

    ``families``: the model's (:mod:`adaptcheck.base.families`); an empty list is read as
    not known, like None."""
    fams = families or None
    left_out = sorted(p.id for p in planned if not graded_for(p.tags, quantization, fams))
    planned = [p for p in planned if graded_for(p.tags, quantization, fams)]
    results = [r for r in results if graded_for(r.tags, quantization, fams)]
    levels: list[LevelResult] = []
    for lv in rules.levels:
        conds = [evaluate_condition(substitute(c, precision), planned, results, steps_run, device_count)
                 for c in lv.conditions]
        levels.append(LevelResult(level=lv.level, name=lv.name, holds=all(c.holds for c in conds), conditions=conds))
    grade, name = "L0", LEVEL_NAMES["L0"]
    next_level: LevelResult | None = None
    for result in levels:
        if not result.holds:
            next_level = result
            break
        grade, name = result.level, result.name
    blockers = (
        [f"{next_level.level} {c.id}: {c.description} — {c.reason}" for c in next_level.conditions if not c.holds]
        if next_level
        else []
    )
    all_steps = sorted({p.step for p in planned})
    return GradeResult(
        level=grade,
        name=name,
        blockers=blockers,
        levels=levels,
        steps_not_run=[s for s in all_steps if s not in steps_run],
        left_out=left_out,
    )


def level_at_least(level: str, required: str) -> bool:
    """'L3' >= 'L2'."""
    return int(level[1:]) >= int(required[1:])


def _tag_inputs(planned: list[PlannedCheck], results: list[CheckResult]) -> tuple[list[Outcome], list[Planned]]:
    """Results and planned checks as the tag-table rule (base.features) reads them."""
    outcomes = [Outcome(id=r.id, status=r.status.value, applicable=r.applicable, message=r.message,
                        tags=tuple(r.tags), step=r.step) for r in results]
    return outcomes, [Planned(id=p.id, step=p.step, tags=tuple(p.tags)) for p in planned]


def deployed_features(deployment: Deployment | None) -> set[str]:
    """The features the deployment under test turns on: only a deployment the user gave.

    adaptcheck's own deployment (``source: adaptcheck``) has no engine arguments of its own, each
    check chooses its own, so it deploys no feature; a file older than schema 1.7 has none at all.
    """
    return set(deployment.features) if deployment is not None and deployment.given else set()


def compute_features(planned: list[PlannedCheck], results: list[CheckResult], steps_run: list[int],
                     deployment: Deployment | None = None) -> list[FeatureResult]:
    """The features table: every known feature's status from the checks tagged ``feature:<name>``,
    each row marked ``deployed`` when ``deployment`` (``--serve``) turns the feature on.

    Every check counts, ``quant:``-tagged ones too: a feature is a property of the serving stack,
    whichever model the grade is for. ``deployed`` says what the deployment runs, never changes a
    status: a deployed feature whose checks failed is failed, and one no check tested is not tested.
    """
    outcomes, plans = _tag_inputs(planned, results)
    on = deployed_features(deployment)
    return [FeatureResult(name=v.name, description=FEATURES[v.name], status=v.status, reason=v.reason, checks=v.checks,
                          deployed=v.name in on)
            for v in feature_table(outcomes, plans, steps_run)]


def compute_families(planned: list[PlannedCheck], results: list[CheckResult], steps_run: list[int],
                     model_families: list[str]) -> list[FamilyResult]:
    """The families table: every known family's status from the checks tagged ``family:<name>``,
    each row marked when the model under test is of that family (its checks then gate the grade)."""
    outcomes, plans = _tag_inputs(planned, results)
    return [FamilyResult(name=v.name, description=FAMILIES[v.name], status=v.status, reason=v.reason, checks=v.checks,
                         model=v.name in model_families)
            for v in FAMILY_TABLE.table(outcomes, plans, steps_run)]
