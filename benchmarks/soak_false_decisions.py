"""Wrong decisions and time to decide of perf.soak's sequential memory rule, by Monte Carlo.

The exact rule of :mod:`adaptcheck.perf.trend` (:func:`~adaptcheck.perf.trend.sequential_verdict`:
every look from ``duration_s`` to ``max_duration_s``, each at the per-look confidence, stopping
at the first look that settles the series) on simulated memory series — a straight line plus
stationary AR(1) noise of lag-1 correlation ρ, sampled every ``sample_interval_s`` — for each
soak rule of the quick and standard ladders (or ``--rule``). Cases:

- ``at bound``: growing exactly at ``max_growth_mib_per_min`` — both verdicts are wrong; each
  must stay at about ``1 − confidence`` (5 %) or below over all looks together;
- ``flat``: a healthy server (slope 0) — how often it is decided ("within") by the budget,
  and when, for the noise given (``--noise``, MiB: the residual noise of a real soak);
- ``2 x bound``: a leak twice the bound — how often and how early it fails.

    python benchmarks/soak_false_decisions.py                           # the two ladders' soak rules
    python benchmarks/soak_false_decisions.py --rule 10:20:60:4:3:1 --noise 4 --trials 2000

A rule is ``BOUND:FIRST_S:LAST_S:LOOKS:WARMUP_S:INTERVAL_S``. Exit 1 when a wrong decision at
the bound happens more often than ``--max-wrong`` (default 7.5 %) in any case.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adaptcheck.ladder.loader import load_ladder
from adaptcheck.perf.trend import SequentialRule, simulate_sequential

RHOS = (0.0, 0.5, 0.8)
AT_BOUND_NOISE_MIB = 2.0
"""Noise of the at-bound case (its wrong-decision rate hardly depends on it: the bound and the
noise scale together)."""


def ladder_rules() -> list[tuple[str, SequentialRule, float]]:
    """Each shipped ladder's perf.soak rule, with its sample interval."""
    out = []
    for name in ("quick", "standard"):
        spec = load_ladder(name).spec  # resolved: quick extends standard
        for check in spec.checks:
            if check.kind != "perf.soak":
                continue
            p = check.params
            first = float(p.get("duration_s", 300.0))
            last = float(p.get("max_duration_s") or first)
            looks = int(p.get("looks", 4)) if last > first else 1
            rule = SequentialRule(float(p.get("max_growth_mib_per_min", 10.0)), first, last, looks,
                                  float(p.get("warmup_s", 30.0)), float(p.get("confidence", 0.95)))
            out.append((f"{name}", rule, float(p.get("sample_interval_s", 1.0))))
    return out


def parse_rule(text: str) -> tuple[str, SequentialRule, float]:
    bound, first, last, looks, warmup, interval = (float(x) for x in text.split(":"))
    return text, SequentialRule(bound, first, last, int(looks), warmup), interval


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rule", action="append", default=[], help="BOUND:FIRST_S:LAST_S:LOOKS:WARMUP_S:INTERVAL_S "
                    "(repeatable); default: the quick and standard ladders' soak rules")
    ap.add_argument("--noise", type=float, action="append", default=[], help="noise (MiB) of the flat and leak "
                    "cases (repeatable; default 2 and 5)")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-wrong", type=float, default=0.075)
    args = ap.parse_args(argv)
    rules = [parse_rule(r) for r in args.rule] or ladder_rules()
    noises = args.noise or [2.0, 5.0]
    worst = 0.0
    print(f"{'rule':<22} {'case':<18} {'noise':>6} {'rho':>4}  {'within':>7} {'over':>7} {'undecided':>9} "
          f"{'mean stop':>9}")
    for label, rule, interval in rules:
        name = f"{label} {rule.first_s:g}-{rule.last_s:g}s/{len(rule.times())}"
        cases = [("at bound", rule.bound_mib_per_min, AT_BOUND_NOISE_MIB)]
        cases += [(c, slope, noise) for noise in noises
                  for c, slope in (("flat", 0.0), ("2 x bound", 2 * rule.bound_mib_per_min))]
        for case, slope, noise in cases:
            for rho in RHOS:
                r = simulate_sequential(rule, slope, noise, rho, interval_s=interval, trials=args.trials,
                                        seed=args.seed)
                if case == "at bound":
                    worst = max(worst, r["within"], r["over"])
                print(f"{name:<22} {case:<18} {noise:>6g} {rho:>4g}  {r['within']:>7.1%} {r['over']:>7.1%} "
                      f"{r['inconclusive']:>9.1%} {r['mean_stop_s']:>8.0f}s", flush=True)
    print(f"largest wrong-decision rate at the bound: {worst:.1%} (limit {args.max_wrong:.1%})")
    return 0 if worst <= args.max_wrong else 1


if __name__ == "__main__":
    sys.exit(main())
