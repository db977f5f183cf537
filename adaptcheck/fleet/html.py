"""The fleet matrix as one self-contained HTML page: view data first, then the template.

Device names, hostnames, versions and blockers come from the machines being merged (and
from third-party plugins), so they are untrusted text: the template is autoescaped and the
page forbids every script and network load through its Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptcheck.fleet.models import KNOWN_GOOD_MIN_LEVEL, Combination, FleetMatrix
from adaptcheck.fleet.stack import version_label

# In the run report's template folder (shipped in the wheel); imported only when HTML is written,
# so merging to JSON/YAML never loads the report package.
TEMPLATE = "fleet.html.j2"
LEVEL_NAMES = {"L0": "none", "L1": "device usable", "L2": "model runs", "L3": "service usable",
               "L4": "performance optimizable", "L5": "production sustainable"}


@dataclass
class VersionCell:
    label: str
    value: str


@dataclass
class RunCell:
    run_id: str
    host: str
    started: str
    grade: str
    ladder: str
    # Set when the stored grade or the file's digest says the file was edited after the run
    # (or it has no digest): such a run was merged only with --allow-unverified.
    warning: str


@dataclass
class RowView:
    id: str
    latest_grade: str
    latest_name: str
    best_grade: str
    devices: str
    device_count: int
    backend: str
    arch: str
    versions: list[VersionCell]
    plugins: list[str]
    hosts: list[str]
    runs: list[RunCell]
    ladders: str
    dates: str
    blockers: list[str]
    known_good: bool
    known_good_reason: str
    verified: bool  # False when any of its runs was merged unverified


@dataclass
class SkipView:
    path: str
    reason: str


@dataclass
class FleetView:
    title: str
    generated: str
    adaptcheck_version: str
    summary: str
    min_level: str
    rows: list[RowView]
    skipped: list[SkipView]


def _date(row: Combination) -> str:
    first, last = row.first_started.date().isoformat(), row.last_started.date().isoformat()
    return first if first == last else f"{first} – {last}"


def _warning(grade: str, stored: str, integrity: str) -> str:
    notes = []
    if stored != grade:
        notes.append(f"file claims {stored}, its checks give {grade}")
    if integrity == "edited":
        notes.append("UNVERIFIED: file edited after the run (digest mismatch)")
    elif integrity == "no_digest":
        notes.append("UNVERIFIED: file carries no digest")
    return "; ".join(notes)


def build_row(row: Combination) -> RowView:
    """One combination as the page shows it."""
    return RowView(
        id=row.id, latest_grade=row.latest_grade, latest_name=LEVEL_NAMES.get(row.latest_grade, ""),
        best_grade=row.best_grade, devices=", ".join(row.key.devices), device_count=row.key.device_count,
        backend=row.key.backend, arch=row.key.arch,
        versions=[VersionCell(version_label(k), v) for k, v in row.key.versions.items()],
        plugins=row.key.plugins, hosts=row.hosts,
        runs=[RunCell(r.run_id, r.host, r.started_at.strftime("%Y-%m-%d %H:%M UTC"), r.grade, r.ladder,
                      _warning(r.grade, r.stored_grade, r.integrity)) for r in reversed(row.runs)],
        ladders=", ".join(row.ladders), dates=_date(row), blockers=row.latest_blockers,
        known_good=row.known_good, known_good_reason=row.known_good_reason, verified=row.verified,
    )


def build_fleet_view(matrix: FleetMatrix) -> FleetView:
    """The whole page's data."""
    hosts = {h for r in matrix.rows for h in r.hosts}
    summary = (f"{matrix.merged_runs} run(s) from {len(hosts)} host(s) in {len(matrix.rows)} combination(s); "
               f"{len(matrix.skipped)} of {matrix.inputs} input(s) skipped")
    unverified = sum(1 for r in matrix.rows for run in r.runs if not run.verified)
    if unverified:
        summary += f"; {unverified} run(s) UNVERIFIED (edited after the run or no digest, merged with --allow-unverified)"
    return FleetView(
        title="adaptcheck fleet compatibility matrix", generated=matrix.generated_at.strftime("%Y-%m-%d %H:%M UTC"),
        adaptcheck_version=matrix.adaptcheck_version, summary=summary, min_level=KNOWN_GOOD_MIN_LEVEL,
        rows=[build_row(r) for r in matrix.rows], skipped=[SkipView(s.path, s.reason) for s in matrix.skipped],
    )


def render_fleet(matrix: FleetMatrix) -> str:
    """The matrix page as one HTML string, through the report's autoescaping template environment."""
    from adaptcheck.report.render import render_template

    return render_template(TEMPLATE, v=build_fleet_view(matrix))
