"""Does the same healthy machine get the same grade? N full quick runs back to back, then K standard runs.

Each run is ``python -m adaptcheck run --ladder LADDER --seed S --out DIR/<ladder>-<S> -q``
(seeds ``--seed-start``, ``--seed-start + 1`` …: a different random model and different
inputs each time, as on different days), one after the other on this machine. Prints one row
per run — ladder, seed, grade, wall time, exit status, the blockers for the next level (the
grade rules' condition names) and the checks that did not pass — then, per ladder, the grades
seen and the quick ladder's wall time (median and worst, against ``--max-quick-s``: the
4-minute budget of issue 27 with the real default model; issue 14 set 3 minutes for the embedded one).

Exit 1 when the runs of one ladder got different grades, a run wrote no results, or a quick
run took longer than ``--max-quick-s``; else 0. A benchmark for a quiet machine, not a test:
the full measurement (10 quick runs, ~25 min; ``--standard 3`` with vLLM installed adds about
an hour) is run by hand and quoted.

    python benchmarks/grade_reproducibility.py                          # 10 quick runs
    python benchmarks/grade_reproducibility.py --runs 10 --standard 3   # then 3 standard runs
    python benchmarks/grade_reproducibility.py --runs 2 --steps 1,2     # a smoke test (seconds)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

QUICK_BUDGET_S = 240.0
"""Issue 27's budget for the quick ladder with the real default model on a 2-core CPU (was 180 s
with the 2-layer embedded model)."""


@dataclass
class Run:
    """One ``adaptcheck run`` and what its results say."""

    ladder: str
    seed: int
    wall_s: float
    exit_code: int
    grade: str | None = None
    blockers: list[str] = field(default_factory=list)
    not_passing: list[str] = field(default_factory=list)


def read_run(ladder: str, seed: int, wall_s: float, exit_code: int, results: Path) -> Run:
    """The grade, the blockers' condition names and the failed/errored checks of one results.json."""
    run = Run(ladder=ladder, seed=seed, wall_s=wall_s, exit_code=exit_code)
    if not results.is_file():
        return run
    data: dict[str, Any] = json.loads(results.read_text(encoding="utf-8"))
    grade = data.get("grade") or {}
    run.grade = grade.get("level")
    # A blocker reads "L5 soak: <what the condition demands> — <which checks>"; the name is enough here.
    run.blockers = [b.split(":", 1)[0] for b in grade.get("blockers", [])]
    run.not_passing = [f"{c['id']}={c['status']}: {' '.join(str(c.get('message') or '').split())[:160]}"
                       for c in data.get("checks", []) if c.get("status") in ("fail", "error")]
    return run


def one_run(ladder: str, seed: int, root: Path, args: argparse.Namespace) -> Run:
    out = root / f"{ladder}-{seed}"
    cmd = [sys.executable, "-m", "adaptcheck", "run", "--ladder", ladder, "--seed", str(seed), "--out", str(out), "-q"]
    if args.device:
        cmd += ["--device", args.device]
    if args.steps:
        cmd += ["--steps", args.steps]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    run = read_run(ladder, seed, time.perf_counter() - t, proc.returncode, out / "results.json")
    if run.grade is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        run.not_passing = [f"no results.json (exit {proc.returncode}): {tail[0][:200]}"]
    return run


def report(runs: list[Run], max_quick_s: float, out: TextIO) -> int:
    """Print the table and the verdict; returns the exit status."""
    out.write(f"\n{'run':>3}  {'ladder':<9}{'seed':>5}  {'grade':<6}{'wall':>8}{'exit':>6}  blockers for the next level\n")
    out.writelines(f"{i:>3}  {r.ladder:<9}{r.seed:>5}  {r.grade or '-':<6}{r.wall_s:>7.0f}s{r.exit_code:>6}  "
                  f"{', '.join(r.blockers) or '-'}\n" for i, r in enumerate(runs, 1))
    for i, r in enumerate(runs, 1):
        out.writelines(f"     run {i}: {line}\n" for line in r.not_passing)
    status = 0
    for ladder in dict.fromkeys(r.ladder for r in runs):
        mine = [r for r in runs if r.ladder == ladder]
        grades = [r.grade or "no results" for r in mine]
        seen = sorted(set(grades))
        same = len(seen) == 1 and mine[0].grade is not None
        verdict = ("the same grade every time" if same else
                   "SOME RUNS WROTE NO RESULTS" if "no results" in grades else "GRADES DIFFER")
        out.write(f"\n{ladder}: {len(mine)} runs, grades {', '.join(f'{g} x{grades.count(g)}' for g in seen)}"
                  f" — {verdict}\n")
        status |= 0 if same else 1
        walls = [r.wall_s for r in mine]
        if ladder == "quick":
            worst = max(walls)
            over = max_quick_s > 0 and worst > max_quick_s
            out.write(f"quick ladder wall time: median {statistics.median(walls):.0f} s, worst {worst:.0f} s "
                      f"(budget {max_quick_s:.0f} s{': OVER' if over else ''})\n")
            status |= 1 if over else 0
        else:
            out.write(f"{ladder} ladder wall time: median {statistics.median(walls):.0f} s, worst {max(walls):.0f} s\n")
    return status


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="quick-ladder runs (default 10)")
    p.add_argument("--standard", type=int, default=0, metavar="K", help="then K standard-ladder runs (default 0)")
    p.add_argument("--seed-start", type=int, default=1, help="seed of the first run; each next run +1")
    p.add_argument("--device", help="passed to adaptcheck run (default: its own choice)")
    p.add_argument("--steps", help="passed to adaptcheck run: a subset for a smoke test (e.g. 1,2)")
    p.add_argument("--max-quick-s", type=float, default=QUICK_BUDGET_S,
                   help="a quick run longer than this fails the benchmark (0: no limit)")
    p.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    if args.runs < 0 or args.standard < 0 or args.runs + args.standard == 0:
        p.error("nothing to run: give --runs and/or --standard a positive count")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grade-repro-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plan = [("quick", args.seed_start + i) for i in range(args.runs)]
        plan += [("standard", args.seed_start + i) for i in range(args.standard)]
        runs: list[Run] = []
        for n, (ladder, seed) in enumerate(plan, 1):
            run = one_run(ladder, seed, root, args)
            runs.append(run)
            print(f"  {n}/{len(plan)} {ladder} seed {seed}: {run.grade or 'no results'} in {run.wall_s:.0f} s "
                  f"(exit {run.exit_code})", flush=True)
        return report(runs, args.max_quick_s, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
