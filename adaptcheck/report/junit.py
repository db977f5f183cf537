"""JUnit XML of a run, for CI systems (Jenkins, GitLab, GitHub test reporters): one suite per
step plus the grade's, the features' and the families' (one testcase per serving feature or model family, a failure only for a
feature or family ``--require-feature`` / ``--require-family`` named and the run did not certify), shaped to the schema Jenkins' xUnit plugin validates against
(``junit-10.xsd``), every string scrubbed of secrets and of what XML 1.0 cannot carry.

The layout, element by element: docs/ci.md (JUnit XML).
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path

from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.redact import scrub_text
from adaptcheck.base.schemas.certificate import UNKNOWN, CertificateSubject, certificate_subject
from adaptcheck.base.schemas.results import (
    CheckResult,
    FamilyResult,
    FeatureResult,
    PlannedCheck,
    RunResults,
    Status,
    TableRow,
)
from adaptcheck.grade import level_at_least
from adaptcheck.report.view import step_name

# A failure body is for reading in a CI page, not for archiving: the full details are in results.json.
MAX_BODY_CHARS = 20_000
GRADE_SUITE = "adaptcheck.grade"
FEATURES_SUITE = "adaptcheck.features"
FAMILIES_SUITE = "adaptcheck.families"
# Characters XML 1.0 does not allow at all (ElementTree would write them and produce a file
# no parser accepts), e.g. the ANSI escapes a crashing subprocess prints.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: object) -> str:
    """Scrubbed, XML-safe text: forbidden characters are shown as \\xNN instead of dropped."""
    text = scrub_text(str(value))
    text = _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return _SURROGATE.sub("\ufffd", text)


def _seconds(value: float) -> str:
    # Plain decimal (no exponent, no thousands separator): the form junit-10.xsd's time pattern allows.
    return f"{max(value, 0.0):.3f}"


@dataclass
class _Case:
    """One testcase before it becomes XML."""

    classname: str
    name: str
    time: float
    outcome: str  # 'pass', 'failure', 'error', 'skipped'
    message: str = ""
    type: str = ""
    body: str = ""
    stdout: list[str] = field(default_factory=list)


def _classname(step: int, check_id: str) -> str:
    return f"adaptcheck.step{step}.{check_id.split('.')[0]}"


def _metrics_lines(c: CheckResult) -> list[str]:
    return [f"{k} = {json.dumps(v, default=str)}" for k, v in c.metrics.items()]


def _result_case(c: CheckResult) -> _Case:
    case = _Case(classname=_classname(c.step, c.id), name=c.id, time=c.duration_s, outcome="pass",
                 stdout=[f"{c.status.value}: {c.message}"] if c.message else [])
    case.stdout += _metrics_lines(c)
    if c.status is Status.PASS:
        return case
    if c.status is Status.SKIP:
        case.outcome, case.type = "skipped", "skip" if c.applicable else "n/a"
        case.message = c.message if c.applicable else f"n/a: {c.message}"
        return case
    case.outcome = "failure" if c.status is Status.FAIL else "error"
    case.type, case.message = c.kind, c.message or c.status.value
    if c.details:
        body = json.dumps(c.details, indent=2, default=str)
        case.body = body if len(body) <= MAX_BODY_CHARS else body[:MAX_BODY_CHARS] + "\n… (truncated; see results.json)"
    return case


def _has_result(p: PlannedCheck, result_ids: set[str]) -> bool:
    # Expanding checks store results as '<id>.<subid>'; either form is a result of the planned check.
    return p.id in result_ids or any(r.startswith(p.id + ".") for r in result_ids)


def _not_run_case(p: PlannedCheck, results: RunResults) -> _Case:
    case = _Case(classname=_classname(p.step, p.id), name=p.id, time=0.0, outcome="error", type="not run")
    if p.step not in results.steps:
        selected = ", ".join(map(str, results.steps)) or "none"
        case.outcome, case.message = "skipped", f"not run: step {p.step} was not selected (steps run: {selected})"
    elif not results.complete:
        case.message = "not run: the run was interrupted before this check"
    else:
        case.message = "not run: no result was recorded for this check"
    return case


def _subject_lines(subject: CertificateSubject) -> list[str]:
    """'model: …', 'architecture: …', 'dtype: …', 'weights: sha256 <all 64 digits>', 'frameworks: …'."""
    lines = []
    for key, text in subject.parts():
        if key == "digest":
            key, text = "weights", subject.digest_text(short=False)
        lines.append(text if text.startswith(f"{key}: ") else f"{key}: {text}")  # 'model: unknown (…)' as is
    return lines


def _grade_case(results: RunResults, require: str | None, unverified: str = "",
                subject: CertificateSubject | None = None) -> _Case:
    g = results.grade
    lines = [f"grade: {g.level} ({g.name})", f"required: {require or 'none'}"]
    subject = subject or certificate_subject(results)
    lines += _subject_lines(subject)
    lines.append(f"deployment: {subject.deployment_line()}")
    if unverified:
        lines.insert(0, f"UNVERIFIED: the results file was {unverified}; nothing vouches for this grade")
    if g.blockers:
        lines.append("blockers for the next level:")
        lines += [f"  - {b}" for b in g.blockers]
    if g.steps_not_run:
        lines.append("steps not run: " + ", ".join(map(str, g.steps_not_run)))
    if g.left_out:
        lines.append(f"not graded for this model (quantization: {results.model.quantization}): "
                     + ", ".join(g.left_out))
    if not results.complete:
        lines.append("the run is incomplete (interrupted)")
    case = _Case(classname=GRADE_SUITE, name="grade", time=0.0, outcome="pass", stdout=lines)
    if require is not None and not level_at_least(g.level, require):
        case.outcome, case.type = "failure", "GradeBelowRequired"
        case.message = f"grade {g.level} is below the required {require}"
        case.body = "\n".join(lines)
    return case


def _feature_case(row: TableRow, required: bool, suite: str = FEATURES_SUITE, noun: str = "feature") -> _Case:
    """A feature's (or a family's) testcase: passes when certified; otherwise a failure if
    ``--require-feature`` (``--require-family``) named it (so the JUnit verdict and the exit code
    agree), else skipped with its status — a failed check behind it is already a failure in its
    step's suite."""
    lines = [f"{row.name}: {row.description}", f"status: {row.label}", f"required: {'yes' if required else 'no'}",
             "checks: " + (", ".join(row.checks) or "none")]
    if isinstance(row, FamilyResult):
        lines.insert(2, f"model under test: {'of this family' if row.model else 'not of this family'}")
    elif isinstance(row, FeatureResult) and row.deployed:
        lines.insert(2, "deployed: the deployment under test (--serve) turns it on")
    case = _Case(classname=suite, name=row.name, time=0.0, outcome="pass", stdout=lines)
    if row.certified:
        return case
    if required:
        case.outcome, case.type = "failure", f"{noun.capitalize()}NotCertified"
        case.message = f"required {noun} {row.name}: {row.label}"
        case.body = "\n".join(lines)
    else:
        case.outcome, case.type, case.message = "skipped", row.status.value, row.label
    return case


def _subject_properties(subject: CertificateSubject) -> list[tuple[str, str]]:
    """The certificate subject as properties: always the model's name, source, digest,
    architecture, layers, dtype, quantization and the frameworks; a pretrained model's origin
    where recorded; one ``adaptcheck.framework.<name>`` per framework with its version."""
    m = subject.model
    optional = [("upstream", m.upstream), ("license", m.license), ("distribution", m.distribution),
                ("distribution_version", m.distribution_version), ("resolved", m.resolved),
                ("gguf_sha256", m.gguf_sha256)]
    return [
        ("adaptcheck.model", subject.model_label()),
        ("adaptcheck.model.requested", m.requested),
        ("adaptcheck.model.source", m.source or UNKNOWN),
        ("adaptcheck.model.sha256", m.weights_sha256 or UNKNOWN),
        ("adaptcheck.model.architecture", m.architecture or UNKNOWN),
        ("adaptcheck.model.layers", UNKNOWN if m.num_layers is None else str(m.num_layers)),
        ("adaptcheck.model.dtype", m.dtype),
        ("adaptcheck.model.quantization", m.quantization),
        *((f"adaptcheck.model.{key}", value) for key, value in optional if value),
        ("adaptcheck.frameworks", subject.frameworks_text()),
        *((f"adaptcheck.framework.{f.name}", f.version or UNKNOWN) for f in subject.frameworks),
    ]


def _deployment_properties(subject: CertificateSubject) -> list[tuple[str, str]]:
    """The deployment under test: ``adaptcheck.deployment`` (its one line) and ``.source`` always
    ('user', 'adaptcheck', or 'none' for a file older than results schema 1.7); for a deployment the
    user gave (``--serve``), the command as given, its digest and what the engine's parser read."""
    d = subject.deployment
    props = [("adaptcheck.deployment", subject.deployment_line()),
             ("adaptcheck.deployment.source", d.source if d is not None else "none")]
    given = subject.given_deployment()
    if given is None:
        return props
    return [
        *props,
        ("adaptcheck.deployment.command", shlex.join(given.command) if given.command else given.normalized),
        ("adaptcheck.deployment.digest", given.digest or UNKNOWN),
        ("adaptcheck.deployment.engine", given.engine),
        ("adaptcheck.deployment.engine_version", given.engine_version or UNKNOWN),
        ("adaptcheck.deployment.tensor_parallel_size", str(given.tensor_parallel_size)),
        ("adaptcheck.deployment.pipeline_parallel_size", str(given.pipeline_parallel_size)),
        # None: the model's own context length ('auto', as vLLM's parser names the default).
        ("adaptcheck.deployment.max_model_len", str(given.max_model_len) if given.max_model_len else "auto"),
        ("adaptcheck.deployment.kv_cache_dtype", given.kv_cache_dtype),
        ("adaptcheck.deployment.compile_mode", given.compile_mode),
        ("adaptcheck.deployment.features", ",".join(given.features)),
    ]


def _feature_properties(results: RunResults, required: list[str],
                        required_families: list[str]) -> list[tuple[str, str]]:
    """``adaptcheck.required_features`` and one ``adaptcheck.feature.<name>`` per feature with its
    status line; the same for families, and the model's families."""
    return [("adaptcheck.required_features", ",".join(required)),
            *((f"adaptcheck.feature.{row.name}", row.label) for row in results.feature_rows()),
            ("adaptcheck.model.families", ",".join(results.model.families)),
            ("adaptcheck.required_families", ",".join(required_families)),
            *((f"adaptcheck.family.{row.name}", row.label) for row in results.family_rows())]


def _properties(results: RunResults, require: str | None, unverified: str = "",
                subject: CertificateSubject | None = None, required: list[str] | None = None,
                required_families: list[str] | None = None) -> list[tuple[str, str]]:
    return [
        ("adaptcheck.verified", "false" if unverified else "true"),
        *([("adaptcheck.unverified", unverified)] if unverified else []),
        ("adaptcheck.run_id", results.run_id),
        ("adaptcheck.grade", results.grade.level),
        ("adaptcheck.grade_name", results.grade.name),
        ("adaptcheck.required", require or ""),
        ("adaptcheck.version", results.adaptcheck_version),
        ("adaptcheck.results_schema", results.schema_version),
        ("adaptcheck.digest", results.digest or "none"),
        ("adaptcheck.complete", str(results.complete).lower()),
        ("adaptcheck.ladder", f"{results.ladder.id} {results.ladder.version}"),
        ("adaptcheck.ladder_sha256", results.ladder.sha256),
        ("adaptcheck.device", f"{results.device.device_name} [{results.device.backend}]"),
        *_subject_properties(subject or certificate_subject(results)),
        *_deployment_properties(subject or certificate_subject(results)),
        *_feature_properties(results, required or [], required_families or []),
    ]


def _suites(results: RunResults, require: str | None, unverified: str = "",
            subject: CertificateSubject | None = None,
            required: list[str] | None = None,
            required_families: list[str] | None = None) -> list[tuple[str, list[_Case]]]:
    """(suite name, cases) per step in ladder order, then the grade suite, the features suite and
    the families suite."""
    result_ids = {c.id for c in results.checks}
    by_step: dict[int, list[_Case]] = {}
    for c in results.checks:
        by_step.setdefault(c.step, []).append(_result_case(c))
    for p in results.planned:
        if not _has_result(p, result_ids):
            by_step.setdefault(p.step, []).append(_not_run_case(p, results))
    suites = [(f"adaptcheck.step{s} {step_name(s)}", by_step[s]) for s in sorted(by_step)]
    suites.append((GRADE_SUITE, [_grade_case(results, require, unverified, subject)]))
    wanted = set(required or [])
    suites.append((FEATURES_SUITE, [_feature_case(row, row.name in wanted) for row in results.feature_rows()]))
    wanted_families = set(required_families or [])
    suites.append((FAMILIES_SUITE, [_feature_case(row, row.name in wanted_families, FAMILIES_SUITE, "family")
                                    for row in results.family_rows()]))
    return suites


def _count(cases: list[_Case], outcome: str) -> str:
    return str(sum(1 for c in cases if c.outcome == outcome))


def _case_element(parent: ET.Element, case: _Case) -> None:
    el = ET.SubElement(parent, "testcase", name=_text(case.name), classname=_text(case.classname),
                       time=_seconds(case.time))
    if case.outcome != "pass":
        child = ET.SubElement(el, case.outcome, message=_text(case.message), type=_text(case.type))
        if case.body:
            child.text = _text(case.body)
    if case.stdout:
        ET.SubElement(el, "system-out").text = _text("\n".join(case.stdout))


def junit_xml(results: RunResults, require: str | None = None, unverified: str = "",
              required_features: list[str] | None = None, required_families: list[str] | None = None) -> str:
    """The JUnit XML document of ``results`` (with declaration). ``require``: the level the
    caller gated on (``--require``), which decides whether the ``grade`` testcase fails.
    ``unverified``: why nothing vouches for the results file ('' when its digest matched).
    ``required_features``: the features the caller gated on (``--require-feature``), whose
    testcases fail when not certified; ``required_families`` the same for ``--require-family``."""
    started = results.started_at.astimezone(timezone.utc).replace(tzinfo=None)
    # junit-10.xsd leaves timestamp free, but Ant's schema wants no zone: naive UTC fits both.
    timestamp = started.isoformat(timespec="seconds")
    hostname = results.environment.hostname if results.environment else "unknown"
    subject = certificate_subject(results)
    suites = _suites(results, require, unverified, subject, required_features, required_families)
    every = [c for _, cases in suites for c in cases]
    root = ET.Element("testsuites", name="adaptcheck", tests=str(len(every)), failures=_count(every, "failure"),
                      errors=_count(every, "error"), time=_seconds(sum(c.time for c in every)))
    properties = _properties(results, require, unverified, subject, required_features, required_families)
    for index, (name, cases) in enumerate(suites):
        suite = ET.SubElement(root, "testsuite", name=_text(name), tests=str(len(cases)),
                              failures=_count(cases, "failure"), errors=_count(cases, "error"),
                              skipped=_count(cases, "skipped"), time=_seconds(sum(c.time for c in cases)),
                              timestamp=timestamp, hostname=_text(hostname), id=str(index),
                              package=name.split(" ")[0])
        props = ET.SubElement(suite, "properties")
        for key, value in properties:
            ET.SubElement(props, "property", name=key, value=_text(value))
        for case in cases:
            _case_element(suite, case)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(results: RunResults, path: Path, require: str | None = None, unverified: str = "",
                required_features: list[str] | None = None, required_families: list[str] | None = None) -> None:
    """Write :func:`junit_xml` to ``path`` (UTF-8, atomically, parent folders created).

    A path that cannot be written (a folder, no permission) is a one-line OutputError (exit 2).
    """
    write_text_atomic(Path(path), junit_xml(results, require, unverified, required_features, required_families),
                      what="JUnit XML")
