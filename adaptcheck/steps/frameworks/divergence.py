"""How far one model's next-token distributions are from another's, position by position.

Per position of a teacher-forced sequence: the bucketed KL(reference || device) (a lower
bound of the true KL), the |delta logprob| of the scored token and whether both sides' most
likely token agree; then their summaries and each bound's verdict. The estimator and the
bounds: docs/step4-numerics.md ("Figures per position"). Everything here is pure: scores in,
statistics out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adaptcheck.base.klestimate import position_kl, quantile
from adaptcheck.base.schemas.framework_evidence import BoundVerdict
from adaptcheck.base.schemas.numerics import Rule

__all__ = ["HIST_EDGES", "PositionStats", "compare_positions", "histogram", "judge", "position_kl", "quantile",
           "summarize"]

HIST_EDGES = [x / 2 for x in range(-24, 3)]
"""log10(KL) bin edges of the report's chart: 1e-12 .. 10, half a decade per bin."""


@dataclass
class PositionStats:
    """Per-position figures of one comparison, in sequence order."""

    kl: list[float]
    dlogprob: list[float]
    same_top: list[bool]

    def extend(self, other: PositionStats) -> None:
        self.kl += other.kl
        self.dlogprob += other.dlogprob
        self.same_top += other.same_top


def compare_positions(ref_tops: Sequence[dict[int, float]], ref_lps: Sequence[float],
                      dev_tops: Sequence[dict[int, float]], dev_lps: Sequence[float]) -> PositionStats:
    """Position-by-position figures of one sequence scored on two sides."""
    if len(ref_tops) != len(dev_tops):
        raise ValueError(f"{len(ref_tops)} reference positions vs {len(dev_tops)} scored")
    out = PositionStats([], [], [])
    for rt, rl, dt, dl in zip(ref_tops, ref_lps, dev_tops, dev_lps, strict=False):
        out.kl.append(position_kl(rt, dt))
        out.dlogprob.append(abs(rl - dl))
        out.same_top.append(max(rt, key=rt.__getitem__) == max(dt, key=dt.__getitem__))
    return out


def summarize(s: PositionStats) -> dict[str, float]:
    n = len(s.kl)
    return {
        "positions": n,
        "kl_mean": sum(s.kl) / n if n else 0.0,
        "kl_p99": quantile(s.kl, 0.99),
        "kl_max": max(s.kl, default=0.0),
        "dlogprob_mean": sum(s.dlogprob) / n if n else 0.0,
        "dlogprob_max": max(s.dlogprob, default=0.0),
        "same_top_rate": sum(s.same_top) / n if n else 1.0,
    }


def histogram(values: Sequence[float], edges: Sequence[float] = HIST_EDGES) -> list[int]:
    """Counts of log10(value) per bin; values below the first edge (0 included) land in
    the first bin, above the last in the last bin."""
    counts = [0] * (len(edges) - 1)
    for v in values:
        x = math.log10(v) if v > 0 else edges[0]
        i = next((k for k in range(len(edges) - 1) if x < edges[k + 1]), len(edges) - 2)
        counts[i] += 1
    return counts


def judge(stats: Mapping[str, float], control: Mapping[str, float], rules: Mapping[str, Rule],
          dtype: str) -> dict[str, BoundVerdict]:
    """Each rule's verdict: ``value <= multiple x control + floor[dtype]``, by statistic."""
    out: dict[str, BoundVerdict] = {}
    for stat, rule in rules.items():
        bound = rule.bound(control[stat], dtype)
        out[stat] = BoundVerdict(value=stats[stat], bound=bound, multiple=rule.multiple,
                                 floor=rule.floor[dtype],  # type: ignore[index]
                                 control=control[stat], ok=stats[stat] <= bound)
    return out
