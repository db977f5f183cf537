"""The serving features a certificate can vouch for, and how one feature's status is decided.

A check certifies a feature by carrying the ladder tag ``feature:<name>`` (data, like the
``quant:`` tags); the names are the keys of :data:`FEATURES`, and a ladder naming another is
refused with a "did you mean". The features table of ``results.json`` (schema 1.5) says, per
known feature, what the run's tagged checks established: ``certified``, ``failed``, ``n/a``
or ``not tested``. The grade levels do not fold these in: they are certified beside the level,
and ``adaptcheck grade --require-feature`` gates on them. The rule is written here, once, over
plain values, so that the grade (on :class:`~adaptcheck.base.schemas.results.CheckResult`) and
the upgrade of an older file (on its parsed JSON) decide alike.

Docs: docs/features.md, "The features table and --require-feature".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from adaptcheck.base.errors import did_you_mean

FEATURE_TAG = "feature:"


@dataclass(frozen=True)
class TagTable:
    """A table of the certificate decided by tags: the features (``feature:NAME``) here, the model
    families (``family:NAME``, :mod:`adaptcheck.base.families`). One rule, one parser, for both."""

    noun: str
    """'feature' or 'family': how messages and options name a row."""
    tag: str
    """The tag prefix, e.g. ``feature:``."""
    names: dict[str, str]
    """Every name a ladder may tag, with its one-line description, in table order."""
    required_step: int | None = None
    """A step whose tagged checks must include a pass for a row to be certified (the families:
    step 4, a model of the family served; passing operators alone certify no family)."""

    def unknown(self, name: str) -> str | None:
        """None for a known name, else the one-line complaint with its "did you mean"."""
        if name in self.names:
            return None
        # 'fp8' or 'fp8-kv-cache' mean a name as surely as a near spelling does: a part of a name,
        # with '-' for '_', is suggested before difflib's guess.
        key = name.strip().lower().replace("-", "_")
        part = [f for f in self.names if key and key in f] if len(key) >= 3 else []
        hint = ("did you mean " + " or ".join(repr(f) for f in part[:3]) + "?") if part \
            else did_you_mean(name, tuple(self.names))
        return f"unknown {self.noun} {name!r}; {hint}"

    def parse(self, values: Sequence[str]) -> tuple[list[str], list[str]]:
        """Option values (each possibly comma-separated) → (names in order, without repeats; one
        complaint per unknown name). Empty items (``a,,b``) are dropped."""
        names: list[str] = []
        problems: list[str] = []
        for value in values:
            for item in value.split(","):
                name = item.strip()
                if not name or name in names:
                    continue
                complaint = self.unknown(name)
                if complaint:
                    problems.append(complaint)
                else:
                    names.append(name)
        return names, problems

    def tagged(self, tags: Iterable[str]) -> list[str]:
        """The names a check's tags name (``feature:spec_decode`` → ``spec_decode``), known or not."""
        return [t[len(self.tag):] for t in tags if t.startswith(self.tag)]

    def table(self, outcomes: Sequence[Outcome], planned: Sequence[Planned],
              steps_run: Sequence[int]) -> list[FeatureVerdict]:
        """Every known name's verdict, in table order."""
        return [evaluate_tag(self.tag + name, name, outcomes, planned, steps_run, self.required_step)
                for name in self.names]


FEATURES: dict[str, str] = {
    "prefix_caching": "a prompt whose prefix is already cached gives the same answers as one computed afresh",
    "graph_capture": "compiled / graph-captured execution gives the same answers as eager, and something was captured",
    "spec_decode": "speculative decoding gives the plain run's answers, with drafted and accepted tokens",
    "fp8_kv_cache": "a KV cache stored in fp8 keeps the answers within the fp8 bound",
    "preemption": "requests preempted under KV-cache pressure resume with the same answers",
    "long_context": "prompts near the context limit are right and an over-length request is refused cleanly",
    "chunked_prefill": "a prompt prefilled in chunks gives the same answers as in one piece",
    "tensor_parallel": "the model split over ranks (tensor parallel) gives the same answers as on one",
}
"""Every feature a ladder may tag, with the one line the report and ``--help`` show, in table order."""


class FeatureStatus(str, Enum):
    """What a run established about one feature. Only ``certified`` meets ``--require-feature``."""

    CERTIFIED = "certified"
    FAILED = "failed"
    NOT_APPLICABLE = "n/a"
    NOT_TESTED = "not tested"


def feature_names(tags: Iterable[str]) -> list[str]:
    """The feature names a check's tags name (``feature:spec_decode`` → ``spec_decode``), known or not."""
    return FEATURE_TABLE.tagged(tags)


def unknown_feature(name: str) -> str | None:
    """None for a known feature name, else the one-line complaint with its "did you mean"."""
    return FEATURE_TABLE.unknown(name)


def parse_feature_list(values: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--require-feature`` values → (known names in order, complaints); see :meth:`TagTable.parse`."""
    return FEATURE_TABLE.parse(values)


@dataclass(frozen=True)
class Outcome:
    """One check result as the feature rule sees it (a status word of results.json)."""

    id: str
    status: str  # 'pass' | 'fail' | 'error' | 'skip'
    applicable: bool = True
    message: str = ""
    tags: tuple[str, ...] = ()
    step: int = 0


@dataclass(frozen=True)
class Planned:
    """One planned check as the feature rule sees it."""

    id: str
    step: int
    tags: tuple[str, ...] = ()


@dataclass
class FeatureVerdict:
    """One row of the features table before it becomes the schema's model."""

    name: str
    status: FeatureStatus
    reason: str = ""
    checks: list[str] = field(default_factory=list)


def _has_result(planned_id: str, result_ids: set[str]) -> bool:
    # An expanding check's results are '<id>.<sub>'; either form is a result of the planned check.
    return planned_id in result_ids or any(r.startswith(planned_id + ".") for r in result_ids)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def evaluate_feature(name: str, outcomes: Sequence[Outcome], planned: Sequence[Planned],
                     steps_run: Sequence[int]) -> FeatureVerdict:
    """The status of feature ``name`` from the checks tagged ``feature:name`` (:func:`evaluate_tag`)."""
    return evaluate_tag(FEATURE_TAG + name, name, outcomes, planned, steps_run)


def evaluate_tag(tag: str, name: str, outcomes: Sequence[Outcome], planned: Sequence[Planned],
                 steps_run: Sequence[int], required_step: int | None = None) -> FeatureVerdict:
    """The status of row ``name`` from the checks carrying ``tag``.

    ``failed`` when any tagged result failed or errored (they are named); else ``certified``
    when at least one passed (with ``required_step``: one of that step among them); else
    ``n/a`` when every tagged result is a not-applicable skip — or, with ``required_step``,
    every one of that step is (the first one's reason: the framework's own words); else
    ``not tested`` — no tagged check in the ladder, or none ran (a step not selected, an
    interrupted run, a skip for a missing framework), which is never a pass.
    """
    mine = [o for o in outcomes if tag in o.tags]
    result_ids = {o.id for o in mine}
    missing = [p for p in planned if tag in p.tags and not _has_result(p.id, result_ids)]
    checks = sorted(result_ids | {p.id for p in missing})
    bad = [o for o in mine if o.status in ("fail", "error")]
    if bad:
        reason = "; ".join(f"{o.id} {o.status}" + (f": {_one_line(o.message)}" if o.message else "") for o in bad)
        return FeatureVerdict(name, FeatureStatus.FAILED, reason, checks)
    if required_step is not None and any(o.status == "pass" for o in mine):
        at_step = [o for o in mine if o.step == required_step]
        if any(o.status == "pass" for o in at_step):
            return FeatureVerdict(name, FeatureStatus.CERTIFIED, "", checks)
        if at_step and all(o.status == "skip" and not o.applicable for o in at_step):
            return FeatureVerdict(name, FeatureStatus.NOT_APPLICABLE,
                                  f"its step-{required_step} checks cannot run here: "
                                  + (_one_line(at_step[0].message) or "not applicable"), checks)
        return FeatureVerdict(name, FeatureStatus.NOT_TESTED,
                              f"its tagged step-{min(o.step for o in mine)} checks passed, but no step-{required_step}"
                              " check passed (a model of it served); " + ("; ".join(
                                  f"{o.id} {o.status}" + (f": {_one_line(o.message)}" if o.message else "")
                                  for o in at_step) or f"none of step {required_step} ran"), checks)
    if any(o.status == "pass" for o in mine):
        return FeatureVerdict(name, FeatureStatus.CERTIFIED, "", checks)
    if mine and not missing and all(o.status == "skip" and not o.applicable for o in mine):
        return FeatureVerdict(name, FeatureStatus.NOT_APPLICABLE, _one_line(mine[0].message) or "not applicable here",
                              checks)
    if not mine and not missing:
        return FeatureVerdict(name, FeatureStatus.NOT_TESTED, f"no check of this run is tagged {tag}", checks)
    why = [f"{o.id} skipped" + (f": {_one_line(o.message)}" if o.message else "")
           for o in mine if not (o.status == "skip" and not o.applicable)]
    for p in missing:
        why.append(f"{p.id} not run (step {p.step} not selected)" if p.step not in steps_run
                   else f"{p.id} has no result (run interrupted?)")
    return FeatureVerdict(name, FeatureStatus.NOT_TESTED, "; ".join(why), checks)


def feature_table(outcomes: Sequence[Outcome], planned: Sequence[Planned],
                  steps_run: Sequence[int]) -> list[FeatureVerdict]:
    """Every known feature's verdict, in :data:`FEATURES` order."""
    return FEATURE_TABLE.table(outcomes, planned, steps_run)


def status_text(status: FeatureStatus, reason: str) -> str:
    """A feature's status as one line: 'certified', 'failed: <checks>', 'n/a: <reason>', 'not tested: <why>'."""
    return f"{status.value}: {reason}" if reason else status.value


FEATURE_TABLE = TagTable("feature", FEATURE_TAG, FEATURES)
"""The features table's registry and rule."""
