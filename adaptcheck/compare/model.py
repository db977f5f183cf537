"""Schema of a regression comparison between two results files, and the policy that judges it.

A :class:`Comparison` is what ``adaptcheck compare`` prints as JSON, what the
``perf.regression`` check stores as its details, and what the report's comparison section
is built from. It is versioned (:data:`SCHEMA_VERSION`) and can be saved and loaded on its
own. Every figure keeps both values and the bound it was judged against, so a reader can
redo the verdict by hand; docs/compare.md states the rules.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from adaptcheck.base import safejson
from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.errors import AdaptcheckError, ExitCode, InvalidInputError
from adaptcheck.base.integrity import VerifyResult
from adaptcheck.base.schemas.results import RunResults, Status

SCHEMA_VERSION = "1.1"
# 1.1: ``deployment`` (how the deployment under test differs), ``RunRef.deployment`` and
#      ``counts.deployment_changes``; a 1.0 document reads as both runs on adaptcheck's own deployment.

Better = Literal["lower", "higher"]
Category = Literal["status", "numeric", "performance"]


class RegressionsFound(AdaptcheckError):
    """``adaptcheck compare`` found regressions: exit 1, the code CI already treats as "below the bar"."""

    exit_code = ExitCode.GRADE_BELOW_REQUIRED


class ComparePolicy(BaseModel):
    """Thresholds of the comparison (docs/compare.md explains each and its default)."""

    model_config = ConfigDict(extra="forbid")

    error_growth: float = Field(default=2.0, ge=1.0, description="A tolerance-normalised error (ratio_to_tolerance, "
                                "max_logprob_abs_diff) is a regression only when the new value exceeds this factor "
                                "times the baseline's (and the absolute floor below).")
    min_error_delta: float = Field(default=0.1, ge=0, description="... and only when ratio_to_tolerance grew by more "
                                   "than this many tolerances (1.0 = the whole tolerance): noise far below the "
                                   "tolerance never trips the rule.")
    min_logprob_delta: float = Field(default=0.1, ge=0, description="Absolute floor, in nats, for the growth of "
                                     "max_logprob_abs_diff (same two-part rule as ratio_to_tolerance).")
    max_agreement_drop: float = Field(default=0.05, ge=0, le=1, description="Largest drop of token_agreement (a "
                                      "fraction of tokens) that is not a regression.")
    noise_multiplier: float = Field(default=3.0, gt=0, description="A performance figure regresses when it is worse "
                                    "than the baseline by more than this many times the larger of the two measured "
                                    "spreads (micro rows), or this many standard errors of the change, "
                                    "Student-corrected for few runs (serving levels).")
    min_tolerance: float = Field(default=0.02, ge=0, le=1, description="Floor of the performance bound (a fraction "
                                 "of the baseline): guards only a spread measured as ~0, never widens a real one.")


def deployment_text(results: RunResults) -> str:
    """A run's deployment under test on one line (:meth:`Deployment.summary`); a file older than results
    schema 1.7 records none, which is adaptcheck's own deployment (no run of that time took --serve)."""
    d = results.deployment
    return d.summary() if d is not None else "adaptcheck's own deployment (none recorded: results schema before 1.7)"


class RunRef(BaseModel):
    """Which run one side of the comparison is."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="Run id.")
    started_at: datetime = Field(description="Start of the run (UTC).")
    adaptcheck_version: str = Field(description="adaptcheck version that produced the file.")
    ladder: str = Field(description="Ladder id and version, e.g. 'standard 1.0'.")
    backend: str = Field(description="Backend name, e.g. 'cuda'.")
    device_name: str = Field(description="Device product name.")
    device_count: int = Field(description="Devices of the backend visible to the run.")
    complete: bool = Field(description="False when the run did not finish every selected check.")
    integrity: str | None = Field(default=None, description="What its digest said of the file it was read from: "
                                  "intact | edited | no_digest; None when this side was not read from a file "
                                  "(the run a perf.regression check belongs to).")
    verified: bool = Field(default=True, description="False when the file was used although edited after its run or "
                           "undigested (--allow-unverified): nothing vouches for its figures.")
    unverified_reason: str = Field(default="", description="'edited after the run' | 'no digest' when not verified.")
    deployment: str | None = Field(default=None, description="The deployment the run certified, on one line "
                                   "(Deployment.summary(): the --serve command with its digest, or adaptcheck's own); "
                                   "None in a comparison older than 1.1.")

    @classmethod
    def of(cls, results: RunResults, check: VerifyResult | None = None) -> RunRef:
        """The reference of one side; ``check``: its file's verification, when read from a file."""
        d = results.device
        return cls(run_id=results.run_id, started_at=results.started_at, adaptcheck_version=results.adaptcheck_version,
                   ladder=f"{results.ladder.id} {results.ladder.version}", backend=d.backend,
                   device_name=d.device_name, device_count=d.device_count, complete=results.complete,
                   integrity=check.status.value if check else None, verified=check is None or check.intact,
                   unverified_reason=check.unverified_reason if check else "", deployment=deployment_text(results))


class StatusChange(BaseModel):
    """A check present in both runs whose status differs."""

    model_config = ConfigDict(extra="forbid")

    check_id: str = Field(description="Check id.")
    kind: str = Field(description="Check kind (of the new run).")
    before: Status = Field(description="Status in the baseline.")
    after: Status = Field(description="Status in the new run.")
    before_label: str = Field(default="", description="The baseline's status as the report names it: pass | fail | "
                              "error | skip | n/a (a skip the backend declared inapplicable).")
    after_label: str = Field(default="", description="The new run's status as the report names it.")
    verdict: Literal["regression", "improvement", "changed"] = Field(
        description="regression: pass → anything else; improvement: anything else → pass; changed: the rest "
                    "(including skip ↔ n/a).")
    message: str = Field(default="", description="The new run's message for the check.")

    @property
    def text(self) -> str:
        """'id: before → after' in the report's words (labels are absent from comparisons of older versions)."""
        return f"{self.check_id}: {self.before_label or self.before.value} → {self.after_label or self.after.value}"


class GradeCause(BaseModel):
    """A check whose status change made a level of the grade lost (or gained)."""

    model_config = ConfigDict(extra="forbid")

    level: str = Field(description="The level lost (or gained), e.g. 'L3'.")
    condition: str = Field(description="Id of that level's condition that selects the check.")
    check_id: str = Field(description="Check id.")
    before: str = Field(description="Its status in the baseline (pass | fail | error | skip | n/a | not run).")
    after: str = Field(description="Its status in the new run (pass | fail | error | skip | n/a | not run).")
    message: str = Field(default="", description="The new run's message for the check.")

    @property
    def text(self) -> str:
        why = f": {self.message}" if self.message and self.after != "pass" else ""
        return f"{self.level} {self.condition}: {self.check_id}: {self.before} → {self.after}{why}"


class GradeChange(BaseModel):
    """The grade of each run (recomputed from its own checks) and what changed it."""

    model_config = ConfigDict(extra="forbid")

    before: str = Field(description="Grade of the baseline, 'L0' … 'L5'.")
    before_name: str = Field(description="Its level name.")
    after: str = Field(description="Grade of the new run.")
    after_name: str = Field(description="Its level name.")
    change: Literal["lowered", "raised", "unchanged"] = Field(description="Which way the grade moved.")
    causes: list[GradeCause] = Field(default_factory=list, description="Lowered: checks selected by the unmet "
                                     "conditions of the lost levels that did not block the grade in the baseline "
                                     "(pass or n/a) and block it now; raised: checks of the gained levels' "
                                     "conditions that block no more.")
    other_reasons: list[str] = Field(default_factory=list, description="Unmet conditions of the lost levels that no "
                                     "status change explains (a step not run, a check missing), with their reason.")
    line: str = Field(description="The change on one line, e.g. 'grade lowered: L3 (service usable) → L2 (model runs)'.")


class NumericChange(BaseModel):
    """A numerical-correctness metric that moved beyond its rule (either way)."""

    # An error that became inf/NaN is kept as the string "Infinity"/"NaN": JSON has neither.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    check_id: str = Field(description="Check id.")
    metric: str = Field(description="Metric name, e.g. 'ratio_to_tolerance'.")
    better: Better = Field(description="Which direction is better for this metric.")
    before: float = Field(description="Baseline value.")
    after: float = Field(description="New value.")
    bound: str = Field(description="The rule it was judged by, in words.")
    verdict: Literal["regression", "improvement"] = Field(description="Which way it moved.")


class PerfFigure(BaseModel):
    """One performance figure measured in both runs, with the noise it is judged against."""

    model_config = ConfigDict(extra="forbid")

    check_id: str = Field(description="Check id.")
    figure: str = Field(description="What is compared, e.g. 'level 4: TTFT median' or 'decode m=8 … bf16: median time'.")
    unit: str = Field(description="Unit of before/after: 's', 'ms' or 'tok/s'.")
    better: Better = Field(description="Which direction is better.")
    before: float = Field(description="Baseline value.")
    after: float = Field(description="New value.")
    change: float = Field(description="Change as a time, > 0 worse, < 0 better: after/before − 1 for "
                          "lower-is-better figures, before/after − 1 for throughput (0.25: the same work takes "
                          "25 % longer; a halved throughput is +1.0, like a doubled latency).")
    spread_before: float = Field(ge=0, description="Noise measured in the baseline (relative): the spread of a micro "
                                 "row, the run-to-run CV of a serving figure (noise_kind).")
    spread_after: float = Field(ge=0, description="The same in the new run.")
    bound: float = Field(ge=0, description="Micro: max(noise_multiplier × max(spread_before, spread_after), "
                         "min_tolerance). Serving: max(exp(t · SE) − 1, min_tolerance), SE = max(spread_before, "
                         "spread_after) · √(1/runs_before + 1/runs_after), t Student's quantile at "
                         "Φ(noise_multiplier) with runs_before + runs_after − 2 degrees of freedom.")
    noise_kind: Literal["spread", "run_cv"] = Field(default="spread", description="spread: (p90 − p10)/median of "
                                                    "a micro row's repetitions; run_cv: standard deviation of ln x "
                                                    "over a serving level's undisturbed runs.")
    runs_before: int | None = Field(default=None, description="Runs behind a serving figure in the baseline.")
    runs_after: int | None = Field(default=None, description="Runs behind a serving figure in the new run.")
    verdict: Literal["regression", "improvement", "within_noise"] = Field(
        description="regression: change > bound; improvement: (1 + change) × (1 + bound) < 1, i.e. the "
                    "baseline took more than (1 + bound) × the new time; else within_noise.")


class NotCompared(BaseModel):
    """A performance figure (or a whole check's figures) that could not be compared, and why."""

    model_config = ConfigDict(extra="forbid")

    check_id: str = Field(description="Check id.")
    figure: str = Field(description="The figure, or '*' for all of the check's figures.")
    reason: str = Field(description="Why: present on one side only, not run, workload differs, noise not measured …")


class EnvChange(BaseModel):
    """One difference of the software/hardware stack between the two runs."""

    model_config = ConfigDict(extra="forbid")

    what: str = Field(description="What changed, e.g. 'packages.vllm', 'torch', 'driver_version', 'ladder sha256'.")
    before: str | None = Field(description="Baseline value; None: absent / not installed.")
    after: str | None = Field(description="New value; None: absent / not installed.")
    change: Literal["changed", "added", "removed"] = Field(description="added: absent before; removed: absent after.")


class DeploymentChange(BaseModel):
    """The two runs certified different deployments under test (``--serve``): what differs.

    Named beside the environment changes, and like a change of device it makes the runs not
    comparable: a figure of one deployment (TP 1) against another's (TP 2) is no regression of the
    machine either way."""

    model_config = ConfigDict(extra="forbid")

    before: str = Field(description="The baseline's deployment on one line (Deployment.summary(), or adaptcheck's "
                        "own).")
    after: str = Field(description="The new run's, likewise.")
    before_digest: str | None = Field(default=None, description="The baseline's deployment digest; None: no "
                                      "deployment was given (adaptcheck's own).")
    after_digest: str | None = Field(default=None, description="The new run's, likewise.")
    changes: list[EnvChange] = Field(default_factory=list, description="Each fact that differs (engine, model, "
                                     "tensor_parallel_size, max_model_len, kv_cache_dtype, compile_mode, "
                                     "engine_args.NAME …, 'deployment' when one side gave none), then "
                                     "'command digest' (first 12 hex digits).")
    line: str = Field(description="The change on one line: 'the baseline certified another deployment "
                      "(tensor_parallel_size 1 → 2; command digest 0123456789ab… → fedcba987654…)'.")


class Regression(BaseModel):
    """One regression, as one line plus its parts."""

    model_config = ConfigDict(extra="forbid")

    category: Category = Field(description="status | numeric | performance.")
    check_id: str = Field(description="Check id.")
    figure: str = Field(description="Status, metric or performance figure that regressed.")
    before: str = Field(description="Baseline value, formatted.")
    after: str = Field(description="New value, formatted.")
    bound: str = Field(description="The bound it crossed, in words.")
    line: str = Field(description="The whole regression on one line.")


class Counts(BaseModel):
    """How much was compared and found."""

    model_config = ConfigDict(extra="forbid")

    checks_matched: int = Field(description="Check ids present in both runs.")
    checks_added: int = Field(description="Check ids only in the new run.")
    checks_removed: int = Field(description="Check ids only in the baseline.")
    status_changes: int = Field(description="Matched checks whose status differs.")
    numeric_compared: int = Field(description="Numerical metrics present in both runs and judged.")
    perf_compared: int = Field(description="Performance figures measured in both runs and judged.")
    perf_not_compared: int = Field(description="Entries of not_compared.")
    perf_improvements: int = Field(description="Performance figures better than the baseline beyond the noise.")
    environment_changes: int = Field(description="Entries of environment.")
    deployment_changes: int = Field(default=0, description="Facts of the deployment under test that differ "
                                    "(entries of deployment.changes; 0 when both runs certified the same one).")
    regressions: int = Field(description="Entries of regressions (all categories).")


class Comparison(BaseModel):
    """The whole comparison of a new run against a baseline."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = Field(default=SCHEMA_VERSION, description="Version of this schema.")
    policy: ComparePolicy = Field(description="Thresholds used.")
    baseline: RunRef = Field(description="The earlier run.")
    new: RunRef = Field(description="The run judged against it.")
    comparable: bool = Field(description="False when the two runs are from different devices (backend or device "
                             "name) or certified different deployments (deployment): the figures are listed, but "
                             "they do not describe one machine over time.")
    not_comparable_reason: str = Field(default="", description="Why comparable is False.")
    verdict: str = Field(description="One line: the outcome.")
    grade: GradeChange | None = Field(default=None, description="The grade change between the runs ('adaptcheck "
                                      "compare'); None inside a perf.regression check, whose own run is not "
                                      "graded yet.")
    regressions: list[Regression] = Field(default_factory=list, description="Every regression, worst category first.")
    improvements: list[str] = Field(default_factory=list, description="Every improvement, one line each.")
    added_checks: list[str] = Field(default_factory=list, description="Check ids only in the new run.")
    removed_checks: list[str] = Field(default_factory=list, description="Check ids only in the baseline.")
    status_changes: list[StatusChange] = Field(default_factory=list, description="Matched checks whose status differs.")
    numeric: list[NumericChange] = Field(default_factory=list, description="Numerical metrics that moved beyond "
                                         "their rule; unchanged ones are only counted.")
    perf: list[PerfFigure] = Field(default_factory=list, description="Every performance figure compared.")
    not_compared: list[NotCompared] = Field(default_factory=list, description="Performance figures not compared, why.")
    environment: list[EnvChange] = Field(default_factory=list, description="Stack differences between the runs.")
    deployment: DeploymentChange | None = Field(default=None, description="How the deployment under test differs "
                                                "(--serve); None when both runs certified the same one.")
    counts: Counts = Field(description="Totals.")

    def unverified_sides(self) -> list[str]:
        """'baseline (edited after the run)', 'new (no digest)': each side used without a valid digest."""
        return [f"{name} ({ref.unverified_reason or 'unverified'})"
                for name, ref in (("baseline", self.baseline), ("new", self.new)) if not ref.verified]

    def to_data(self) -> dict[str, JsonValue]:
        """Plain JSON data (for check details and ``--format json``): inf/NaN as strings, which
        :meth:`from_data` reads back as floats."""
        data: dict[str, JsonValue] = json.loads(self.model_dump_json())
        return data

    def save(self, path: Path) -> None:
        """Write the comparison as indented JSON (atomically)."""
        write_text_atomic(path, self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: Path) -> Comparison:
        """Read a saved comparison; any problem is a one-line InvalidInputError."""
        # Bounded (size, depth, integer length): every problem is one InvalidInputError line.
        raw = safejson.load_file(Path(path), what="comparison file")
        return cls.from_data(raw, str(path))

    @classmethod
    def from_data(cls, raw: Any, where: str) -> Comparison:
        """Validate parsed JSON (a file, or a ``perf.regression`` check's details)."""
        if not isinstance(raw, dict):
            raise InvalidInputError(f"{where}: expected a JSON object")
        version = str(raw.get("schema_version", ""))
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise InvalidInputError(f"{where}: comparison schema version {version or '(missing)'} is not supported",
                                    hint=f"this adaptcheck reads {SCHEMA_VERSION}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise InvalidInputError(f"{where}: invalid comparison at '{at}': {first['msg']}") from None


def num(value: float) -> str:
    """A figure as the verdict lines print it: 4 significant digits."""
    return f"{value:.4g}"
