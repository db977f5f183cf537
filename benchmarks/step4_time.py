"""Step 4's wall time on a ladder, for this checkout and for a baseline revision, and its growth.

Runs ``python -m adaptcheck run --ladder quick --steps 4 --out DIR`` for the checkout this
script belongs to and for an export of ``--baseline-rev`` (default ``f66ec07``, the commit
before issue 13 made step 4 teacher-forced), reads each run's ``results.json`` and prints,
per step-4 check and in total, the seconds of both and the growth in percent. With
``--repeat N`` each side runs N times, alternating which goes first, and the median is shown.

Both sides run in this Python (same venv, same torch, vLLM and transformers); each gets its
own source tree first on ``PYTHONPATH``, which wins over the editable install, and the script
checks that the child really imports adaptcheck from that tree. The baseline tree is a
``git archive`` export of the revision into a temporary folder: nothing in the repository's
git state changes. Entry points (check kinds, frameworks) come from the installed
distribution's metadata and resolve to modules of whichever tree is imported; this holds as
long as the two revisions register the same entry points.

Timings depend on the machine and its load: run it on an otherwise idle machine. The
synthetic model is generated once per generator version into ``$ADAPTCHECK_CACHE_DIR`` and
reused; a run that generated it says so under the table (``model generated in``), since that
is a one-off cost, not step 4's. Exit code 1 when the total grew more than ``--max-growth``
percent, 2 on a usage problem (unknown revision, a tree that cannot be imported).

    python benchmarks/step4_time.py                            # quick ladder, baseline f66ec07
    python benchmarks/step4_time.py --repeat 3 --device cpu
    python benchmarks/step4_time.py --ladder my-step4.yaml --baseline-rev HEAD~3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "f66ec07"
DEFAULT_MAX_GROWTH = 25.0  # percent: issue 13's budget for step 4 on the quick ladder
STEP = 4
TOTAL = "step 4 total (sum of checks)"
WALL = "process wall (adaptcheck run)"


class UsageProblem(Exception):
    """Something the person running the benchmark must fix (exit 2)."""


@dataclass
class Run:
    """One ``adaptcheck run``: seconds per step-4 check, the process wall time, one-off costs."""

    checks: dict[str, float]
    statuses: dict[str, str]
    wall: float
    returncode: int
    model_generation_s: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.checks.values())


@dataclass
class Side:
    """One source tree under test and its runs."""

    name: str
    tree: Path
    runs: list[Run] = field(default_factory=list)

    def median(self, check: str) -> float | None:
        if check == TOTAL:
            vals = [r.total for r in self.runs]
        elif check == WALL:
            vals = [r.wall for r in self.runs]
        else:
            vals = [r.checks[check] for r in self.runs if check in r.checks]
        return statistics.median(vals) if vals else None


# ---------------------------------------------------------------- the trees


def export_revision(rev: str, dest: Path, repo: Path = REPO) -> str:
    """Write the tree of ``rev`` into ``dest`` (``git archive``; the repository is not
    touched) and return the full commit id."""
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if found.returncode != 0 or not found.stdout.strip():
        raise UsageProblem(f"unknown revision {rev!r} in {repo}: give a commit of this repository (--baseline-rev)")
    sha = found.stdout.strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", sha], capture_output=True, check=False)
    if archive.returncode != 0:
        raise UsageProblem(f"git archive {sha} failed: {archive.stderr.decode(errors='replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return sha


def child_env(tree: Path) -> dict[str, str]:
    """This environment with ``tree`` first on PYTHONPATH (ahead of the editable install)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def check_imports_from(tree: Path) -> None:
    """Fail unless a child with :func:`child_env` imports adaptcheck from ``tree``."""
    if not (tree / "adaptcheck" / "__init__.py").is_file():
        raise UsageProblem(f"adaptcheck does not import from {tree}: no adaptcheck package there")
    probe = subprocess.run([sys.executable, "-c", "import adaptcheck; print(adaptcheck.__file__)"],
                           capture_output=True, text=True, env=child_env(tree), cwd=tree, check=False)
    where = Path(probe.stdout.strip()).resolve() if probe.returncode == 0 else None
    if where is None or not where.is_relative_to(tree.resolve()):
        raise UsageProblem(f"adaptcheck does not import from {tree} (got {probe.stdout.strip() or probe.stderr[-300:]})")


# ---------------------------------------------------------------- one run


def read_run(results: Path, wall: float, returncode: int) -> Run:
    """Step-4 seconds per check from a results.json (plain JSON: both revisions' files read alike)."""
    data: dict[str, Any] = json.loads(results.read_text(encoding="utf-8"))
    checks: dict[str, float] = {}
    statuses: dict[str, str] = {}
    generation = 0.0
    for c in data.get("checks") or []:
        if not isinstance(c, dict) or c.get("step") != STEP:
            continue
        cid = str(c.get("id"))
        checks[cid] = checks.get(cid, 0.0) + float(c.get("duration_s") or 0.0)
        statuses[cid] = str(c.get("status"))
        gen = (c.get("metrics") or {}).get("model_generation_s")
        if isinstance(gen, (int, float)):
            generation += float(gen)
    return Run(checks=checks, statuses=statuses, wall=wall, returncode=returncode, model_generation_s=generation)


def run_once(side: Side, ladder: str, out: Path, extra: list[str], timeout: float) -> Run:
    """``adaptcheck run --steps 4`` of one tree into ``out``."""
    cmd = [sys.executable, "-m", "adaptcheck", "run", "--ladder", ladder, "--steps", str(STEP), "--out", str(out),
           *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(side.tree), cwd=side.tree,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    results = out / "results.json"
    if not results.is_file():
        raise UsageProblem(f"{side.name}: adaptcheck run exited {proc.returncode} without results.json:\n"
                           f"{proc.stderr[-2000:]}")
    return read_run(results, wall, proc.returncode)


# ---------------------------------------------------------------- the table


def growth(base: float | None, cur: float | None) -> float | None:
    if base is None or cur is None or base <= 0:
        return None
    return 100.0 * (cur - base) / base


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1f}%"


def print_table(base: Side, cur: Side, out: TextIO = sys.stdout) -> float | None:
    """Per-check medians of both sides, the total and the process wall; returns the total's growth."""
    ids: list[str] = []
    for side in (base, cur):
        for r in side.runs:
            ids += [i for i in r.checks if i not in ids]
    width = max([len(TOTAL), len(WALL), *(len(i) for i in ids)])
    out.write(f"{'check':<{width}}  {base.name:>12}  {cur.name:>12}  {'growth':>8}\n")
    for cid in [*ids, TOTAL, WALL]:
        if cid == TOTAL:
            out.write("-" * (width + 40) + "\n")
        b, c = base.median(cid), cur.median(cid)
        out.write(f"{cid:<{width}}  {_s(b):>12}  {_s(c):>12}  {_pct(growth(b, c)):>8}\n")
    for side in (base, cur):
        for i, r in enumerate(side.runs, 1):
            notes = []
            if r.model_generation_s > 0:
                notes.append(f"model generated in {r.model_generation_s:.1f} s (one-off, included above)")
            if r.returncode != 0:
                notes.append(f"adaptcheck run exited {r.returncode}")
            bad = sorted(k for k, s in r.statuses.items() if s not in ("pass", "skip"))
            if bad:
                notes.append("not passing: " + ", ".join(f"{k}={r.statuses[k]}" for k in bad))
            if notes:
                out.write(f"  {side.name} run {i}: " + "; ".join(notes) + "\n")
    return growth(base.median(TOTAL), cur.median(TOTAL))


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ladder", default="quick", help="ladder name or path (default quick)")
    p.add_argument("--baseline-rev", default=DEFAULT_BASELINE,
                   help=f"revision to compare with (default {DEFAULT_BASELINE}, the commit before issue 13)")
    p.add_argument("--repeat", type=int, default=1, help="runs per side; the median is shown (default 1)")
    p.add_argument("--device", help="passed to adaptcheck run --device")
    p.add_argument("--max-growth", type=float, default=DEFAULT_MAX_GROWTH,
                   help=f"exit 1 when the total grew more than this many percent (default {DEFAULT_MAX_GROWTH:g})")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per adaptcheck run (default 3600)")
    p.add_argument("--keep", type=Path, help="keep the runs and the baseline tree in this folder")
    p.add_argument("--arg", action="append", default=[], dest="extra", metavar="ARG",
                   help="one more argument for adaptcheck run (repeatable), e.g. --arg=--seed --arg=7")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(argv)
    extra = list(args.extra) + (["--device", args.device] if args.device else [])
    work = args.keep if args.keep else Path(tempfile.mkdtemp(prefix="step4-time-"))
    work.mkdir(parents=True, exist_ok=True)
    ladder = str(Path(args.ladder).resolve()) if Path(args.ladder).is_file() else args.ladder
    try:
        sha = export_revision(args.baseline_rev, work / "baseline-tree")
        base = Side(name=f"base {sha[:7]}", tree=work / "baseline-tree")
        cur = Side(name="current", tree=REPO)
        for side in (base, cur):
            check_imports_from(side.tree)
        out.write(f"step 4 of ladder {args.ladder}: {cur.name} ({REPO}) vs {base.name}, {args.repeat} run(s) each\n")
        for i in range(args.repeat):
            # Alternate who goes first, so a machine warming up (or slowing down) hits both alike.
            for side in (base, cur) if i % 2 == 0 else (cur, base):
                run = run_once(side, ladder, work / f"{side.name.split()[0]}-{i + 1}", extra, args.timeout)
                side.runs.append(run)
                out.write(f"  {side.name} run {i + 1}: step 4 {run.total:.1f} s (wall {run.wall:.1f} s)\n")
                out.flush()
        out.write("\n")
        total = print_table(base, cur, out)
    except UsageProblem as exc:
        sys.stderr.write(f"step4_time: {exc}\n")
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if total is None:
        out.write("\nno step-4 time measured on one side: nothing to compare\n")
        return 2
    verdict = "within" if total <= args.max_growth else "OVER"
    out.write(f"\nstep 4 grew {total:+.1f}% ({verdict} the {args.max_growth:g}% budget)\n")
    return 0 if total <= args.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())
