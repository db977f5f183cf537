#!/usr/bin/env python3
"""Did a change keep behaviour? Compares the check statuses of two runs' results.json.

Issue 28's "behaviour unchanged": the same seed on the same machine must give the same status
for every check before and after a refactor. Prints one row per check whose status differs
(or that is in one run only), then a summary; exits 1 on any difference, 0 when every check
of both runs has the same status. Timings and figures are not compared (they are measurements).

    python benchmarks/same_statuses.py BEFORE/results.json AFTER/results.json [--ignore ID ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from adaptcheck.base.schemas.results import RunResults


def statuses(path: Path) -> tuple[RunResults, dict[str, str]]:
    """The run, and check id -> status (the results file's own loader: older schemas load too)."""
    run = RunResults.load(path)
    return run, {c.id: c.status.value for c in run.checks}


def differences(before: dict[str, str], after: dict[str, str], ignore: set[str]) -> list[tuple[str, str, str]]:
    """(check id, status before, status after) where they differ; '-' where a run lacks the check."""
    ids = [i for i in dict.fromkeys([*before, *after]) if i not in ignore]
    return [(i, before.get(i, "-"), after.get(i, "-")) for i in ids if before.get(i, "-") != after.get(i, "-")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--ignore", action="append", default=[], help="a check id not to compare (repeatable)")
    args = parser.parse_args(argv)
    run_a, a = statuses(args.before)
    run_b, b = statuses(args.after)
    diff = differences(a, b, set(args.ignore))
    print(f"before: {args.before} (seed {run_a.seed}, {len(a)} checks, grade {run_a.grade.level if run_a.grade else '-'})")
    print(f"after:  {args.after} (seed {run_b.seed}, {len(b)} checks, grade {run_b.grade.level if run_b.grade else '-'})")
    if run_a.seed != run_b.seed:
        print("warning: the seeds differ, so the runs are not the same experiment")
    for check_id, was, now in diff:
        print(f"  {check_id}: {was} -> {now}")
    same = sum(1 for i, status in a.items() if i not in args.ignore and b.get(i) == status)
    print(f"{same} checks with the same status, {len(diff)} different")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
