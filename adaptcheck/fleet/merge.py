"""Merge many ``results.json`` files into the fleet matrix: the usable runs merged, every
unusable one (unreadable, edited, unfinished, without environment, a duplicate) skipped and
named with its reason.

Which runs count and why: docs/fleet.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import adaptcheck
from adaptcheck.base.errors import IntegrityError, InvalidInputError, exception_line
from adaptcheck.base.integrity import VerifyResult
from adaptcheck.base.schemas.results import RunResults, utcnow
from adaptcheck.base.trusted import load_verified
from adaptcheck.fleet.models import (
    KNOWN_GOOD_MIN_LEVEL,
    Combination,
    FleetMatrix,
    RunRef,
    SkippedInput,
    StackKey,
)
from adaptcheck.fleet.stack import key_id, stack_key
from adaptcheck.grade import level_at_least
from adaptcheck.runfolder import RESULTS, regrade


@dataclass
class Merged:
    """The matrix plus, per row id, the latest run's full results (export needs its environment)."""

    matrix: FleetMatrix
    latest: dict[str, RunResults]


def results_path(path: Path) -> Path:
    """A run folder stands for its results.json, so ``reports/*`` works as well as ``reports/*/results.json``."""
    return path / RESULTS if path.is_dir() else path


@dataclass
class _Loaded:
    stored: str  # the grade the file claims
    results: RunResults  # regraded from its own checks
    check: VerifyResult  # what its digest says


def _load(path: Path, allow_unverified: bool) -> _Loaded | str:
    """The file's claimed grade, regraded results and verification, or why the input is skipped."""
    file = results_path(path)
    try:
        # An IntegrityError passes through: merge() marks that skip as one --allow-unverified lifts.
        results, check = load_verified(file, allow_unverified)
    except InvalidInputError as exc:
        # The loader's messages start with the path (and maybe ':LINE'); the skip list already names it.
        text = exc.one_line()
        if not text.startswith(f"{file}:"):
            return text
        rest = text[len(f"{file}:"):]
        line = re.match(r"(\d+): ", rest)
        return f"line {line.group(1)}: {rest[line.end():]}" if line else rest.lstrip()
    except (RecursionError, ValueError, OSError) as exc:
        # The loader turns every known problem into InvalidInputError; should any other slip
        # through, it still costs only this file, never the whole merge.
        return f"unreadable: {exception_line(exc)}"
    if not results.complete:
        return (f"incomplete run {results.run_id} (interrupted before its last check): "
                "finish it with 'adaptcheck run --resume DIR' to merge it")
    if results.environment is None:
        return f"run {results.run_id} captured no environment (step 1 matrix.capture did not run): no stack to file it under"
    return _Loaded(results.grade.level, regrade(results), check)


def _ref(path: Path, loaded: _Loaded) -> RunRef:
    results = loaded.results
    assert results.environment is not None
    return RunRef(run_id=results.run_id, path=str(path), host=results.environment.hostname,
                  started_at=results.started_at, grade=results.grade.level, stored_grade=loaded.stored,
                  ladder=f"{results.ladder.id} {results.ladder.version}", adaptcheck_version=results.adaptcheck_version,
                  integrity=loaded.check.status.value, verified=loaded.check.intact)


_Item = tuple[int, Path, _Loaded]  # (position among the inputs, path as given, what it holds)


def _dedupe(loaded: list[_Item]) -> tuple[list[_Item], list[tuple[int, SkippedInput]]]:
    """One file per run id: the first intact copy, else the first copy; the others are skipped.

    A copied report or an overlapping glob must not count one run twice; and when one of
    the copies was edited, the copy its digest still vouches for is the one to believe.
    """
    by_run: dict[str, list[_Item]] = {}
    for item in loaded:
        by_run.setdefault(item[2].results.run_id, []).append(item)
    kept: list[_Item] = []
    skipped: list[tuple[int, SkippedInput]] = []
    for run_id, copies in by_run.items():
        chosen = next((c for c in copies if c[2].check.intact), copies[0])
        kept.append(chosen)
        for index, path, copy in copies:
            if index == chosen[0]:
                continue
            why = f"duplicate of run {run_id}, already read from {chosen[1]}"
            if chosen[2].check.intact and not copy.check.intact:
                why = (f"duplicate of run {run_id}, {copy.check.unverified_reason}: the intact copy "
                       f"{chosen[1]} was merged instead")
            skipped.append((index, SkippedInput(path=str(path), reason=why)))
    return sorted(kept, key=lambda k: k[0]), skipped


def _row(key: StackKey, runs: list[tuple[RunRef, RunResults]]) -> Combination:
    # Oldest first; the run id breaks ties so the order never depends on the argument order.
    runs = sorted(runs, key=lambda r: (r[0].started_at, r[0].run_id))
    refs = [ref for ref, _ in runs]
    unverified = [r.run_id for r in refs if not r.verified]
    latest_ref, latest = runs[-1]
    # max() keeps the first of equal grades; reversed → the latest run reaching the best grade.
    best = max(reversed(refs), key=lambda r: int(r.grade[1:]))
    qualifies = level_at_least(latest_ref.grade, KNOWN_GOOD_MIN_LEVEL)
    if qualifies:
        reason = f"latest run {latest_ref.run_id} reached {latest_ref.grade}"
    else:
        reason = f"latest run {latest_ref.run_id} reached {latest_ref.grade}, below {KNOWN_GOOD_MIN_LEVEL}"
        if best.grade != latest_ref.grade and level_at_least(best.grade, KNOWN_GOOD_MIN_LEVEL):
            reason += f" (run {best.run_id} reached {best.grade} earlier: the stack has since regressed)"
    return Combination(
        id=key_id(key), key=key, best_grade=best.grade, best_run_id=best.run_id,
        latest_grade=latest_ref.grade, latest_run_id=latest_ref.run_id, latest_blockers=list(latest.grade.blockers),
        runs=refs, hosts=sorted({r.host for r in refs}), ladders=sorted({r.ladder for r in refs}),
        first_started=refs[0].started_at, last_started=latest_ref.started_at,
        known_good=qualifies, known_good_reason=reason, verified=not unverified,
    )


def merge(paths: Sequence[Path], allow_unverified: bool = False) -> Merged:
    """Merge ``paths`` (results files or run folders); see :func:`merge_results`."""
    unusable: list[tuple[int, SkippedInput]] = []
    loaded: list[_Item] = []
    for index, path in enumerate(paths):
        try:
            outcome = _load(Path(path), allow_unverified)
        except IntegrityError as exc:
            reason = exc.one_line().removeprefix(f"{results_path(Path(path))}: ")
            unusable.append((index, SkippedInput(path=str(path), reason=reason, unverified=True)))
            continue
        if isinstance(outcome, str):
            unusable.append((index, SkippedInput(path=str(path), reason=outcome)))
        else:
            loaded.append((index, Path(path), outcome))
    kept, duplicates = _dedupe(loaded)
    skipped = [s for _, s in sorted(unusable + duplicates, key=lambda x: x[0])]
    groups: dict[str, tuple[StackKey, list[tuple[RunRef, RunResults]]]] = {}
    for _, path, item in kept:
        key = stack_key(item.results)
        groups.setdefault(key_id(key), (key, []))[1].append((_ref(path, item), item.results))
    rows = [_row(key, runs) for key, runs in groups.values()]
    rows.sort(key=lambda r: (r.key.backend, r.key.devices, r.key.device_count, r.key.arch, r.id))
    latest = {r.id: next(res for ref, res in groups[r.id][1] if ref.run_id == r.latest_run_id) for r in rows}
    matrix = FleetMatrix(adaptcheck_version=adaptcheck.__version__, generated_at=utcnow(), inputs=len(paths),
                         merged_runs=len(kept), rows=rows, skipped=skipped)
    return Merged(matrix, latest)


def merge_results(paths: Sequence[Path], allow_unverified: bool = False) -> FleetMatrix:
    """The fleet matrix of ``paths`` (results.json files or run folders).

    Each file is loaded and verified with :func:`adaptcheck.base.trusted.load_verified` and
    regraded from its own checks and rules. Unusable inputs (edited or undigested ones too,
    unless ``allow_unverified``: then merged and marked) and repeated run ids are listed in
    ``skipped``; the matrix has no rows when nothing could be merged (the caller decides
    whether that is an error).
    """
    return merge(paths, allow_unverified).matrix


__all__ = ["Merged", "merge", "merge_results", "results_path"]
