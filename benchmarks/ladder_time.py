"""Where a ladder's wall time goes: per step and per check, for one run or several side by side.

Runs ``python -m adaptcheck run --ladder L [--model M] [--steps S] --out DIR --quiet`` (timed
from the outside: the process wall time, start-up and report writing included), then reads the
run folder's ``checks.jsonl`` — every check's ``duration_s`` as the worker measured it — and
prints:

* the total: process wall, the sum of the checks, and what is outside them (worker start-ups,
  environment capture, grading, the report);
* one row per step: checks, seconds, share of the checks' time, statuses;
* the top N checks by seconds, each with a note that says what its time bought: a framework
  check that paid for a load says so (``loaded here in 31 s``), a serving scenario says how many
  runs each level took, why it stopped and the measured seconds per run
  (``L1: 3 runs (budget), 4.1 s measured/run``), a soak its duration.

``--from DIR`` reads existing run folders instead of running (give it several times to compare
before/after: one column per run, the first is the baseline of the Δ column). The wall time of a
run read back is ``finished_at − started_at`` from its results.json (the process wall is only
known for a run this script started).

    python benchmarks/ladder_time.py --ladder quick --model /tmp/models/smollm2 --device cpu
    python benchmarks/ladder_time.py --ladder quick --steps 4,5 --top 15 --keep /tmp/lt
    python benchmarks/ladder_time.py --from reports/before --from reports/after
    python benchmarks/ladder_time.py --ladder quick --max-total-s 240    # exit 1 above 240 s

Exit status: 0; 1 when ``--max-total-s`` is given and a run's wall time is above it; 2 on a usage
problem (a folder without checks.jsonl). Timings depend on the machine and its load: run it on an
otherwise idle machine (``uptime``), and compare runs of one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]


class UsageProblem(Exception):
    """Something the person running the benchmark must fix (exit 2)."""


@dataclass
class CheckTime:
    """One ladder check (one ``checks.jsonl`` record): its seconds, statuses and a note."""

    id: str
    step: int
    kind: str
    seconds: float
    statuses: list[str]
    note: str = ""


@dataclass
class RunTimes:
    """One run folder, read back."""

    label: str
    folder: Path
    checks: list[CheckTime] = field(default_factory=list)
    wall_s: float | None = None
    """Process wall time (a run this script started), else finished_at − started_at, else None."""
    wall_source: str = ""
    returncode: int | None = None
    grade: str | None = None
    model: str | None = None

    @property
    def checks_s(self) -> float:
        return sum(c.seconds for c in self.checks)

    def by_step(self) -> dict[int, list[CheckTime]]:
        out: dict[int, list[CheckTime]] = {}
        for c in self.checks:
            out.setdefault(c.step, []).append(c)
        return dict(sorted(out.items()))

    def seconds(self, check_id: str) -> float | None:
        return next((c.seconds for c in self.checks if c.id == check_id), None)


# ------------------------------------------------------------------ reading a run folder


def _serving_note(details: dict[str, Any]) -> str:
    """'L1: 3 runs (budget), 4.1 s/run; L4: …' from a perf.serving outcome's levels."""
    parts = []
    for lv in details.get("levels") or []:
        stab = lv.get("stability") or {}
        runs = lv.get("runs") or []
        durations = [r.get("duration_s") for r in runs if isinstance(r.get("duration_s"), (int, float))]
        per = f", {sum(durations) / len(durations):.1f} s measured/run" if durations else ""
        disturbed = stab.get("disturbed_runs") or 0
        extra = f" +{disturbed} disturbed" if disturbed else ""
        parts.append(f"L{lv.get('level', '?'):g}: {stab.get('runs', len(runs))} runs{extra} "
                     f"({stab.get('stop') or stab.get('verdict') or '?'}){per}")
    return "; ".join(parts)


def _framework_note(check_id: str, details: dict[str, Any], metrics: dict[str, Any]) -> str:
    fw = details.get("framework")
    notes = []
    if isinstance(fw, dict) and fw.get("loaded_by") == check_id and isinstance(fw.get("load_s"), (int, float)):
        notes.append(f"loaded {fw.get('name', '?')} here in {fw['load_s']:.1f} s")
    if isinstance(metrics.get("model_generation_s"), (int, float)):
        notes.append(f"model generated in {metrics['model_generation_s']:.1f} s")
    for key, what in (("load_s[compile off]", "compile off load"), ("load_s[compile on]", "compile on load")):
        if isinstance(metrics.get(key), (int, float)):
            notes.append(f"{what} {metrics[key]:.1f} s")
    return "; ".join(notes)


def _note(check_id: str, kind: str, results: list[dict[str, Any]]) -> str:
    first = results[0] if results else {}
    details = first.get("details") or {}
    metrics = first.get("metrics") or {}
    if kind == "perf.serving":
        return _serving_note(details)
    if kind.startswith("framework."):
        return _framework_note(check_id, details, metrics)
    if kind == "perf.soak":
        soak = details.get("soak") or {}
        if soak:
            return f"duration {soak.get('duration_s')} s + warm-up {soak.get('warmup_s')} s"
    return ""


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def read_run(folder: Path, label: str | None = None) -> RunTimes:
    """A run folder's check times (checks.jsonl), wall time and grade (results.json when there)."""
    journal = folder / "checks.jsonl"
    if not journal.is_file():
        raise UsageProblem(f"{folder} has no checks.jsonl: not an adaptcheck run folder (or nothing ran)")
    run = RunTimes(label=label or folder.name, folder=folder)
    for line in journal.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            results = rec["results"]
            spec_id = rec["spec_id"]
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (a killed run): not a finished check
        if not results:
            continue
        first = results[0]
        kind = str(first.get("kind", ""))
        run.checks.append(CheckTime(
            id=spec_id, step=int(first.get("step", 0)), kind=kind,
            seconds=sum(float(r.get("duration_s") or 0.0) for r in results),
            statuses=[str(r.get("status")) for r in results], note=_note(spec_id, kind, results)))
    results_path = folder / "results.json"
    if results_path.is_file():
        try:
            data = json.loads(results_path.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
        start, end = _parse_time(data.get("started_at")), _parse_time(data.get("finished_at"))
        if start and end:
            run.wall_s, run.wall_source = (end - start).total_seconds(), "results.json started_at..finished_at"
        grade = data.get("grade")
        if isinstance(grade, dict):
            run.grade = grade.get("level") or grade.get("grade")
        model = data.get("model")
        if isinstance(model, dict):
            run.model = model.get("name") or model.get("path")
    return run


# ------------------------------------------------------------------------- running one


def run_ladder(args: argparse.Namespace, out: Path) -> RunTimes:
    """``adaptcheck run`` in a child process, timed from the outside, then read back."""
    cmd = [sys.executable, "-m", "adaptcheck", "run", "--ladder", args.ladder, "--out", str(out), "--quiet",
           "--seed", str(args.seed)]
    for flag, value in (("--model", args.model), ("--device", args.device), ("--steps", args.steps)):
        if value:
            cmd += [flag, value]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
                          env=dict(os.environ))
    wall = time.perf_counter() - start
    if not (out / "checks.jsonl").is_file():
        raise UsageProblem(f"adaptcheck run wrote no checks.jsonl (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-1500:]}")
    run = read_run(out, label=out.name)
    run.wall_s, run.wall_source, run.returncode = wall, "process wall (adaptcheck run)", proc.returncode
    return run


# --------------------------------------------------------------------------- the tables


def _fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _status_counts(checks: list[CheckTime]) -> str:
    counts: dict[str, int] = {}
    for c in checks:
        for s in c.statuses:
            counts[s] = counts.get(s, 0) + 1
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def print_single(run: RunTimes, top: int, out: TextIO) -> None:
    """One run: total, per step, top checks with notes."""
    print(f"run {run.label}  ({run.folder})", file=out)
    if run.model:
        print(f"model: {run.model}", file=out)
    wall = run.wall_s
    outside = None if wall is None else wall - run.checks_s
    print(f"wall {_fmt_s(wall)} s ({run.wall_source or 'unknown'}); checks {run.checks_s:.1f} s; "
          f"outside the checks {_fmt_s(outside)} s" + (f"; grade {run.grade}" if run.grade else "")
          + (f"; exit {run.returncode}" if run.returncode is not None else ""), file=out)
    print("", file=out)
    print(f"{'step':>4}  {'checks':>6}  {'seconds':>8}  {'share':>6}  statuses", file=out)
    total = run.checks_s or 1.0
    for step, checks in run.by_step().items():
        secs = sum(c.seconds for c in checks)
        print(f"{step:>4}  {len(checks):>6}  {secs:>8.1f}  {100 * secs / total:>5.1f}%  {_status_counts(checks)}",
              file=out)
    print("", file=out)
    ranked = sorted(run.checks, key=lambda c: c.seconds, reverse=True)[:top]
    width = max((len(c.id) for c in ranked), default=10)
    print(f"top {len(ranked)} checks", file=out)
    print(f"{'#':>2}  {'check':<{width}}  {'step':>4}  {'seconds':>8}  {'share':>6}  {'status':<6}  note", file=out)
    for i, c in enumerate(ranked, 1):
        status = c.statuses[0] if len(set(c.statuses)) == 1 else "/".join(sorted(set(c.statuses)))
        print(f"{i:>2}  {c.id:<{width}}  {c.step:>4}  {c.seconds:>8.1f}  {100 * c.seconds / total:>5.1f}%  "
              f"{status:<6}  {c.note}", file=out)


def print_compare(runs: list[RunTimes], top: int, out: TextIO) -> None:
    """Several runs side by side: total and per step, then the top checks (by the largest
    seconds in any run); Δ is the last run minus the first."""
    labels = [r.label for r in runs]
    w = max(10, *(len(x) for x in labels))
    head = "  ".join(f"{x:>{w}}" for x in labels)
    print("runs: " + "; ".join(f"{r.label} = {r.folder}" for r in runs), file=out)
    print("", file=out)
    print(f"{'':<28}  {head}  {'Δ last-first':>12}", file=out)

    def row(name: str, values: list[float | None]) -> None:
        first, last = values[0], values[-1]
        delta = "—" if first is None or last is None else f"{last - first:+.1f}"
        print(f"{name:<28}  " + "  ".join(f"{_fmt_s(v):>{w}}" for v in values) + f"  {delta:>12}", file=out)

    row("wall (s)", [r.wall_s for r in runs])
    row("sum of checks (s)", [r.checks_s for r in runs])
    row("outside the checks (s)", [None if r.wall_s is None else r.wall_s - r.checks_s for r in runs])
    steps = sorted({s for r in runs for s in r.by_step()})
    for step in steps:
        row(f"step {step} (s)", [sum(c.seconds for c in r.by_step().get(step, [])) if step in r.by_step() else None
                                 for r in runs])
    print("", file=out)
    ids: dict[str, float] = {}
    for r in runs:
        for c in r.checks:
            ids[c.id] = max(ids.get(c.id, 0.0), c.seconds)
    ranked = sorted(ids, key=ids.__getitem__, reverse=True)[:top]
    width = max((len(x) for x in ranked), default=10)
    print(f"top {len(ranked)} checks (largest in any run)", file=out)
    print(f"{'check':<{width}}  " + "  ".join(f"{x:>{w}}" for x in labels) + f"  {'Δ':>8}", file=out)
    for cid in ranked:
        values = [r.seconds(cid) for r in runs]
        first, last = values[0], values[-1]
        delta = "—" if first is None or last is None else f"{last - first:+.1f}"
        print(f"{cid:<{width}}  " + "  ".join(f"{_fmt_s(v):>{w}}" for v in values) + f"  {delta:>8}", file=out)
    print("", file=out)
    for r in runs:  # the notes of the last-listed run's top checks say what the time bought
        notes = [(c.id, c.note) for c in sorted(r.checks, key=lambda c: c.seconds, reverse=True)[:top] if c.note]
        if notes:
            print(f"notes, {r.label}:", file=out)
            for cid, note in notes:
                print(f"  {cid}: {note}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ladder", default="quick", help="ladder name or YAML path (default: quick)")
    ap.add_argument("--model", default=None, help="--model for adaptcheck run (default: the ladder's)")
    ap.add_argument("--device", default=None, help="--device for adaptcheck run")
    ap.add_argument("--steps", default=None, help="--steps for adaptcheck run, e.g. 4,5")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=10, help="checks listed (default 10)")
    ap.add_argument("--keep", type=Path, default=None, help="write the run folder here (default: a temporary one, "
                    "kept and named at the end)")
    ap.add_argument("--from", dest="folders", type=Path, action="append", default=[],
                    help="read this run folder instead of running (repeat to compare runs)")
    ap.add_argument("--max-total-s", type=float, default=None, help="exit 1 when a run's wall time is above this")
    args = ap.parse_args(argv)
    try:
        if args.folders:
            runs = [read_run(f) for f in args.folders]
            labels = [r.label for r in runs]
            if len(set(labels)) < len(labels):  # same folder names: number them
                for i, r in enumerate(runs):
                    r.label = f"{i + 1}:{r.label}"
        else:
            out = args.keep or Path(tempfile.mkdtemp(prefix="ladder-time-"))
            if out.exists() and any(out.iterdir()):
                raise UsageProblem(f"{out} is not empty: give a new folder to --keep")
            runs = [run_ladder(args, out)]
    except UsageProblem as exc:
        print(f"ladder_time: {exc}", file=sys.stderr)
        return 2
    if len(runs) == 1:
        print_single(runs[0], args.top, sys.stdout)
    else:
        print_compare(runs, args.top, sys.stdout)
    if args.max_total_s is not None:
        over = [r for r in runs if r.wall_s is not None and r.wall_s > args.max_total_s]
        for r in over:
            print(f"OVER: {r.label} took {r.wall_s:.0f} s > {args.max_total_s:g} s", file=sys.stdout)
        if over:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
