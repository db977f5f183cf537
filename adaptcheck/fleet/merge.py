"""Merge many ``results.json`` files into the fleet matrix.

Someone merging 200 node reports wants the good ones merged and the bad ones named, not
the whole merge lost to one truncated file: every input that cannot be used is skipped
with a one-line reason, and the caller decides what an empty result means (the CLI exits
non-zero only when nothing could be merged). A run is usable when it loads, finished
(an interrupted run's grade says nothing about the stack), and captured its environment
(without step 1 there is no combination to file it under).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import adaptcheck
from adaptcheck.errors import InvalidInputError
from adaptcheck.fleet.models import (
    KNOWN_GOOD_MIN_LEVEL,
    Combination,
    FleetMatrix,
    RunRef,
    SkippedInput,
    StackKey,
)
from adaptcheck.fleet.stack import key_id, stack_key
from adaptcheck.integrity import verify_file
from adaptcheck.models.results import RunResults, utcnow
from adaptcheck.session import RESULTS, regrade
from adaptcheck.steps.grade import level_at_least


@dataclass
class Merged:
    """The matrix plus, per row id, the latest run's full results (export needs its environment)."""

    matrix: FleetMatrix
    latest: dict[str, RunResults]


def results_path(path: Path) -> Path:
    """A run folder stands for its results.json, so ``reports/*`` works as well as ``reports/*/results.json``."""
    return path / RESULTS if path.is_dir() else path


def _load(path: Path) -> tuple[str, RunResults] | str:
    """The grade the file claims and the regraded results, or why the input is skipped."""
    try:
        results = RunResults.load(results_path(path))
    except InvalidInputError as exc:
        # The loader's messages start with the path; the skip list already names it.
        return exc.one_line().removeprefix(f"{results_path(path)}: ")
    if not results.complete:
        return (f"incomplete run {results.run_id} (interrupted before its last check): "
                "finish it with 'adaptcheck run --resume DIR' to merge it")
    if results.environment is None:
        return f"run {results.run_id} captured no environment (step 1 matrix.capture did not run): no stack to file it under"
    return results.grade.level, regrade(results)


def _ref(path: Path, stored: str, results: RunResults) -> RunRef:
    assert results.environment is not None
    return RunRef(run_id=results.run_id, path=str(path), host=results.environment.hostname,
                  started_at=results.started_at, grade=results.grade.level, stored_grade=stored,
                  ladder=f"{results.ladder.id} {results.ladder.version}", adaptcheck_version=results.adaptcheck_version,
                  integrity=verify_file(results_path(path)).status.value)


def _row(key: StackKey, runs: list[tuple[RunRef, RunResults]]) -> Combination:
    # Oldest first; the run id breaks ties so the order never depends on the argument order.
    runs = sorted(runs, key=lambda r: (r[0].started_at, r[0].run_id))
    refs = [ref for ref, _ in runs]
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
        known_good=qualifies, known_good_reason=reason,
    )


def merge(paths: Sequence[Path]) -> Merged:
    """Merge ``paths`` (results files or run folders); see :func:`merge_results`."""
    skipped: list[SkippedInput] = []
    seen: dict[str, Path] = {}
    groups: dict[str, tuple[StackKey, list[tuple[RunRef, RunResults]]]] = {}
    for path in paths:
        outcome = _load(Path(path))
        if isinstance(outcome, str):
            skipped.append(SkippedInput(path=str(path), reason=outcome))
            continue
        stored, loaded = outcome
        first = seen.get(loaded.run_id)
        if first is not None:
            # A copied report or an overlapping glob: the same run must not count twice.
            skipped.append(SkippedInput(path=str(path), reason=f"duplicate of run {loaded.run_id}, already read from {first}"))
            continue
        seen[loaded.run_id] = Path(path)
        key = stack_key(loaded)
        groups.setdefault(key_id(key), (key, []))[1].append((_ref(Path(path), stored, loaded), loaded))
    rows = [_row(key, runs) for key, runs in groups.values()]
    rows.sort(key=lambda r: (r.key.backend, r.key.devices, r.key.device_count, r.key.arch, r.id))
    latest = {r.id: next(res for ref, res in groups[r.id][1] if ref.run_id == r.latest_run_id) for r in rows}
    matrix = FleetMatrix(adaptcheck_version=adaptcheck.__version__, generated_at=utcnow(), inputs=len(paths),
                         merged_runs=len(seen), rows=rows, skipped=skipped)
    return Merged(matrix, latest)


def merge_results(paths: Sequence[Path]) -> FleetMatrix:
    """The fleet matrix of ``paths`` (results.json files or run folders).

    Each file is loaded with :meth:`RunResults.load` and regraded from its own checks and
    rules. Unusable inputs and repeated run ids are listed in ``skipped``; the matrix has
    no rows when nothing could be merged (the caller decides whether that is an error).
    """
    return merge(paths).matrix


__all__ = ["Merged", "merge", "merge_results", "results_path"]
