"""A captured stack against all the compatibility data at once, with what to change.

``adaptcheck env --check`` asks what step 1's two checks ask, with the same evaluators
(:func:`~adaptcheck.compat.rules.evaluate_all`, :func:`~adaptcheck.compat.known_good.match_known_good`)
on the same files; this gathers the answer as plain data: every rule's verdict, the nearest
known-good stack, and the advice. (The checks stay separate results, each with its own file
override, so they call the evaluators themselves.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.matrix_evidence import ComparedRecord
from adaptcheck.compat.known_good import MatchResult, extra_known_good_files, load_known_good_sources, match_known_good
from adaptcheck.compat.rules import RuleInputs, Verdict, evaluate_all, load_rules


class RuleVerdictRow(BaseModel):
    """One rule's verdict in the printed assessment."""

    id: str = Field(description="Rule id.")
    verdict: str = Field(description="ok, warn, incompatible, not_applicable, or error (could not be evaluated).")
    message: str = Field(description="The verdict in words.")
    advice: list[str] = Field(description="What to change (empty when ok).")
    source: str = Field(description="Where the rule's fact comes from.")
    compared: ComparedRecord = Field(description="The values the rule compared.")


class KnownGoodSummary(BaseModel):
    """The known-good match in the printed assessment."""

    matched: bool = Field(description="The stack matches an entry.")
    entry: str | None = Field(description="The matching (or nearest) entry's id.")
    source: str | None = Field(description="The entry's source.")
    date: str | None = Field(description="When the entry's source was read.")
    basis: str | None = Field(description="measured or published.")
    file: str = Field(description="The file the entry comes from.")
    differences: list[str] = Field(description="How the stack differs from the entry.")
    changes: list[str] = Field(description="Version changes that reach it.")


class AssessmentReport(BaseModel):
    """What ``adaptcheck env --check`` prints under ``assessment`` in json/yaml."""

    rules: list[RuleVerdictRow] = Field(description="Every rule, in file order.")
    known_good: KnownGoodSummary = Field(description="The known-good match.")
    advice: list[str] = Field(description="What to change, most serious first.")

    def dump(self) -> dict[str, object]:
        """Plain JSON values; a rule's ``compared`` keeps only the keys its evaluator set."""
        return self.model_dump(mode="json", exclude_unset=True)


@dataclass
class Assessment:
    """Every rule's verdict and the known-good match of one environment."""

    verdicts: list[Verdict]
    known_good: MatchResult
    known_good_origin: str

    @property
    def incompatible(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.verdict == "incompatible" or v.error is not None]

    def advice(self) -> list[str]:
        """What to change, most serious first: each incompatible rule's fix, each warning's,
        then the way to the nearest known-good stack."""
        lines = [f"{v.rule_id}: {'; '.join(v.advice)}" for v in self.verdicts
                 if v.verdict == "incompatible" and v.advice]
        lines += [f"{v.rule_id} (warning): {'; '.join(v.advice)}" for v in self.verdicts
                  if v.verdict == "warn" and v.advice]
        kg = self.known_good.advice()
        if kg:
            lines.append(kg)
        return lines

    def report(self) -> AssessmentReport:
        """The assessment as ``adaptcheck env --check --format json`` prints it (``dump()`` it)."""
        entry = self.known_good.entry
        return AssessmentReport(
            rules=[RuleVerdictRow(id=v.rule_id, verdict="error" if v.error else v.verdict, message=v.message,
                                  advice=v.advice, source=v.source, compared=v.compared) for v in self.verdicts],
            known_good=KnownGoodSummary(
                matched=self.known_good.matched, entry=entry.id if entry else None,
                source=entry.source if entry else None, date=entry.date if entry else None,
                basis=entry.basis if entry else None, file=self.known_good_origin,
                differences=self.known_good.differences, changes=self.known_good.changes),
            advice=self.advice(),
        )


def assess(env: Environment, rules_file: Path | None = None, known_good_file: Path | None = None,
           extra_known_good: Sequence[Path] | None = None) -> Assessment:
    """Evaluate every rule and match the known-good stacks (``$ADAPTCHECK_KNOWN_GOOD`` files
    included unless ``extra_known_good`` is given). Raises MatrixError on a bad data file."""
    rules = load_rules(rules_file)
    sources = load_known_good_sources(known_good_file, extra_known_good_files() if extra_known_good is None
                                      else extra_known_good)
    match = match_known_good(env, sources.known)
    origin = str(sources.origin[match.entry.id]) if match.entry else ""
    return Assessment(evaluate_all(rules, RuleInputs(env)), match, origin)
