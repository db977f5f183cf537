"""Upgrade an older results file's JSON to the current schema's shapes, on load.

:class:`RunResults` validates the current shapes only; every change of shape within a
major version gets one function here, keyed by the minor version that introduced it, and a
file older than that version goes through it before validation (a ``mode="before"``
validator of ``RunResults``, so every way of reading a file upgrades it). Readers then see one shape
whatever version wrote the file, and the "older files looked like this" knowledge lives in
this one module instead of in every reader.

Upgrades work on the parsed JSON (plain dicts), must accept whatever an older adaptcheck
wrote (and hand-made files: anything unexpected is left as it is, for validation to judge),
and never need anything outside the file.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from adaptcheck.base.families import FAMILIES, FAMILY_TABLE
from adaptcheck.base.features import FEATURES, Outcome, Planned, feature_table

FRAMEWORK_STEP = 4
COLLECTIVES_KIND = "framework.collectives"
"""The one step-4 kind that runs no framework (its details have no ``framework``)."""


def parse_version(text: str) -> tuple[int, int]:
    """'1.2' → (1, 2); anything unreadable → (0, 0), i.e. older than every upgrade."""
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 0, 0


def _framework_from_id(check_id: str) -> str | None:
    """The ladder convention ``<prefix>.<framework>.<kind>`` ('framework.vllm.reference').

    Only for files before 1.3, whose step-4 results did not always name their framework (a
    not-applicable toggle skip, a crashed worker): what the report used to guess, applied
    once here so that no reader guesses any more.
    """
    parts = check_id.split(".")
    return parts[1] if len(parts) >= 3 and parts[1] else None


def _framework_1_3(raw: dict[str, Any]) -> None:
    """1.3: a step-4 lifecycle result's ``details.framework`` is one object in every outcome.

    Before, it was a dict of facts when the framework loaded, the bare name when it was absent
    or failed, and missing on some skips and on crashed checks.
    """
    checks = raw.get("checks")
    if not isinstance(checks, list):
        return
    for check in checks:
        if not isinstance(check, dict) or check.get("step") != FRAMEWORK_STEP or check.get("kind") == COLLECTIVES_KIND:
            continue
        details = check.get("details")
        if details is None:
            details = check["details"] = {}
        if not isinstance(details, dict):
            continue
        fw = details.get("framework")
        if isinstance(fw, dict):
            # The dict form was only ever written from a loaded instance (lifecycle.framework_facts).
            name = fw.get("name") or fw.get("framework") or _framework_from_id(str(check.get("id", "")))
            if isinstance(name, str) and name:
                details["framework"] = {**fw, "name": name, "loaded": fw.get("loaded", True)}
        elif isinstance(fw, str) and fw:
            details["framework"] = {"name": fw, "loaded": False}
        elif fw is None:
            name = _framework_from_id(str(check.get("id", "")))
            if name is not None:
                details["framework"] = {"name": name, "loaded": False}


KIND_LABELS_1_3: dict[str, str] = {
    "framework.load": "load",
    "framework.single_request": "single requests",
    "framework.reference": "vs CPU reference",
    "framework.concurrent": "alone vs batched",
    "framework.kv_cache": "KV cache",
    "framework.compile": "compile on vs off",
    "framework.tensor_parallel": "tensor parallel vs one device",
    "framework.collectives": "collectives",
}
"""The report's short names of the kinds before 1.4 (frozen: they describe the files of that time)."""
COMPARES_1_3: dict[str, str] = {
    "framework.concurrent": "batched vs alone",
    "framework.kv_cache": "prefix-cache hit vs recompute",
    "framework.compile": "compile on vs off",
}
"""What the two runs of a same-framework kind were, before 1.4 (frozen likewise)."""


def _kind_labels_1_4(raw: dict[str, Any]) -> None:
    """1.4: checks and planned checks record their kind's label (and the two runs it compares).

    Before, the report held these in tables of its own; a kind it did not list showed its name,
    which is what a missing label still means.
    """
    for key in ("checks", "planned"):
        items = raw.get(key)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            kind = item.get("kind")
            if isinstance(kind, str) and kind in KIND_LABELS_1_3 and "kind_label" not in item:
                item["kind_label"] = KIND_LABELS_1_3[kind]
            if key == "checks" and isinstance(kind, str) and kind in COMPARES_1_3 and "compares" not in item:
                item["compares"] = COMPARES_1_3[kind]


def _str_list(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _tag_inputs(raw: dict[str, Any]) -> tuple[list[Outcome], list[Planned], list[int]]:
    """The file's checks, planned checks and steps as the tag-table rule reads them. Entries of an
    unexpected shape are ignored here (validation judges them)."""
    outcomes = [Outcome(id=str(c.get("id", "")), status=str(c.get("status", "")),
                        applicable=c.get("applicable", True) is not False, message=str(c.get("message", "")),
                        tags=_str_list(c.get("tags")), step=step if isinstance(step := c.get("step"), int) else 0)
                for c in _dicts(raw.get("checks"))]
    planned = [Planned(id=str(p.get("id", "")), step=step if isinstance(step := p.get("step"), int) else 0,
                       tags=_str_list(p.get("tags")))
               for p in _dicts(raw.get("planned"))]
    steps = [s for s in raw["steps"] if isinstance(s, int)] if isinstance(raw.get("steps"), list) else []
    return outcomes, planned, steps


def _features_1_5(raw: dict[str, Any]) -> None:
    """1.5: the features table, computed from the file's own checks and their ``feature:`` tags.

    No ladder before 1.5 tagged a feature, so an older file's rows all read 'not tested', which
    is what such a run established. An existing ``features`` (a hand-made file) is left as it is.
    """
    if "features" in raw:
        return
    raw["features"] = [{"name": v.name, "description": FEATURES[v.name], "status": v.status.value,
                        "reason": v.reason, "checks": v.checks}
                       for v in feature_table(*_tag_inputs(raw))]


def _families_1_6(raw: dict[str, Any]) -> None:
    """1.6: the families table, computed from the file's checks and their ``family:`` tags (no older
    ladder had any: every row 'not tested'); the model's families stay unknown (an empty list),
    so the grade counts the checks as it did. An existing ``families`` is left as it is."""
    if "families" in raw:
        return
    raw["families"] = [{"name": v.name, "description": FAMILIES[v.name], "status": v.status.value,
                        "reason": v.reason, "checks": v.checks, "model": False}
                       for v in FAMILY_TABLE.table(*_tag_inputs(raw))]


def _deployment_1_7(raw: dict[str, Any]) -> None:
    """1.7: ``deployment``, the deployment under test, and ``deployed`` on each feature row.

    No older run took ``--serve``: such a file certified adaptcheck's own settings, which it says by
    having no deployment (``null``, not a made-up ``source: adaptcheck`` record whose engine it never
    named), and no row of its features table was deployed. Existing values (a hand-made file) stay.
    """
    raw.setdefault("deployment", None)
    for row in _dicts(raw.get("features")):
        row.setdefault("deployed", False)


UPGRADES: list[tuple[tuple[int, int], Callable[[dict[str, Any]], None]]] = [
    ((1, 3), _framework_1_3),
    ((1, 4), _kind_labels_1_4),
    ((1, 5), _features_1_5),
    ((1, 6), _families_1_6),
    ((1, 7), _deployment_1_7),
]
"""(version that introduced the shape, in-place upgrade of the parsed file), oldest first."""


def upgrade_results(raw: dict[str, Any], current: str) -> dict[str, Any]:
    """``raw`` (a parsed results file) in the current shapes; ``raw`` itself is not changed.

    Applies, in order, every upgrade newer than the file's ``schema_version``; an older file
    then says ``current``, since that is the shape it now has (a re-save must not claim an
    older one). A file without a version is left for validation to refuse, and a newer minor
    version is left as it is: nothing here knows its shapes.
    """
    if "schema_version" not in raw:
        return raw
    version = parse_version(str(raw["schema_version"]))
    if version >= parse_version(current):
        return raw
    # A copy: the caller's dict (a test's, a reader's) must not change under it.
    out = copy.deepcopy(raw)
    for introduced, upgrade in UPGRADES:
        if version < introduced:
            upgrade(out)
    out["schema_version"] = current
    return out
