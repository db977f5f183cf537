"""Schema of ``results.json``: every check outcome, the environment and the grade.

The file is versioned (:data:`SCHEMA_VERSION`); :meth:`RunResults.load` refuses files of
another major version with a one-line error. The grade stored here is recomputed from the
checks and the ladder's rules alone (``adaptcheck grade`` does exactly that), so the CLI,
the report and CI always agree. :meth:`RunResults.save` seals the file with a SHA-256
digest of its content (:mod:`adaptcheck.base.integrity`; ``adaptcheck verify`` checks it).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from adaptcheck.base import safejson
from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.families import FAMILIES
from adaptcheck.base.features import FEATURES, FeatureStatus, status_text
from adaptcheck.base.integrity import DIGEST_FIELD, compute_digest
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.evidence import Evidence, EvidenceError
from adaptcheck.base.schemas.ladder import GradeSpec, ModelSpec
from adaptcheck.base.schemas.upgrade import upgrade_results

# 1.1: added ``digest``; 1.0 files (without it) still load.
# 1.2: added ``model.quantization`` and ``grade.left_out``; older files load with 'none' and [].
# 1.3: step-4 lifecycle details are typed evidence (models.framework_evidence): ``details.framework``
#      is one object in every outcome ({name, loaded, facts…}), never a bare name. Older files are
#      upgraded on load (models.upgrade). A minor bump: an older reader still validates a 1.3 file
#      (details is a JSON object) and read the framework from its dict form already.
# 1.4: every check and planned check records its kind's report label (``kind_label``) and, for a
#      kind comparing two runs of one framework, what the two runs are (``compares``), so the report
#      needs no table of kinds. Older files get the labels of the kinds of their time on load.
# 1.5: ``features``: the features table (base.features), one row per known serving feature with what the
#      run's checks tagged ``feature:<name>`` established. Older files get it computed from their checks'
#      tags on load (no older ladder had such tags, so every row of theirs reads 'not tested').
# 1.6: ``families``: the model families table (base.families), one row per known family with what the
#      checks tagged ``family:<name>`` established and whether the model under test is of it; the model
#      spec gains ``families`` and ``family_note``. Older files get the table computed from their tags
#      (none had family tags: every row 'not tested') and grade as before (families not known).
# 1.7: ``deployment``: the deployment under test (``--serve``, base.schemas.deployment), or adaptcheck's own
#      (``source: adaptcheck``); feature rows gain ``deployed``. Older files load with no deployment
#      (the report then says adaptcheck chose every check's settings) and every ``deployed`` false.
SCHEMA_VERSION = "1.7"

E = TypeVar("E", bound=Evidence)


def utcnow() -> datetime:
    """Timezone-aware now, so timestamps in results are unambiguous."""
    return datetime.now(timezone.utc)


class Status(str, Enum):
    """Outcome of one check. Only ``pass`` ever counts towards a grade."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"


NOT_APPLICABLE = "n/a"
"""The one word for a check the backend declared inapplicable: terminal, report, JUnit, compare."""


class CheckResult(BaseModel):
    """One executed (or deliberately not executed) check."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=1, le=5, description="Ladder step 1-5 the check belongs to.")
    id: str = Field(description="Unique check id within the ladder, e.g. 'smoke.matmul'.")
    kind: str = Field(description="Check kind from the registry that produced it.")
    kind_label: str | None = Field(default=None, description="The kind's short name as the report shows it "
                                   "(``Check.label``, e.g. 'alone vs batched'); None: the report shows the kind.")
    compares: str | None = Field(default=None, description="For a kind that compares two runs of one framework: what "
                                 "the two runs are (``Check.compares``, e.g. 'batched vs alone'); None otherwise.")
    status: Status = Field(description="pass | fail | error | skip.")
    applicable: bool = Field(
        default=True,
        description=(
            "False only when the backend declares it lacks the capability (e.g. no streams on CPU); "
            "a non-applicable skip does not block a grade, every other non-pass does."
        ),
    )
    message: str = Field(default="", description="Human summary: why it failed, was skipped or errored.")
    metrics: dict[str, Any] = Field(default_factory=dict, description="Measured numbers, flat name → value.")
    details: dict[str, Any] = Field(default_factory=dict, description="Structured evidence (worst elements, verdict inputs).")
    duration_s: float = Field(default=0.0, ge=0, description="Wall time of the check in seconds.")
    tags: list[str] = Field(default_factory=list, description="Tags from the ladder (used by grade rules).")

    def evidence(self, model: type[E]) -> E | None:
        """This check's details as the typed evidence ``model``.

        None when the check recorded no details (its worker crashed before answering) or when
        they do not fit ``model`` (a foreign or hand-edited file): readers show what they can
        instead of failing the page. ``model.parse(result.details)`` raises with the reason.
        """
        if not self.details:
            return None
        try:
            return model.parse(self.details, where=f"{self.id}: details")
        except EvidenceError:
            return None

    @property
    def not_applicable(self) -> bool:
        """A skip the backend declared inapplicable: it blocks no grade (every reader of a
        status — grade, report, compare, the console — asks this, so the rule is written once)."""
        return self.status is Status.SKIP and not self.applicable

    @property
    def label(self) -> str:
        """The status as every output names it: :data:`NOT_APPLICABLE` for a not-applicable
        skip, else the status value."""
        return NOT_APPLICABLE if self.not_applicable else self.status.value


class ConditionResult(BaseModel):
    """One grade condition evaluated against the checks."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Condition id from the ladder.")
    description: str = Field(description="What the condition demands.")
    holds: bool = Field(description="True only when every selected check passed (and at least one ran).")
    reason: str = Field(default="", description="Why it does not hold: which checks failed / did not run.")
    checks: list[str] = Field(default_factory=list, description="Ids of the checks the condition selected.")


class LevelResult(BaseModel):
    """All conditions of one level."""

    model_config = ConfigDict(extra="forbid")

    level: str = Field(description="'L1' … 'L5'.")
    name: str = Field(description="Level name, e.g. 'device usable'.")
    holds: bool = Field(description="Every condition of this level holds.")
    conditions: list[ConditionResult] = Field(description="Each condition with its verdict.")


class GradeResult(BaseModel):
    """The grade and what blocks the next level."""

    model_config = ConfigDict(extra="forbid")

    level: str = Field(description="Highest level whose conditions (and all lower levels') hold: 'L0' … 'L5'.")
    name: str = Field(description="Name of that level ('none' for L0).")
    blockers: list[str] = Field(default_factory=list, description="Unmet conditions of the next level, one line each.")
    levels: list[LevelResult] = Field(default_factory=list, description="Every level with its conditions.")
    steps_not_run: list[int] = Field(default_factory=list, description="Steps excluded by --steps or not reached.")
    left_out: list[str] = Field(default_factory=list, description="Planned checks the grade leaves out: tagged "
                                "'quant:FORMAT' for a quantization the model does not use (results still reported).")


class TableRow(BaseModel):
    """One row of a table decided by tags (features, families): what the run established about one name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The row's name, one of its registry's (base.features.FEATURES, "
                      "base.families.FAMILIES).")
    description: str = Field(default="", description="What certifying it means, in one line.")
    status: FeatureStatus = Field(description="'certified': a check carrying the row's tag passed and none failed "
                                  "or errored; 'failed': one failed or errored; 'n/a': every tagged check was "
                                  "skipped as not applicable here; 'not tested': no tagged check in the run, or "
                                  "none ran.")
    reason: str = Field(default="", description="'' when certified; else the failing checks with their messages "
                        "('failed'), the first not-applicable reason ('n/a'), or why nothing was tested.")
    checks: list[str] = Field(default_factory=list, description="Ids of the tagged checks behind the status "
                              "(results, and planned checks without a result).")

    @property
    def label(self) -> str:
        """The status as one line: 'certified', 'failed: …', 'n/a: …', 'not tested: …'."""
        return status_text(self.status, self.reason)

    @property
    def certified(self) -> bool:
        """Only a certified row meets ``--require-feature`` / ``--require-family``."""
        return self.status is FeatureStatus.CERTIFIED


class FeatureResult(TableRow):
    """One row of the features table (tag ``feature:<name>``): a serving feature."""

    deployed: bool = Field(default=False, description="True when the deployment under test (--serve) turns this "
                           "feature on: its status then comes from the deployment's own checks as well.")


class FamilyResult(TableRow):
    """One row of the families table (tag ``family:<name>``): a model family."""

    model: bool = Field(default=False, description="True when the model under test is of this family: its "
                        "tagged checks then count towards the grade.")


class LadderRef(BaseModel):
    """Which ladder produced the run."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Ladder id, e.g. 'quick'.")
    version: str = Field(description="Ladder version string.")
    source: str = Field(description="Path or 'builtin:NAME' the ladder was loaded from.")
    sha256: str = Field(description="SHA-256 of the ladder text, to prove which definition ran.")


class PlannedCheck(BaseModel):
    """A check the ladder planned, whether or not it ran (so a missing result is visible)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Check id.")
    step: int = Field(ge=1, le=5, description="Step it belongs to.")
    kind: str = Field(description="Check kind.")
    kind_label: str | None = Field(default=None, description="The kind's short name as the report shows it "
                                   "(``Check.label``); None: the report shows the kind.")
    description: str = Field(default="", description="What it proves.")
    tags: list[str] = Field(default_factory=list, description="Tags (used by grade conditions).")
    timeout_s: float = Field(gt=0, description="Its time limit in seconds.")


class DeviceRef(BaseModel):
    """The device the ladder ran on."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(description="Backend name, e.g. 'cpu', 'cuda'.")
    display_name: str = Field(description="Backend display name, e.g. 'NVIDIA CUDA'.")
    torch_device: str = Field(description="torch device string, e.g. 'cuda:0'.")
    device_name: str = Field(description="Device product name as torch/SMI reports it.")
    device_count: int = Field(ge=0, description="Devices of this backend visible to the process.")


class RunResults(BaseModel):
    """The whole ``results.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = Field(default=SCHEMA_VERSION, description="Version of this schema.")
    digest: str | None = Field(
        default=None,
        description=(
            "'sha256:<hex>' over the file's content without this field (parsed JSON, keys sorted, compact); "
            "set when the file is written, checked by 'adaptcheck verify'. Tamper evidence, not a signature. "
            "None in files older than schema 1.1."
        ),
    )
    adaptcheck_version: str = Field(description="adaptcheck version that produced the file.")
    run_id: str = Field(description="Unique id of the run (also the default folder name).")
    started_at: datetime = Field(description="Start of the run (UTC).")
    finished_at: datetime | None = Field(default=None, description="End of the run (UTC); None if interrupted.")
    complete: bool = Field(default=False, description="False when the run was interrupted before its last check.")
    command: list[str] = Field(default_factory=list, description="The command line, to reproduce the run.")
    ladder: LadderRef = Field(description="The ladder that ran.")
    seed: int = Field(description="Random seed used by every check.")
    model: ModelSpec = Field(description="Model under certification (its precision selects the step-3 dtype the grade demands).")
    deployment: Deployment | None = Field(default=None, description="The deployment under test: the --serve command as "
                                          "the engine's parser read it, or adaptcheck's own (source 'adaptcheck'). None "
                                          "in files older than schema 1.7.")
    steps: list[int] = Field(description="Steps selected for this run.")
    device: DeviceRef = Field(description="The device under test.")
    environment: Environment | None = Field(default=None, description="Captured compatibility matrix (step 1).")
    planned: list[PlannedCheck] = Field(default_factory=list, description="Every check of the ladder, run or not.")
    grade_rules: GradeSpec = Field(description="The ladder's grade rules, so the grade can be recomputed from this file alone.")
    checks: list[CheckResult] = Field(default_factory=list, description="Every check result, in ladder order.")
    grade: GradeResult = Field(description="The grade computed from checks + ladder rules.")
    features: list[FeatureResult] = Field(
        default_factory=list,
        description="The features table: one row per known serving feature (docs/features.md), in a fixed order, "
        "computed from the checks tagged 'feature:<name>' beside the grade, never folded into it. Files "
        "older than schema 1.5 get it computed on load.")

    families: list[FamilyResult] = Field(
        default_factory=list,
        description="The families table: one row per known model family (docs/families.md), in a fixed order, "
        "computed from the checks tagged 'family:<name>'. Files older than schema 1.6 get it computed on load.")

    def family_rows(self) -> list[FamilyResult]:
        """Every known family's row, in the registry's order (a missing row reads 'not tested')."""
        return [self.family(name) for name in FAMILIES]

    def family(self, name: str) -> FamilyResult:
        """The families table's row of ``name`` (a known family); 'not tested' when the table lacks it."""
        for row in self.families:
            if row.name == name:
                return row
        return FamilyResult(name=name, description=FAMILIES.get(name, ""), status=FeatureStatus.NOT_TESTED,
                            reason="the results file has no row for it", model=name in self.model.families)

    def feature_rows(self) -> list[FeatureResult]:
        """Every known feature's row, in the registry's order (a row missing from a hand-made file reads
        'not tested'): what every output of the table shows."""
        return [self.feature(name) for name in FEATURES]

    def feature(self, name: str) -> FeatureResult:
        """The features table's row of ``name`` (a known feature); 'not tested' when the table lacks it."""
        for row in self.features:
            if row.name == name:
                return row
        return FeatureResult(name=name, description=FEATURES.get(name, ""), status=FeatureStatus.NOT_TESTED,
                             reason="the results file has no row for it")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """An older minor version's shapes brought to the current ones (models.upgrade), whichever
        way the file is read: :meth:`load`, ``model_validate_json``, a test's ``model_validate``."""
        return upgrade_results(data, SCHEMA_VERSION) if isinstance(data, dict) else data

    def save(self, path: Path) -> str:
        """Write the results as indented JSON (atomically: a crash never leaves half a file).

        Seals the file: computes the digest over exactly what is written (its parsed JSON
        without the digest), stores it in ``self.digest`` too — so a report rendered from
        this object shows the value the file carries — and returns it.
        """
        self.digest = None
        content = json.loads(self.model_dump_json())
        content.pop(DIGEST_FIELD, None)
        self.digest = compute_digest(content)
        write_text_atomic(path, self.model_dump_json(indent=2))
        return self.digest

    @classmethod
    def load(cls, path: Path) -> RunResults:
        """Read and validate a results file; any problem is a one-line InvalidInputError."""
        # Bounded: size, nesting and integer length are limited (adaptcheck.base.safejson).
        raw = safejson.load_file(Path(path), what="results file", missing_hint="pass the results.json of a run")
        if not isinstance(raw, dict):
            raise InvalidInputError(f"{path}: expected a JSON object at the top level")
        version = str(raw.get("schema_version", ""))
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise InvalidInputError(
                f"{path}: results schema version {version or '(missing)'} is not supported",
                hint=f"this adaptcheck reads {SCHEMA_VERSION}",
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidInputError(f"{path}: invalid results file at '{where}': {first['msg']}") from None


def result_schema() -> dict[str, Any]:
    """JSON Schema of results.json (``adaptcheck schema`` prints it; docs/results-schema.md describes it)."""
    return RunResults.model_json_schema()
