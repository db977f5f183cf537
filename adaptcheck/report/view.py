"""Build the report's view data from a :class:`RunResults` — plain data, no HTML.

The template only lays out what is here: every decision (what counts as 'not run', how a
number is printed, which level is the blocked one, bar geometry) is made in Python where it
can be tested. The view is dataclasses of strings, numbers, booleans and lists, so
``json.dumps(dataclasses.asdict(view))`` works and another renderer could reuse it.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from dataclasses import dataclass, field

from adaptcheck.base.features import FeatureStatus
from adaptcheck.base.schemas.certificate import (
    SHORT_DIGEST,
    CertificateSubject,
    certificate_subject,
    subject_label,
)
from adaptcheck.base.schemas.results import (
    CheckResult,
    FamilyResult,
    FeatureResult,
    PlannedCheck,
    RunResults,
    Status,
    TableRow,
)
from adaptcheck.report.comparison import CompareView, build_compare
from adaptcheck.report.fmt import (
    STATUS_LABELS,
    Label,
    format_details,
    format_duration,
    format_value,
    status_key,
)
from adaptcheck.report.fmt import status_label as _label
from adaptcheck.report.framework import FrameworkView, build_framework
from adaptcheck.report.matrix import MatrixView, build_matrix
from adaptcheck.report.mode import check_mode, row_mode
from adaptcheck.report.ops import OpsView, build_ops
from adaptcheck.report.perf import PerfView, build_perf

# RunResults does not carry the ladder's step names; these are the standard ones.
STEP_NAMES: dict[int, str] = {
    1: "compatibility matrix",
    2: "tensor smoke",
    3: "operator numerics",
    4: "framework bring-up",
    5: "performance baseline",
}
SLOWEST_SHOWN = 10
# Order in which a step's checks decide its own status (worst first); n/a never blocks.
_SEVERITY = ("error", "fail", "notrun", "skip", "pass", "na")


def step_name(step: int) -> str:
    """The standard name of a step ('step 7' for a step the standard ladders do not have)."""
    return STEP_NAMES.get(step, f"step {step}")


@dataclass
class Ref:
    """A check id, with the in-page anchor of its result when it has one."""

    id: str
    anchor: str


@dataclass
class ConditionView:
    id: str
    description: str
    holds: bool
    verdict: str
    reason: str
    checks: list[Ref]


@dataclass
class LevelView:
    level: str
    name: str
    holds: bool
    # 'achieved' (part of the grade), 'next' (the level the blockers belong to), 'above'.
    state: str
    conditions: list[ConditionView]


@dataclass
class Count:
    """How many checks of a step ended with one status."""

    status: Label
    count: int


@dataclass
class Metric:
    """One measured number, already formatted."""

    name: str
    value: str


@dataclass
class BarSegment:
    """One segment of a step's status bar, in percent of the bar's width."""

    status: Label
    count: int
    x: float
    width: float


@dataclass
class StepView:
    step: int
    name: str
    anchor: str
    ran: bool
    label: Label  # the step's own status: 'not run' when excluded, else the worst of its checks
    not_run_reason: str
    counts: list[Count]
    total: int
    duration: str
    bar: list[BarSegment]


@dataclass
class DurationBar:
    id: str
    anchor: str
    status: Label
    duration: str
    width: float


@dataclass
class CheckView:
    id: str
    anchor: str
    kind: str
    description: str
    status: Label
    message: str
    duration: str
    metrics: list[Metric]
    details: str
    tags: list[str]
    mode: str = ""
    """'eager' or 'compiled' where the check's evidence records which its verdict holds for (report.mode)."""


@dataclass
class CheckGroup:
    step: int
    name: str
    anchor: str
    checks: list[CheckView]


@dataclass
class ReproduceView:
    command: str
    adaptcheck_version: str
    schema_version: str
    ladder: str
    ladder_source: str
    ladder_sha256: str
    seed: int
    steps: str
    device: str
    # The results.json digest this report was rendered from ('' when the file has none).
    digest: str = ""
    verify_command: str = "adaptcheck verify results.json"
    # Why nothing vouches for the file ('edited after the run', 'no digest'); '' when its
    # digest matched. Set only by 'adaptcheck report --allow-unverified': the page says so.
    unverified: str = ""


@dataclass
class SubjectPart:
    """One part of the certificate line: the model, its architecture, dtype, digest, the frameworks."""

    key: str
    text: str
    # Said after the text in a lighter face: the model's source, package and license.
    note: str = ""
    # The whole value where the text abbreviates it (the weights digest); '' otherwise.
    full: str = ""


@dataclass
class SubjectView:
    """What the grade certifies, under the grade on the first screen (:mod:`adaptcheck.base.schemas.certificate`)."""

    known: bool
    # 'Certified' above L0; 'Tested' when nothing was certified.
    label: str
    parts: list[SubjectPart]
    line: str


@dataclass
class FeatureView:
    """One row of the features table on the first screen (:mod:`adaptcheck.base.features`)."""

    name: str
    description: str
    # The status styled like a check's: certified as a pass, failed as a fail, n/a, not tested as not run.
    status: Label
    reason: str
    checks: list[Ref]
    model: bool = False
    """A family of the model under test (families table only)."""
    deployed: bool = False
    """A feature the deployment under test (--serve) turns on (features table only)."""
    mode: str = ""
    """The engine modes the row's verdict holds for ('eager', 'compiled', 'eager and compiled'); '' when
    its checks record none or the row has no verdict (report.mode)."""


@dataclass
class DeploymentFact:
    """One fact of the deployment block: engine, TP/PP, context length, KV cache, compile mode, digest."""

    label: str
    value: str
    # The whole value where ``value`` abbreviates it (the digest); '' otherwise.
    full: str = ""


@dataclass
class DeploymentView:
    """The deployment under test, right under the grade (:mod:`adaptcheck.base.schemas.deployment`):
    the command the user gave with what the engine's parser read from it, or — adaptcheck's own
    deployment, or a file older than results schema 1.7 — one sentence saying the grade is not theirs."""

    given: bool
    own: str
    """The own-deployment sentence (certificate.OWN_DEPLOYMENT); '' when a deployment was given."""
    command: str
    """The command as given, one shell-quoted line (the page wraps it)."""
    facts: list[DeploymentFact]
    features: list[str]
    """The serving features the deployment turns on (their rows say 'deployed')."""


@dataclass
class ReportView:
    title: str
    run_id: str
    hostname: str
    device: str
    started: str
    finished: str
    complete: bool
    grade_level: str
    grade_name: str
    grade_max: str
    next_level: str
    blockers: list[str]
    left_out: list[str]
    """Checks the grade left out ('id (worst status)'): quantized-format checks for another quantization."""
    quantization: str
    subject: SubjectView
    deployment: DeploymentView
    """What was deployed: the --serve command, or adaptcheck's own settings (said in one sentence)."""
    features: list[FeatureView]
    """Every known serving feature with its status, beside the grade (never folded into it)."""
    features_tested: bool
    """Whether any feature was tested at all (else the page says so in one line)."""
    families: list[FeatureView]
    """Every known model family with its status (:mod:`adaptcheck.base.families`)."""
    families_tested: bool
    model_families: str
    """The model's families as read from its config.json, comma-separated ('' unknown)."""
    family_note: str
    """Why the model's family reading is off (unknown, contradicted by its weights); '' when clean."""
    levels: list[LevelView]
    steps: list[StepView]
    slowest: list[DurationBar]
    matrix: MatrixView
    ops: OpsView
    framework: FrameworkView
    perf: PerfView
    check_groups: list[CheckGroup]
    reproduce: ReproduceView
    legend: list[Label] = field(default_factory=lambda: [_label(k) for k in STATUS_LABELS])
    compare: CompareView | None = None  # a perf.regression result with a comparison in its details
    # Fragment ids that live on the details page (every check's entry, every op's cases);
    # links to them leave the main page (render.linker).
    detail_anchors: list[str] = field(default_factory=list)


def _anchors(ids: list[str]) -> dict[str, str]:
    """A unique, attribute-safe fragment id for every check id (ids of expanded results are free text)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for cid in ids:
        base = "check-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", cid).strip("-") or "x")
        anchor, n = base, 2
        while anchor in used:
            anchor, n = f"{base}-{n}", n + 1
        used.add(anchor)
        out[cid] = anchor
    return out


def _has_result(planned: PlannedCheck, result_ids: set[str]) -> bool:
    """Expanding checks store results as '<id>.<subid>'; either form counts as a result."""
    return planned.id in result_ids or any(r.startswith(planned.id + ".") for r in result_ids)


def _not_run_reason(step: int, results: RunResults) -> str:
    if step in results.grade.steps_not_run:
        selected = ", ".join(str(s) for s in results.steps) or "none"
        return f"step {step} was not selected for this run (steps run: {selected})"
    if not results.complete:
        return "not reached: the run was interrupted before this check"
    return "no result was recorded for this check"


def _not_run_view(p: PlannedCheck, anchor: str, results: RunResults) -> CheckView:
    return CheckView(id=p.id, anchor=anchor, kind=p.kind, description=p.description, status=_label("notrun"),
                     message=_not_run_reason(p.step, results), duration="—", metrics=[], details="", tags=p.tags)


def _check_view(c: CheckResult, anchor: str, description: str) -> CheckView:
    return CheckView(
        id=c.id, anchor=anchor, kind=c.kind, description=description, status=_label(status_key(c)),
        message=c.message, duration=format_duration(c.duration_s),
        metrics=[Metric(name=k, value=format_value(v)) for k, v in c.metrics.items()],
        details=format_details(c.details), tags=c.tags, mode=check_mode(c) or "",
    )


def _parent(cid: str, planned: list[PlannedCheck]) -> PlannedCheck | None:
    """The planned check a result belongs to: the longest planned id that is ``cid`` or a
    dotted prefix of it (an expanded result's id is '<id>.<subid>', and subids may hold dots)."""
    owners = [p for p in planned if cid == p.id or cid.startswith(p.id + ".")]
    return max(owners, key=lambda p: len(p.id), default=None)


def _check_groups(results: RunResults, anchors: dict[str, str]) -> list[CheckGroup]:
    """Every result plus every planned check without one, grouped by step in ladder order."""
    result_ids = {c.id for c in results.checks}
    by_step: dict[int, list[CheckView]] = defaultdict(list)
    for c in results.checks:
        parent = _parent(c.id, results.planned)
        by_step[c.step].append(_check_view(c, anchors[c.id], parent.description if parent else ""))
    for p in results.planned:
        if not _has_result(p, result_ids):
            by_step[p.step].append(_not_run_view(p, anchors[p.id], results))
    return [CheckGroup(step=s, name=step_name(s), anchor=f"step-{s}", checks=by_step[s])
            for s in sorted(by_step)]


def _step_views(results: RunResults, groups: list[CheckGroup]) -> list[StepView]:
    durations: dict[int, float] = defaultdict(float)
    for c in results.checks:
        durations[c.step] += c.duration_s
    steps = sorted({g.step for g in groups} | set(results.grade.steps_not_run))
    by_step = {g.step: g for g in groups}
    views = []
    for s in steps:
        checks = by_step[s].checks if s in by_step else []
        counts = {k: sum(1 for c in checks if c.status.key == k) for k in STATUS_LABELS}
        total = len(checks)
        bar, x = [], 0.0
        for key, n in counts.items():
            if n:
                width = 100.0 * n / total
                bar.append(BarSegment(status=_label(key), count=n, x=round(x, 3), width=round(width, 3)))
                x += width
        not_selected = s in results.grade.steps_not_run
        worst = next((k for k in _SEVERITY if counts[k]), "pass")
        views.append(StepView(
            step=s, name=step_name(s), anchor=f"step-{s}",
            ran=not not_selected, label=_label("notrun" if not_selected or not total else worst),
            not_run_reason=_not_run_reason(s, results) if not_selected else "",
            counts=[Count(status=_label(k), count=n) for k, n in counts.items() if n], total=total,
            duration=format_duration(durations[s]) if not not_selected else "—", bar=bar,
        ))
    return views


def _slowest(results: RunResults, anchors: dict[str, str]) -> list[DurationBar]:
    ranked = sorted(results.checks, key=lambda c: c.duration_s, reverse=True)[:SLOWEST_SHOWN]
    top = ranked[0].duration_s if ranked else 0.0
    return [DurationBar(id=c.id, anchor=anchors[c.id], status=_label(status_key(c)),
                        duration=format_duration(c.duration_s),
                        width=round(100.0 * c.duration_s / top, 3) if top > 0 else 0.0)
            for c in ranked]


def _levels(results: RunResults, anchors: dict[str, str]) -> list[LevelView]:
    grade_n = int(results.grade.level[1:])
    views = []
    for lv in results.grade.levels:
        n = int(lv.level[1:])
        state = "achieved" if n <= grade_n else "next" if n == grade_n + 1 else "above"
        conds = [ConditionView(id=c.id, description=c.description, holds=c.holds,
                               verdict="holds" if c.holds else "does not hold", reason=c.reason,
                               checks=[Ref(id=x, anchor=anchors.get(x, "")) for x in c.checks])
                 for c in lv.conditions]
        views.append(LevelView(level=lv.level, name=lv.name, holds=lv.holds, state=state, conditions=conds))
    return views


def _subject(subject: CertificateSubject, level: str) -> SubjectView:
    """The certificate subject's parts as the first screen shows them: the model's name apart
    from its notes, the short digest with the whole one beside it."""
    parts = []
    for key, text in subject.parts():
        if key == "model":
            parts.append(SubjectPart(key, subject.model_label(), note=", ".join(subject.model_notes())))
        elif key == "digest":
            parts.append(SubjectPart(key, text, full=subject.model.weights_sha256 or ""))
        else:
            parts.append(SubjectPart(key, text))
    return SubjectView(known=subject.model.known, label=subject_label(level), parts=parts,
                       line=subject.line())


_MODE_TEXT = {"eager": "eager (enforce_eager)", "compiled": "compiled (graph capture / torch.compile)"}


def _deployment(subject: CertificateSubject) -> DeploymentView:
    """The deployment block: every fact a reader needs to tell whether the grade is for the command
    they deploy. The command is user text: the template escapes it like everything else."""
    d = subject.given_deployment()
    if d is None:
        return DeploymentView(given=False, own=subject.own_deployment_text(), command="", facts=[], features=[])
    engine = f"{d.engine} {d.engine_version}" if d.engine_version else f"{d.engine} (version unknown)"
    facts = [DeploymentFact("engine", engine),
             DeploymentFact("TP / PP", f"{d.tensor_parallel_size} / {d.pipeline_parallel_size}"),
             DeploymentFact("max_model_len", str(d.max_model_len) if d.max_model_len else "the model's"),
             DeploymentFact("KV cache", d.kv_cache_dtype),
             DeploymentFact("mode", _MODE_TEXT.get(d.compile_mode, d.compile_mode)),
             DeploymentFact("digest", d.digest[:SHORT_DIGEST] if d.digest else "none", full=d.digest)]
    # An empty command would leave nothing to read: the normalized one is what the engine ran.
    command = shlex.join(d.command) if d.command else d.normalized
    return DeploymentView(given=True, own="", command=command, facts=facts, features=list(d.features))


def _device_text(results: RunResults) -> str:
    d = results.device
    return f"{d.device_name} ({d.display_name}, {d.torch_device}, {d.device_count} visible)"


def _reproduce(results: RunResults, unverified: str = "") -> ReproduceView:
    lad = results.ladder
    return ReproduceView(
        command=shlex.join(results.command) if results.command else "(not recorded)",
        adaptcheck_version=results.adaptcheck_version, schema_version=results.schema_version,
        ladder=f"{lad.id} {lad.version}", ladder_source=lad.source, ladder_sha256=lad.sha256,
        seed=results.seed, steps=", ".join(str(s) for s in results.steps), device=_device_text(results),
        digest=results.digest or "", unverified=unverified,
    )


def build_view(results: RunResults, records_base: str = "", unverified: str = "") -> ReportView:
    """The whole report as plain data. ``records_base``: the run folder relative to the
    report's folder ('' when the report is written into the run folder). ``unverified``: why
    nothing vouches for the results file, when it was rendered anyway (a banner says it)."""
    ids = [c.id for c in results.checks]
    result_ids = set(ids)
    ids += [p.id for p in results.planned if not _has_result(p, result_ids) and p.id not in result_ids]
    anchors = _anchors(ids)
    groups = _check_groups(results, anchors)
    levels = _levels(results, anchors)
    next_level = next((lv.level for lv in levels if lv.state == "next"), "")
    env = results.environment
    ops = build_ops(results, anchors)
    on_details = [*anchors.values(), *(g.anchor for g in groups),
                  *(a for d in ops.details for a in (d.anchor, *(x.anchor for x in d.dtypes)))]
    perf = build_perf(results, anchors, records_base)
    on_details += [f"{s.block}-details" for s in perf.serving]
    framework = build_framework(results, anchors, records_base)
    on_details += framework.localised
    features = _features(results, anchors)
    families = _features(results, anchors, families=True)
    subject = certificate_subject(results)
    return ReportView(
        title=f"adaptcheck {results.grade.level} — {results.device.device_name}",
        run_id=results.run_id,
        hostname=env.hostname if env else "not present",
        device=_device_text(results),
        started=results.started_at.isoformat(timespec="seconds"),
        finished=results.finished_at.isoformat(timespec="seconds") if results.finished_at else "not finished",
        complete=results.complete,
        grade_level=results.grade.level, grade_name=results.grade.name,
        grade_max=results.grade_rules.levels[-1].level if results.grade_rules.levels else "L5",
        next_level=next_level, blockers=list(results.grade.blockers), left_out=_left_out(results),
        quantization=results.model.quantization, levels=levels,
        subject=_subject(subject, results.grade.level), deployment=_deployment(subject),
        features=features, features_tested=any(f.status.key != "notrun" for f in features),
        families=families, families_tested=any(f.status.key != "notrun" for f in families),
        model_families=", ".join(results.model.families), family_note=results.model.family_note or "",
        steps=_step_views(results, groups), slowest=_slowest(results, anchors),
        matrix=build_matrix(env, results.checks, anchors), ops=ops,
        framework=framework, perf=perf, check_groups=groups,
        reproduce=_reproduce(results, unverified), compare=build_compare(results, anchors),
        detail_anchors=on_details,
    )


_FEATURE_LABELS: dict[FeatureStatus, tuple[str, str]] = {
    FeatureStatus.CERTIFIED: ("pass", "certified"),
    FeatureStatus.FAILED: ("fail", "failed"),
    FeatureStatus.NOT_APPLICABLE: ("na", "n/a"),
    FeatureStatus.NOT_TESTED: ("notrun", "not tested"),
}


def _features(results: RunResults, anchors: dict[str, str], families: bool = False) -> list[FeatureView]:
    """The features (or families) table's rows, each status as the check status it reads like, the checks linked."""
    rows = []
    table: list[TableRow] = list(results.family_rows() if families else results.feature_rows())
    by_id = {c.id: c for c in results.checks}
    for row in table:
        key, text = _FEATURE_LABELS[row.status]
        rows.append(FeatureView(name=row.name, description=row.description,
                                status=Label(key=key, label=text, glyph=_label(key).glyph), reason=row.reason,
                                checks=[Ref(id=x, anchor=anchors.get(x, "")) for x in row.checks],
                                model=isinstance(row, FamilyResult) and row.model,
                                deployed=isinstance(row, FeatureResult) and row.deployed,
                                mode=row_mode(row, by_id)))
    return rows


def _left_out(results: RunResults) -> list[str]:
    """'id (worst status)' for each check the grade left out, worst first (a failure is the one to notice)."""
    order = {Status.FAIL: 0, Status.ERROR: 1, Status.SKIP: 2, Status.PASS: 3}
    out: list[tuple[int, str]] = []
    for pid in results.grade.left_out:
        statuses = [r.status for r in results.checks if r.id == pid or r.id.startswith(pid + ".")]
        worst = min(statuses, key=lambda st: order[st]) if statuses else None
        out.append((order[worst] if worst else 4, f"{pid} ({worst.value if worst else 'not run'})"))
    return [text for _, text in sorted(out)]
