"""``adaptcheck repro RESULTS CHECK_ID``: the path of a check's standalone reproducer.

Prints ``<run folder>/repro/<check id>.py`` when the run wrote one (every failing step-3
case and step-4 comparison does); otherwise writes it from what results.json records of
that check — a step-3 op check's case parameters and seeds, a step-4 comparison's
``details["teacher_forced"]`` plus the sequences file the run stored under
``framework/teacher-*.json`` — and prints its path. Reads results.json through the digest
check like every command that acts on one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from adaptcheck.base.errors import (
    InvalidInputError,
    UnknownNameError,
    UsageError,
    did_you_mean,
)
from adaptcheck.base.schemas.framework_evidence import FrameworkCheckEvidence
from adaptcheck.base.schemas.results import CheckResult, RunResults
from adaptcheck.base.trusted import ALLOW_HELP, ALLOW_OPTION, load_verified
from adaptcheck.cli.output import Output
from adaptcheck.repro.files import repro_path


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
    recorded = check.details.get("repro")
    existing = run_dir / recorded if isinstance(recorded, str) and recorded else repro_path(run_dir, check_id)
    if existing.is_file() and existing.resolve().is_relative_to(run_dir.resolve()):
        typer.echo(str(existing))
        return
    written = _write(run_dir, results, check)
    out.info(f"wrote {written}", style="green")
    typer.echo(str(written))


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
    from adaptcheck.repro.model import ModelReproSpec, write_model_repro

    tf = check.details.get("teacher_forced")
    if not isinstance(tf, dict) or tf.get("method") != "teacher_forced":
        why = "it fell back to greedy comparison" if isinstance(tf, dict) else "it records no teacher-forced comparison"
        raise InvalidInputError(f"{check.id}: cannot write a reproducer: {why} (details.teacher_forced)",
                                hint="only a step-4 check that scored the sequences teacher-forced has one")
    data = _teacher_file(run_dir, check.id)
    sequences = data.get("sequences") if isinstance(data, dict) else None
    if not isinstance(sequences, list) or not sequences:
        raise InvalidInputError(f"{check.id}: the run folder's framework/teacher-*.json holds no sequences",
                                hint="the sequences are stored by the run; rerun step 4 to get them")
    evidence = check.evidence(FrameworkCheckEvidence)
    if evidence is None:
        raise InvalidInputError(f"{check.id}: cannot write a reproducer: its details name no framework "
                                "(details.framework)", hint="rerun step 4 with this adaptcheck")
    # The loaded instance's describe() facts (dtype, device, attention, url…) are the extras.
    fw: dict[str, Any] = evidence.framework.extras
    model_path = evidence.model.path if evidence.model is not None else None
    bounds = tf.get("bounds", {})
    device = tf.get("device", {})
    try:
        spec = ModelReproSpec(
            framework=evidence.framework.name,
            model_path=str(model_path or results.model.name),
            dtype=str(fw.get("dtype") or results.model.precision),
            device=str(fw.get("device") or results.device.torch_device),
            attn_implementation=fw.get("attention"),
            sequences=[{"token_ids": [int(t) for t in s["token_ids"]], "start": int(s["start"])} for s in sequences],
            top_k=int(tf["top_k"]),
            bound_kl_mean=float(bounds["kl_mean"]["bound"]), bound_kl_p99=float(bounds["kl_p99"]["bound"]),
            observed_kl_mean=float(device["kl_mean"]), observed_kl_p99=float(device["kl_p99"]),
            endpoint_url=fw.get("url"), served_model=fw.get("served_model"),
            reference_top_k=int(data.get("_top_k") or _reference_top_k()),
            reference_dtype=str(data.get("dtype") or "fp64"),
            reference_attn_implementation=data.get("attention") or "sdpa",
        )
        return write_model_repro(run_dir, check.id, spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"{check.id}: results.json's teacher-forced record is incomplete ({type(exc).__name__}:"
                                f" {exc})", hint="rerun step 4 with this adaptcheck") from None


def _teacher_file(run_dir: Path, check_id: str) -> dict[str, Any]:
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
    return {**data, "_top_k": int(k.group(1)) if k else None}


def _reference_top_k() -> int:
    from adaptcheck.steps.ops.tolerance import load_policy

    return int(load_policy().model_numerics.reference_top_k)
