"""The run folder: its file names, ``run.json``'s schema, and results assembled and graded.

What the session writes and what every later reader (``adaptcheck grade``/``report``/
``compare``, ``perf.regression`` mid-run, ``adaptcheck fleet``) reads back, so they agree
on names and on how a grade is computed without importing the session that ran it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import adaptcheck
from adaptcheck.base.families import FAMILY_TAG, UNKNOWN, read_families
from adaptcheck.base.features import feature_names
from adaptcheck.base.schemas.deployment import Deployment
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
from adaptcheck.frameworks.modelfamily import named_families
from adaptcheck.frameworks.modelfiles import read_config
from adaptcheck.frameworks.modelsrc import is_named_model
from adaptcheck.grade import compute_families, compute_features, compute_grade

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
    deployment: Deployment | None = Field(default=None, description="--serve: the deployment under test as the engine's "
                                          "parser read it (None: adaptcheck's own deployment).")
    reference_memory: int | None = Field(default=None, description="--reference-memory in bytes (None: half of the "
                                         "host's free memory).")


def planned_checks(spec: LadderSpec) -> list[PlannedCheck]:
    from adaptcheck.ladder.registry import kind_label

    return [PlannedCheck(id=c.id, step=c.step, kind=c.kind, kind_label=kind_label(c.kind), description=c.description,
                         tags=c.tags, timeout_s=spec.timeout_for(c)) for c in spec.checks]


def hf_quantization(folder: Path) -> Quantization | None:
    """The quantization a local Hugging Face model folder declares (config.json's
    ``quantization_config``): 'none' without one, None when there is no readable config."""
    config = read_config(folder)
    return None if config is None else read_families(config).quantization


def model_checks_tagged(spec: LadderSpec) -> LadderSpec:
    """The ladder with the model's family tags on the step-4 checks that run the ladder's model.

    Those checks are the evidence for the model's own families (a DeepSeek folder given by
    ``--model`` certifies mla and moe through them). A check naming its own model
    (``params.model``) carries the tags its ladder gave it, and a feature check certifies its
    feature, not the model's families.
    """
    tags = [FAMILY_TAG + f for f in spec.model.families if f != UNKNOWN]
    if not tags:
        return spec
    checks = []
    for c in spec.checks:
        if c.step == 4 and not c.params.get("model") and not feature_names(c.tags):
            c = c.model_copy(update={"tags": c.tags + [t for t in tags if t not in c.tags]})
        checks.append(c)
    return spec.model_copy(update={"checks": checks})


def with_run_model(spec: LadderSpec, meta: RunMeta) -> LadderSpec:
    """The ladder as this run executes it: ``--model`` replaces the ladder's model, with the
    quantization and families its config.json declares (docs/families.md); the step-4 checks
    of the model carry its family tags."""
    update: dict[str, object] = {}
    if meta.model is not None:
        update["name"] = meta.model
    name = str(update.get("name", spec.model.name))
    if meta.model is not None or not spec.model.families:
        reading = named_families(name)
        update["families"] = list(reading.families)
        update["family_note"] = reading.problem
        # A named model (embedded:, pretrained:, auto) or a converted .gguf is unquantized (bf16).
        if not is_named_model(name) and meta.model is not None:
            declared = hf_quantization(Path(name))
            if declared is not None:
                update["quantization"] = declared
    dep = meta.deployment
    if dep is not None and dep.given:
        # The deployment fixes the dtype and the context length the model is certified at.
        if dep.dtype in ("fp32", "fp16", "bf16"):
            update["precision"] = dep.dtype
        if dep.max_model_len:
            update["context_length"] = dep.max_model_len
    if update:
        spec = spec.model_copy(update={"model": spec.model.model_copy(update=update)})
    return deployment_checks_tagged(model_checks_tagged(spec), dep)


def deployment_checks_tagged(spec: LadderSpec, deployment: Deployment | None) -> LadderSpec:
    """The ladder with the deployed features' tags on the step-4 checks that run the deployment itself.

    A feature the ``--serve`` command turns on (tensor parallel 2, prefix caching …) is in every
    answer those checks compare with the float64 reference, so they are its evidence: the features
    table certifies it *as deployed* (or fails it) through them. A feature check (tagged with its
    own feature) vouches for its own feature only, and a check of another model or of another
    engine (transformers) does not run the deployment.
    """
    if deployment is None or not deployment.given or not deployment.features:
        return spec
    from adaptcheck.frameworks.registry import framework_class

    tags = [f"feature:{name}" for name in deployment.features]
    checks = []
    for c in spec.checks:
        framework = c.params.get("framework")
        runs_it = (c.step == 4 and isinstance(framework, str) and not c.params.get("model")
                   and not feature_names(c.tags))
        if runs_it:
            try:
                runs_it = framework_class(str(framework)).deploys == deployment.engine
            except Exception:  # noqa: BLE001 - an unknown framework is the check's own error to report
                runs_it = False
        if runs_it:
            c = c.model_copy(update={"tags": c.tags + [t for t in tags if t not in c.tags]})
        checks.append(c)
    return spec.model_copy(update={"checks": checks})


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
                            spec.model.quantization, spec.model.families),
        features=compute_features(planned, checks, meta.steps, meta.deployment),
        families=compute_families(planned, checks, meta.steps, spec.model.families),
        deployment=run_deployment(meta, spec),
    )


def run_deployment(meta: RunMeta, spec: LadderSpec) -> Deployment:
    """The deployment a run certifies: ``--serve``'s, else adaptcheck's own (its model, its settings)."""
    if meta.deployment is not None:
        return meta.deployment
    from adaptcheck.frameworks.deployment import own_deployment
    from adaptcheck.frameworks.registry import framework_class

    engine = "vllm" if framework_class("vllm").availability().available else "transformers"
    name = meta.model_auto if spec.model.name == "auto" and meta.model_auto else spec.model.name
    return own_deployment(name, engine, spec.model.context_length, spec.model.precision)


def regrade(results: RunResults) -> RunResults:
    """Recompute the grade, the features and families tables from the file's own checks and rules (what
    ``adaptcheck grade`` trusts)."""
    grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps,
                          results.device.device_count, results.model.precision, results.model.quantization,
                          results.model.families)
    features = compute_features(results.planned, results.checks, results.steps, results.deployment)
    families = compute_families(results.planned, results.checks, results.steps, results.model.families)
    return results.model_copy(update={"grade": grade, "features": features, "families": families})


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
