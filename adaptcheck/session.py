"""A run from start to report: the one library function behind ``adaptcheck run``.

Lays out the run folder (``run.json`` with what is needed to reproduce or resume,
``ladder.yaml`` snapshot, ``checks.jsonl`` journal, ``worker.log``, and ``baseline.json``
with ``--baseline``), executes the selected checks through the isolated runner, and writes
``results.json`` and ``report.html``. A run that was killed is finished by
:func:`resume_run` from the same folder.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import adaptcheck
from adaptcheck.backends.base import Backend
from adaptcheck.backends.registry import get_backend, select_backend
from adaptcheck.errors import DeviceError, IntegrityError, InvalidInputError, UsageError
from adaptcheck.ladder.loader import load_ladder, parse_ladder
from adaptcheck.ladder.runner import JournalWriter, PlannedRun, execute
from adaptcheck.models.ladder import CheckSpec, LadderSpec
from adaptcheck.models.environment import Environment
from adaptcheck.models.results import (
    CheckResult,
    DeviceRef,
    LadderRef,
    PlannedCheck,
    RunResults,
    utcnow,
)
from adaptcheck.paths import default_reports_dir
from adaptcheck.steps.grade import compute_grade

RUN_META = "run.json"
LADDER_SNAPSHOT = "ladder.yaml"
JOURNAL = "checks.jsonl"
WORKER_LOG = "worker.log"
RESULTS = "results.json"
BASELINE = "baseline.json"
"""``--baseline``: a verbatim copy of the earlier run's results, so the folder is self-contained
(and resumable); the ``perf.regression`` check reads it."""
REPORT = "report.html"


class RunMeta(BaseModel):
    """``run.json``: everything needed to resume or reproduce a run."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="Run id.")
    started_at: datetime = Field(description="Start (UTC).")
    command: list[str] = Field(description="Command line.")
    ladder: LadderRef = Field(description="Ladder reference; its text is in ladder.yaml beside this file.")
    seed: int = Field(description="Seed.")
    steps: list[int] = Field(description="Steps selected.")
    device: DeviceRef = Field(description="Device under test.")
    device_index: int = Field(default=0, description="Device index used.")
    op_provider: str | None = Field(default=None, description="--ops: provider for every step-3 op check.")
    model: str | None = Field(default=None, description="--model: model used instead of the ladder's ('embedded:NAME' or a local path).")
    endpoint: str | None = Field(default=None, description="--endpoint: base URL of an OpenAI-compatible server under test.")
    endpoint_model: str | None = Field(default=None, description="--endpoint-model: served model name to request.")
    baseline: str | None = Field(default=None, description="--baseline: the results file given (copied to baseline.json "
                                 "beside this file).")


@dataclass
class RunOptions:
    """What ``adaptcheck run`` was asked for."""

    ladder: str = "quick"
    device: str | None = None
    steps: list[int] | None = None
    out: Path | None = None
    seed: int = 0
    ops: str | None = None
    model: str | None = None
    endpoint: str | None = None
    endpoint_model: str | None = None
    baseline: Path | None = None
    command: list[str] = field(default_factory=list)


class Progress:
    """Callbacks the CLI implements to show progress; the default shows nothing."""

    def planned(self, checks: list[CheckSpec]) -> None: ...

    def started(self, spec: CheckSpec) -> None: ...

    def finished(self, spec: CheckSpec, results: list[CheckResult]) -> None: ...


def parse_steps(text: str | None, available: list[int]) -> list[int]:
    """'2,3' or '1-3' → [2, 3]; None → every step of the ladder."""
    if not text:
        return sorted(available)
    steps: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                steps.update(range(lo, hi + 1))
            elif part:
                steps.add(int(part))
    except ValueError:
        raise UsageError(f"--steps {text!r} is not a list of step numbers", hint="e.g. --steps 1,2 or --steps 2-3") from None
    bad = sorted(s for s in steps if s not in range(1, 6))
    if bad:
        raise UsageError(f"--steps: no step {bad[0]}", hint="steps are 1-5 (6, the grade, always runs)")
    return sorted(steps)


def _device_ref(backend: Backend, index: int, count: int) -> DeviceRef:
    try:
        name = backend.device_name(index)
    except Exception as exc:  # noqa: BLE001 - the name is informative only
        name = f"{backend.display_name} (name unavailable: {type(exc).__name__})"
    return DeviceRef(backend=backend.name, display_name=backend.display_name,
                     torch_device=str(backend.torch_device(index)), device_name=name, device_count=count)


def _planned(spec: LadderSpec) -> list[PlannedCheck]:
    return [PlannedCheck(id=c.id, step=c.step, kind=c.kind, description=c.description, tags=c.tags,
                         timeout_s=spec.timeout_for(c)) for c in spec.checks]


def new_run_dir(out: Path | None, run_id: str) -> Path:
    """``--out DIR`` as given (must be empty or new), else reports/<run_id>/."""
    target = out if out is not None else default_reports_dir() / run_id
    if target.exists() and any(target.iterdir()):
        raise UsageError(f"--out {target} already holds files", hint="choose a new folder, or use --resume to finish that run")
    target.mkdir(parents=True, exist_ok=True)
    return target


def start_run(opts: RunOptions, progress: Progress | None = None) -> tuple[RunResults, Path]:
    """Run a ladder from the start. Returns the results and the run folder."""
    # A bad baseline is a one-line error before anything runs or any folder is made.
    baseline_text = _baseline_text(opts.baseline) if opts.baseline is not None else None
    ladder = load_ladder(opts.ladder)
    steps = parse_steps(",".join(map(str, opts.steps)) if opts.steps else None, sorted({c.step for c in ladder.spec.checks}))
    backend, probe = select_backend(opts.device)
    started = utcnow()
    run_id = f"{started.strftime('%Y%m%d-%H%M%S')}-{backend.name}-{secrets.token_hex(3)}"
    run_dir = new_run_dir(opts.out, run_id)
    meta = RunMeta(
        run_id=run_id, started_at=started, command=opts.command,
        ladder=LadderRef(id=ladder.spec.id, version=ladder.spec.version, source=ladder.source, sha256=ladder.sha256),
        seed=opts.seed, steps=steps, device=_device_ref(backend, 0, probe.device_count), op_provider=opts.ops,
        model=opts.model, endpoint=opts.endpoint, endpoint_model=opts.endpoint_model,
        baseline=str(opts.baseline) if opts.baseline is not None else None,
    )
    if baseline_text is not None:
        (run_dir / BASELINE).write_text(baseline_text, encoding="utf-8")
    (run_dir / LADDER_SNAPSHOT).write_text(ladder.text, encoding="utf-8")
    (run_dir / RUN_META).write_text(meta.model_dump_json(indent=2), encoding="utf-8")
    return _continue(run_dir, meta, ladder.spec, backend, progress), run_dir


def _baseline_text(path: Path) -> str:
    """The text of a ``--baseline`` file, once it is known to load as results and not to have
    been edited since its run (an edited baseline could hide a regression). A file from before
    digests existed (schema 1.0) is accepted: the comparison says which baseline it used."""
    from adaptcheck.integrity import Integrity, verify_file

    RunResults.load(path)
    check = verify_file(path)
    if check.status is Integrity.EDITED:
        raise IntegrityError(f"--baseline: {check.message}",
                             hint="use the results.json exactly as its run wrote it ('adaptcheck verify' checks it)")
    return path.read_text(encoding="utf-8")


def resume_run(run_dir: Path, progress: Progress | None = None) -> tuple[RunResults, Path]:
    """Finish a run whose process was killed: skip checks already in the journal."""
    meta_path = run_dir / RUN_META
    if not meta_path.is_file():
        raise InvalidInputError(f"{run_dir}: not a run folder (no {RUN_META})", hint="pass the folder a run wrote")
    try:
        meta = RunMeta.model_validate_json(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InvalidInputError(f"{meta_path}: unreadable run metadata: {str(exc).splitlines()[0]}") from None
    spec = parse_ladder((run_dir / LADDER_SNAPSHOT).read_text(encoding="utf-8"), str(run_dir / LADDER_SNAPSHOT))
    backend = get_backend(meta.device.backend)
    probe = backend.probe()
    if not probe.available:
        raise DeviceError(f"device {meta.device.backend!r} of this run is not available now: {probe.reason}")
    return _continue(run_dir, meta, spec, backend, progress), run_dir


def _continue(run_dir: Path, meta: RunMeta, spec: LadderSpec, backend: Backend, progress: Progress | None) -> RunResults:
    progress = progress or Progress()
    spec = with_run_model(spec, meta)
    journal = JournalWriter(run_dir / JOURNAL)
    done = journal.read()
    selected = [c for c in spec.checks if c.step in meta.steps]
    progress.planned(selected)
    todo = []
    for c in selected:
        if c.id in done:
            progress.finished(c, done[c.id])
        else:
            todo.append(PlannedRun(c, spec.timeout_for(c)))
    init = {"backend": backend.name, "device_index": meta.device_index, "seed": meta.seed,
            "run_dir": str(run_dir), "model": spec.model.model_dump(mode="json"),
            "device_count": meta.device.device_count, "op_provider": meta.op_provider,
            "endpoint": {"url": meta.endpoint, "model": meta.endpoint_model, "reference": meta.model is not None}
            if meta.endpoint else None}
    try:
        execute(todo, init, journal, run_dir / WORKER_LOG, on_start=progress.started, on_done=progress.finished)
    except KeyboardInterrupt:
        # Ctrl-C: still leave a readable (incomplete) results.json and report of what finished.
        write_outputs(assemble(meta, spec, journal.read(), complete=False), run_dir)
        raise
    results = assemble(meta, spec, journal.read(), complete=True)
    write_outputs(results, run_dir)
    return results


def with_run_model(spec: LadderSpec, meta: RunMeta) -> LadderSpec:
    """The ladder as this run executes it: ``--model`` replaces the ladder's model."""
    if meta.model is None:
        return spec
    return spec.model_copy(update={"model": spec.model.model_copy(update={"name": meta.model})})


def assemble(meta: RunMeta, spec: LadderSpec, done: dict[str, list[CheckResult]], complete: bool) -> RunResults:
    """Results in ladder order, the environment lifted out of the capture check, the grade computed."""
    checks: list[CheckResult] = []
    environment: Environment | None = None
    for c in spec.checks:
        for r in done.get(c.id, []):
            env = r.details.pop("environment", None) if r.kind == "matrix.capture" else None
            if env is not None:
                environment = Environment.model_validate(env)
            checks.append(r)
    planned = _planned(spec)
    all_done = all(c.id in done for c in spec.checks if c.step in meta.steps)
    return RunResults(
        adaptcheck_version=adaptcheck.__version__, run_id=meta.run_id, started_at=meta.started_at,
        finished_at=utcnow() if complete and all_done else None, complete=complete and all_done,
        command=meta.command, ladder=meta.ladder, seed=meta.seed, steps=meta.steps, device=meta.device,
        environment=environment, planned=planned, grade_rules=spec.grade, checks=checks, model=spec.model,
        grade=compute_grade(spec.grade, planned, checks, meta.steps, meta.device.device_count, spec.model.precision),
    )


def regrade(results: RunResults) -> RunResults:
    """Recompute the grade from the file's own checks and rules (what ``adaptcheck grade`` trusts)."""
    grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps,
                          results.device.device_count, results.model.precision)
    return results.model_copy(update={"grade": grade})


def write_outputs(results: RunResults, run_dir: Path) -> None:
    """results.json, then the HTML report rendered from it."""
    from adaptcheck.report import write_report
    from adaptcheck.steps.matrix.redact import scrub_text

    # Last line of defence: a secret's value must not leave the machine through a message.
    results = RunResults.model_validate_json(scrub_text(results.model_dump_json()))
    results.save(run_dir / RESULTS)
    write_report(results, run_dir / REPORT)
