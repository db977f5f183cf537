"""Which engine mode a check's verdict holds for — eager or compiled — read from its evidence.

A verdict on an engine that ran eager says nothing of the same engine compiled (graph capture and
torch.compile take other kernels and other batch shapes), and the deployment a user serves is
usually compiled. So every output of a check, and of the features and families tables built on
it, names the mode its evidence records, and says nothing where the evidence says nothing (a
framework without the switch, an adapter that leaves it to the engine's default): never a guess,
and never from a list of check ids.

Where the mode is recorded:

* ``details.framework.enforce_eager``: the instance the check ran on, as its adapter described it
  (:class:`~adaptcheck.frameworks.base.FrameworkFacts`; vLLM in process); ``details.server`` the
  same for a step-5 server;
* ``details.feature.engine``: a feature check's second instance, the one with the feature,
  read back from the engine (``enforce_eager``, else the resolved ``compilation_mode``). The
  feature's verdict is about that instance, so it wins; where it records neither, the mode is
  not known — the check's plain instance may well run the other one (``framework.compile``
  compares an eager instance with a compiled one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import JsonValue

from adaptcheck.base.features import FeatureStatus
from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.framework_evidence import FeatureProof
from adaptcheck.base.schemas.results import CheckResult, Status, TableRow

EAGER = "eager"
COMPILED = "compiled"
MODES = (EAGER, COMPILED)
"""In the order the report names them."""


class _ModeFacts(Evidence):
    """The parts of any check's details that can say which mode its engine ran in."""

    framework: dict[str, JsonValue] | None = None
    server: dict[str, JsonValue] | None = None
    feature: FeatureProof | None = None


def _from_facts(facts: Mapping[str, Any]) -> str | None:
    """``enforce_eager`` of an adapter's facts or an engine's read-back (None: not set, the default)."""
    eager = facts.get("enforce_eager")
    return (EAGER if eager else COMPILED) if isinstance(eager, bool) else None


def _from_engine(engine: Mapping[str, Any]) -> str | None:
    """The feature instance as its engine resolved it: ``enforce_eager``, else its compilation mode
    (vLLM's ``CompilationMode`` name, 'NONE' when nothing is compiled; a served engine's log says it)."""
    mode = _from_facts(engine)
    if mode is not None:
        return mode
    resolved = engine.get("compilation_mode")
    if isinstance(resolved, str) and resolved:
        return EAGER if resolved.upper() == "NONE" else COMPILED
    return None


def check_mode(result: CheckResult) -> str | None:
    """'eager' or 'compiled' when the check's evidence records which its verdict holds for; else None."""
    facts = result.evidence(_ModeFacts)
    if facts is None:
        return None
    if facts.feature is not None:
        return _from_engine(facts.feature.engine)
    for described in (facts.framework, facts.server):
        if described is not None and (mode := _from_facts(described)) is not None:
            return mode
    return None


def modes_text(modes: Iterable[str]) -> str:
    """'eager', 'compiled', 'eager and compiled', or '' for none."""
    found = set(modes)
    return " and ".join(m for m in MODES if m in found)


def row_mode(row: TableRow, by_id: Mapping[str, CheckResult]) -> str:
    """The modes a features (or families) row's verdict holds for: those of the checks that made it —
    the passes behind 'certified', the failures and errors behind 'failed'; '' for a row with no
    verdict (n/a, not tested) or whose checks record no mode."""
    if row.status is FeatureStatus.CERTIFIED:
        deciding = {Status.PASS}
    elif row.status is FeatureStatus.FAILED:
        deciding = {Status.FAIL, Status.ERROR}
    else:
        return ""
    modes = [check_mode(c) for cid in row.checks if (c := by_id.get(cid)) is not None and c.status in deciding]
    return modes_text(m for m in modes if m is not None)
