"""The run folder: its file names, ``run.json``'s schema, and results assembled and graded.

What the session writes and what every later reader (``adaptcheck grade``/``report``/
``compare``, ``perf.regression`` mid-run, ``adaptcheck fleet``) reads back, so they agree
on names and on how a grade is computed without importing the session that ran it.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import adaptcheck
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.ladder import LadderSpec, Quantization
from adaptcheck.base.schemas.results import (
    CheckResult,
    DeviceRef,
    LadderRef,
    PlannedCheck,
    RunResults,
    utcnow,
)
from adaptcheck.frameworks.modelsrc import is_named_model
from adaptcheck.grade import compute_features, compute_grade

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
    model: str | None = Field(default=None, description="--model: model used instead of the ladder's ('auto', 'pretrained:NAME', "
                         "'embedded:NAME', a local folder or a .gguf file).")
    model_auto: str | None = Field(default=None, description="What the model name 'auto' stood for when the run started "
                                   "('pretrained:NAME' or 'embedded:tiny-llama'); a resume refuses to go on where 'auto' "
                                   "now stands for another model. None when the run's model is not 'auto'.")
    endpoint: str | None = Field(default=None, description="--endpoint: base URL of an OpenAI-compatible server under test "
                                 "(credentials redacted: a resume is given --endpoint again).")
    endpoint_model: str | None = Field(default=None, description="--endpoint-model: served model name to request.")
    baseline: str | None = Field(default=None, description="--baseline: the results file given (copied to baseline.json "
                                 "beside this file).")


def planned_checks(spec: LadderSpec) -> list[PlannedCheck]:
    from adaptcheck.ladder.registry import kind_label

    return [PlannedCheck(id=c.id, step=c.step, kind=c.kind, kind_label=kind_label(c.kind), description=c.description,
                         tags=c.tags, timeout_s=spec.timeout_for(c)) for c in spec.checks]


def hf_quantization(folder: Path) -> Quantization | None:
    """The quantization a local Hugging Face model folder declares (config.json's
    ``quantization_config``): 'none' without one, None when there is no readable config."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant is None:
        return "none"
    if not isinstance(quant, dict):
        return "other"  # declared but unreadable: the strict reading
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    if method == "compressed-tensors":
        # W8A8 when every group quantizes weights and input activations to 8 bits of one type.
        groups = quant.get("config_groups")
        kinds = {_w8a8_kind(g) for g in groups.values()} if isinstance(groups, dict) else set()
        if kinds == {"int"}:
            return "int8_w8a8"
        if kinds == {"float"}:
            return "fp8"
    # GPTQ, AWQ, bitsandbytes, mixed groups …: formats without their own tag, so every
    # quantized check counts.
    return "other"


def _w8a8_kind(group: object) -> str | None:
    if not isinstance(group, dict):
        return None
    w, a = group.get("weights") or {}, group.get("input_activations") or {}
    if not (isinstance(w, dict) and isinstance(a, dict)):
        return None
    if w.get("num_bits") == 8 and a.get("num_bits") == 8 and w.get("type") == a.get("type"):
        return str(w.get("type"))
    return None


def with_run_model(spec: LadderSpec, meta: RunMeta) -> LadderSpec:
    """The ladder as this run executes it: ``--model`` replaces the ladder's model, with the
    quantization a local model folder declares."""
    if meta.model is None:
        return spec
    update: dict[str, str] = {"name": meta.model}
    # A named model (embedded:, pretrained:, auto) or a converted .gguf is unquantized (bf16).
    declared = None if is_named_model(meta.model) else hf_quantization(Path(meta.model))
    if declared is not None:
        update["quantization"] = declared
    return spec.model_copy(update={"model": spec.model.model_copy(update=update)})


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
    planned = planned_checks(spec)
    all_done = all(c.id in done for c in spec.checks if c.step in meta.steps)
    return RunResults(
        adaptcheck_version=adaptcheck.__version__, run_id=meta.run_id, started_at=meta.started_at,
        finished_at=utcnow() if complete and all_done else None, complete=complete and all_done,
        command=meta.command, ladder=meta.ladder, seed=meta.seed, steps=meta.steps, device=meta.device,
        environment=environment, planned=planned, grade_rules=spec.grade, checks=checks, model=spec.model,
        grade=compute_grade(spec.grade, planned, checks, meta.steps, meta.device.device_count, spec.model.precision,
                            spec.model.quantization),
        features=compute_features(planned, checks, meta.steps),
    )


def regrade(results: RunResults) -> RunResults:
    """Recompute the grade and the features table from the file's own checks and rules (what
    ``adaptcheck grade`` trusts)."""
    grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps,
                          results.device.device_count, results.model.precision, results.model.quantization)
    features = compute_features(results.planned, results.checks, results.steps)
    return results.model_copy(update={"grade": grade, "features": features})


def write_outputs(results: RunResults, run_dir: Path) -> None:
    """Scrub the run folder, then write results.json and the HTML report rendered from it."""
    from adaptcheck.base.redact import scrub_text, scrub_tree
    from adaptcheck.report import write_report

    # One redaction for every file of the run: what the worker and its servers wrote directly
    # (worker.log, server logs, perf/*/*.jsonl) is scrubbed in place, before results.json is
    # sealed with its digest and the report is rendered (neither then holds a secret).
    scrub_tree(run_dir)
    # Last line of defence: a secret's value must not leave the machine through a message.
    results = RunResults.model_validate_json(scrub_text(results.model_dump_json()))
    results.save(run_dir / RESULTS)
    write_report(results, run_dir / REPORT)


def stored_meta(meta: RunMeta) -> RunMeta:
    """``meta`` as run.json keeps it: every string scrubbed (``--endpoint http://user:token@host``
    → ``http://***REDACTED***@host``, and the same in the command line)."""
    from adaptcheck.base.redact import scrub_text

    return RunMeta.model_validate_json(scrub_text(meta.model_dump_json()))
