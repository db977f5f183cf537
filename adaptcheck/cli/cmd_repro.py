"""``adaptcheck repro RESULTS CHECK_ID``: the path of a check's standalone reproducer.

Prints ``<run folder>/repro/<check id>.py`` when the run wrote one (every failing step-3
case and step-4 comparison does); otherwise writes it from what results.json records of
that check — a step-3 op check's case parameters and seeds, a step-4 comparison's
``details["teacher_forced"]`` plus the sequences file the run stored under
``framework/teacher-*.json`` — and prints its path. Reads results.json through the digest
check like every command that acts on one. What a step-4 script does:
docs/step4-numerics.md ("Reproducers").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import typer
from pydantic import BaseModel, Field, ValidationError

from adaptcheck.base.errors import (
    InvalidInputError,
    UnknownNameError,
    UsageError,
    did_you_mean,
)
from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.framework_evidence import DivergenceStats, InstanceFacts, ReferenceEvidence
from adaptcheck.base.schemas.results import CheckResult, RunResults
from adaptcheck.base.trusted import ALLOW_HELP, ALLOW_OPTION, load_verified
from adaptcheck.cli.output import Output
from adaptcheck.repro.files import repro_path

T = TypeVar("T")


def _results_file(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path


def repro(
    results_path: Path = typer.Argument(..., metavar="RESULTS", help="results.json of a run, or its run folder."),
    check_id: str = typer.Argument(..., metavar="CHECK_ID", help="Check id as in results.json, e.g. ops.gemm.bf16."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=ALLOW_HELP),
) -> None:
    """Print the path of a check's standalone reproducer, writing it first if the run did not.

    The script needs torch (plus the vendor's extension; transformers/vLLM and the model
    folder for step 4), not adaptcheck: step 3 reruns the op on the check's exact inputs
    against the float64 reference, step 4 rescoring the model teacher-forced.

    Exit codes:
      0  printed (and written when there was none)
      2  unknown check id, or a check that has no reproducer (not step 3 or 4)
      3  results.json unreadable, or it does not record what the script needs
      5  results.json edited after its run or without digest (unless --allow-unverified)
    """
    out = Output()
    path = _results_file(results_path)
    results, _ = load_verified(path, allow_unverified)
    run_dir = path.parent
    by_id = {c.id: c for c in results.checks}
    check = by_id.get(check_id)
    if check is None:
        raise UnknownNameError(f"no check {check_id!r} in {path}", hint=did_you_mean(check_id, list(by_id)))
    written_by_run = check.evidence(RecordedRepro)
    recorded = written_by_run.repro if written_by_run is not None else None
    existing = run_dir / recorded if recorded else repro_path(run_dir, check_id)
    if existing.is_file() and existing.resolve().is_relative_to(run_dir.resolve()):
        typer.echo(str(existing))
        return
    written = _write(run_dir, results, check)
    out.info(f"wrote {written}", style="green")
    typer.echo(str(written))


class RecordedRepro(Evidence):
    """The part of any check's details this command reads first: the reproducer its run wrote."""

    repro: str | None = Field(default=None, description="Run-folder path of the reproducer (step 3 or 4).")


def _write(run_dir: Path, results: RunResults, check: CheckResult) -> Path:
    if check.kind == "ops.op" and check.step == 3:
        from adaptcheck.steps.ops.repro import write_recorded_repro

        if "op" not in check.details:
            raise InvalidInputError(f"{check.id} ({check.status.value}) records no op case to reproduce",
                                    hint=f"it says: {check.message}" if check.message else None)
        return write_recorded_repro(run_dir, check.id, check.details, results.device.torch_device,
                                    results.device.backend)
    if check.step == 4:
        return _write_model(run_dir, results, check)
    raise UsageError(f"{check.id} (step {check.step}, kind {check.kind}) has no reproducer",
                     hint="reproducers exist for step-3 op checks and step-4 teacher-forced comparisons")


def _write_model(run_dir: Path, results: RunResults, check: CheckResult) -> Path:
    from adaptcheck.repro.model import ModelReproSpec, ReproSequence, write_model_repro

    evidence = check.evidence(ReferenceEvidence)
    tf = evidence.teacher_forced if evidence is not None else None
    if tf is None or tf.method != "teacher_forced":
        why = "it fell back to greedy comparison" if tf is not None else "it records no teacher-forced comparison"
        raise InvalidInputError(f"{check.id}: cannot write a reproducer: {why} (details.teacher_forced)",
                                hint="only a step-4 check that scored the sequences teacher-forced has one")
    assert evidence is not None  # tf came from it
    stored = _teacher_file(run_dir, check.id)
    if not stored.sequences:
        raise InvalidInputError(f"{check.id}: the run folder's framework/teacher-*.json holds no sequences",
                                hint="the sequences are stored by the run; rerun step 4 to get them")
    # The loaded instance's describe() facts (dtype, device, attention, url…) are the extras.
    fw = InstanceFacts.model_validate(evidence.framework.extras)
    model_path = evidence.model.path if evidence.model is not None else None
    bounds = tf.bounds or {}
    device = tf.device or DivergenceStats()
    try:
        spec = ModelReproSpec(
            framework=evidence.framework.name,
            model_path=str(model_path or results.model.name),
            dtype=str(fw.dtype or results.model.precision),
            device=str(fw.device or results.device.torch_device),
            attn_implementation=fw.attention,
            sequences=[ReproSequence(token_ids=s.token_ids, start=s.start) for s in stored.sequences],
            top_k=_required(tf.top_k, "top_k"),
            bound_kl_mean=_required(bounds["kl_mean"].bound, "bound"),
            bound_kl_p99=_required(bounds["kl_p99"].bound, "bound"),
            observed_kl_mean=_required(device.kl_mean, "device.kl_mean"),
            observed_kl_p99=_required(device.kl_p99, "device.kl_p99"),
            endpoint_url=fw.url, served_model=fw.served_model,
            reference_top_k=stored.top_k or _reference_top_k(),
            reference_dtype=stored.dtype or "fp64",
            reference_attn_implementation=stored.attention or "sdpa",
        )
        return write_model_repro(run_dir, check.id, spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"{check.id}: results.json's teacher-forced record is incomplete ({type(exc).__name__}:"
                                f" {exc})", hint="rerun step 4 with this adaptcheck") from None


def _required(value: T | None, name: str) -> T:
    """A field the reproducer cannot do without (KeyError naming it when the record lacks it)."""
    if value is None:
        raise KeyError(name)
    return value


class _StoredSequence(BaseModel):
    """One teacher-forced sequence of the run's teacher file."""

    token_ids: list[int] = Field(description="prompt + continuation.")
    start: int = Field(description="First scored position.")


class _TeacherFile(BaseModel):
    """framework/teacher-*.json as the reproducer reads it (the run's reference answers)."""

    sequences: list[_StoredSequence] = Field(default_factory=list, description="The sequences scored.")
    dtype: str | None = Field(default=None, description="The reference's dtype.")
    attention: str | None = Field(default=None, description="The reference's attention implementation.")
    top_k: int | None = Field(default=None, description="The reference's top-K (from the file's name).")


def _teacher_file(run_dir: Path, check_id: str) -> _TeacherFile:
    """The sequences the run stored (framework/teacher-*.json): the newest one."""
    from adaptcheck.base import safejson

    files = sorted((run_dir / "framework").glob("teacher-*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise InvalidInputError(f"{check_id}: no framework/teacher-*.json in {run_dir} (the teacher-forced sequences)",
                                hint="the run stores them in its folder; rerun step 4 if the folder was trimmed")
    data = safejson.load_file(files[-1], what="teacher-forced sequences", missing_hint="rerun step 4")
    if not isinstance(data, dict):
        raise InvalidInputError(f"{files[-1]}: expected a JSON object")
    # The reference's top-K is in the name (teacher-<key>-k<K>.json), not in the file.
    k = re.search(r"-k(\d+)\.json$", files[-1].name)
    try:
        return _TeacherFile.model_validate({**data, "top_k": int(k.group(1)) if k else None})
    except ValidationError as exc:
        raise InvalidInputError(f"{files[-1]}: not a teacher-forced sequences file ({exc.errors()[0]['msg']})",
                                hint="rerun step 4 to get them") from None


def _reference_top_k() -> int:
    from adaptcheck.steps.ops.tolerance import load_policy

    return int(load_policy().model_numerics.reference_top_k)
