"""Shared human renderings for the CLI: the per-step summary and the grade with blockers.

Everything is printed through :class:`~adaptcheck.cli.output.Output`, whose every line is
scrubbed of secrets and of terminal controls (a device name or a check message from a results
file is untrusted text).
"""

from __future__ import annotations

from collections import Counter

from adaptcheck.base.features import FeatureStatus
from adaptcheck.base.schemas.certificate import certificate_subject, subject_label
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.cli.output import Output

STEP_NAMES = {1: "compatibility matrix", 2: "tensor smoke", 3: "operator numerics", 4: "framework bring-up",
              5: "performance baseline"}


def print_summary(out: Output, results: RunResults) -> None:
    """One row per step: counts of each status and the time spent."""
    rows = []
    for step in sorted({p.step for p in results.planned}):
        checks = [c for c in results.checks if c.step == step]
        if step not in results.steps:
            rows.append([step, STEP_NAMES.get(step, ""), "-", "-", "-", "-", "-", "not run"])
            continue
        counts = Counter(c.label for c in checks)
        rows.append([step, STEP_NAMES.get(step, ""), counts["pass"], counts["fail"], counts["error"], counts["skip"],
                     counts["n/a"], f"{sum(c.duration_s for c in checks):.1f}s"])
    out.table("Summary", ["step", "name", "pass", "fail", "error", "skip", "n/a", "time"], rows)


def print_grade(out: Output, results: RunResults) -> None:
    """The grade line, what it certifies (model, digest, dtype, frameworks), the deployment under test
    (one line: :meth:`Deployment.summary`), the features table's summary and the blockers for the next level."""
    g = results.grade
    out.info(f"Grade: {g.level} ({g.name}) on {results.device.device_name} [{results.device.backend}]",
             style="bold green" if g.level != "L0" else "bold red")
    subject = certificate_subject(results)
    out.info(f"{subject_label(g.level)}: {subject.line()}")
    # What the grade is for: the --serve command, or (said as plainly) adaptcheck's own settings.
    out.info(f"Deployment: {subject.deployment_line()}",
             style=None if subject.given_deployment() is not None else "yellow")
    print_features(out, results)
    if g.steps_not_run:
        out.info(f"Steps not run: {', '.join(map(str, g.steps_not_run))}", style="yellow")
    if g.blockers:
        out.info("Blockers for the next level:", style="bold")
        for b in g.blockers:
            # One line each (a check message may span lines): a CI log reader greps "  - ".
            out.info("  - " + " ".join(b.split()))


def print_features(out: Output, results: RunResults) -> None:
    """The features and the families tables, each in one line when nothing was tested, else one
    line per status: ``Features certified: spec_decode, fp8_kv_cache`` … (reasons: --format json).
    The families line names the model's own families first: ``Families (model: dense) …``."""
    _print_table(out, "Features", "feature", [(row.name, row.status) for row in results.feature_rows()])
    model = ", ".join(results.model.families) or "unknown"
    _print_table(out, f"Families (model: {model})", "family",
                 [(row.name, row.status) for row in results.family_rows()])
    if results.model.family_note:
        out.info(f"Model family: {results.model.family_note}", style="yellow")


def _print_table(out: Output, title: str, noun: str, rows: list[tuple[str, FeatureStatus]]) -> None:
    by_status: dict[FeatureStatus, list[str]] = {}
    for name, status in rows:
        by_status.setdefault(status, []).append(name)
    if set(by_status) <= {FeatureStatus.NOT_TESTED}:
        out.info(f"{title}: none tested (no check of this run is tagged {noun}:NAME)")
        return
    styles = {FeatureStatus.CERTIFIED: "green", FeatureStatus.FAILED: "bold red"}
    for status in FeatureStatus:
        if status in by_status:
            out.info(f"{title} {status.value}: {', '.join(by_status[status])}", style=styles.get(status))
