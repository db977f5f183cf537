"""Where step 3's time goes: reference kernels vs device op vs inputs vs comparison vs harness.

Runs the ``ops.op`` checks of a ladder in this process on the selected device — no worker,
no runner, no report — and prints, per op and in total, the wall time of the check split
into the four phases the harness measures per case (``reference_s``, ``op_s``, ``inputs_s``,
``compare_s``) plus what is left over: the harness overhead (speed probe, case fitting,
summaries, provider lookup). It prints figures and asserts nothing: timings depend on the
machine and are for people deciding what to optimise (e.g. whether the float64 reference
or the device dominates, which decides where a case budget is better spent).

    python benchmarks/step3_time_split.py                       # quick ladder, auto device
    python benchmarks/step3_time_split.py --ladder standard --device cuda
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from adaptcheck.backends.registry import select_backend
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams

# (column heading, metric key the check reports); the order of the table's columns.
PHASES: tuple[tuple[str, str], ...] = (
    ("reference", "reference_s"),
    ("device op", "op_s"),
    ("inputs", "inputs_s"),
    ("compare", "compare_s"),
)
OVERHEAD = "harness"


@dataclass
class Split:
    """Seconds of one check (or the total), by phase."""

    name: str
    wall: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: {h: 0.0 for h, _ in PHASES})
    results: int = 0
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def overhead(self) -> float:
        # Whatever the per-case timers did not see; clamped because the timers and the wall
        # clock are read separately and can disagree by microseconds on tiny checks.
        return max(0.0, self.wall - sum(self.phases.values()))

    def add(self, other: Split) -> None:
        self.wall += other.wall
        for k, v in other.phases.items():
            self.phases[k] += v
        self.results += other.results
        for k, n in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + n


def run_check(ctx: CheckContext, name: str, params: OpCheckParams) -> Split:
    """Run one ``ops.op`` check in-process and split its wall time."""
    t0 = time.perf_counter()
    outcomes: list[Outcome] = OpCheck().run(ctx, params)
    split = Split(name=name, wall=time.perf_counter() - t0, results=len(outcomes))
    for o in outcomes:
        split.statuses[o.status.value] = split.statuses.get(o.status.value, 0) + 1
        for heading, key in PHASES:
            value = o.metrics.get(key)
            if isinstance(value, (int, float)):
                split.phases[heading] += float(value)
    return split


def _cell(seconds: float, wall: float) -> str:
    pct = 100.0 * seconds / wall if wall > 0 else 0.0
    return f"{seconds * 1e3:9.1f} ms {pct:5.1f}%"


def format_table(rows: list[Split], total: Split) -> str:
    """A fixed-width text table: one row per op, a total row, each phase in ms and % of wall."""
    headings = ["op", "wall", *[h for h, _ in PHASES], OVERHEAD, "results"]
    width_op = max([len(headings[0]), len(total.name), *(len(r.name) for r in rows)])
    cell_w = len(_cell(0.0, 1.0))

    def line(split: Split) -> str:
        statuses = ", ".join(f"{n} {k}" for k, n in sorted(split.statuses.items()))
        cells = [f"{split.wall * 1e3:9.1f} ms", *[_cell(split.phases[h], split.wall) for h, _ in PHASES],
                 _cell(split.overhead, split.wall)]
        return "  ".join([split.name.ljust(width_op), *[c.rjust(cell_w if i else 12) for i, c in enumerate(cells)],
                          statuses])

    head = "  ".join([headings[0].ljust(width_op), headings[1].rjust(12),
                      *[h.rjust(cell_w) for h in headings[2:-1]], headings[-1]])
    rule = "-" * len(head)
    return "\n".join([head, rule, *(line(r) for r in rows), rule, line(total)])


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run step 3 of ``--ladder`` and print the time split; returns a process exit code."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladder", default="quick", help="built-in ladder name or YAML path (default: quick)")
    parser.add_argument("--device", default=None, help="backend name (default: the one available accelerator, else CPU)")
    parser.add_argument("--device-index", type=int, default=0, help="device index (default 0)")
    parser.add_argument("--seed", type=int, default=1234, help="run seed: same seed, same inputs")
    parser.add_argument("--ops", default=None, help="op provider for every check (like 'adaptcheck run --ops')")
    args = parser.parse_args(argv)

    loaded = load_ladder(args.ladder)
    checks = [c for c in loaded.spec.checks if c.step == 3 and c.kind == OpCheck.kind]
    if not checks:
        print(f"ladder {loaded.source} has no step-3 {OpCheck.kind} checks", file=out)
        return 1
    backend, _probe = select_backend(args.device)
    with tempfile.TemporaryDirectory(prefix="adaptcheck-bench-") as run_dir:
        ctx = CheckContext(backend=backend, device_index=args.device_index, seed=args.seed, run_dir=Path(run_dir),
                           model=loaded.spec.model, device_count=1, op_provider=args.ops)
        rows: list[Split] = []
        t_all = time.perf_counter()
        for spec in checks:
            params = OpCheckParams.model_validate(spec.params)
            # The op name is what a reader scans for; the id only matters when one op has several checks.
            name = params.op if spec.id == f"ops.{params.op}" else f"{params.op} ({spec.id})"
            rows.append(run_check(ctx, name, params))
        elapsed = time.perf_counter() - t_all

    total = Split(name="total")
    for r in rows:
        total.add(r)
    print(f"step-3 time split: ladder {loaded.spec.id} {loaded.spec.version} ({loaded.source}),"
          f" device {backend.display_name} [{ctx.device}], seed {args.seed}", file=out)
    print(format_table(rows, total), file=out)
    print(f"total wall time: {elapsed:.3f} s for {len(rows)} op checks, {total.results} results", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
