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
from typing import Any

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.compat.known_good import MatchResult, extra_known_good_files, load_known_good_sources, match_known_good
from adaptcheck.compat.rules import RuleInputs, Verdict, evaluate_all, load_rules


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

    def to_dict(self) -> dict[str, Any]:
        entry = self.known_good.entry
        return {
            "rules": [{"id": v.rule_id, "verdict": "error" if v.error else v.verdict, "message": v.message,
                       "advice": v.advice, "source": v.source, "compared": v.compared} for v in self.verdicts],
            "known_good": {"matched": self.known_good.matched, "entry": entry.id if entry else None,
                           "source": entry.source if entry else None, "date": entry.date if entry else None,
                           "basis": entry.basis if entry else None, "file": self.known_good_origin,
                           "differences": self.known_good.differences, "changes": self.known_good.changes},
            "advice": self.advice(),
        }


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
