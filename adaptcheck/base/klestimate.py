"""The bucketed KL estimator and the quantile of step 4, shared with its standalone reproducers.

Pure and standard-library only (``math``), annotated with builtin types only (a bare script
evaluates them), because the reproducer (``adaptcheck.repro.model``) copies these functions' source
into a script that must run without adaptcheck: the figure a kernel engineer gets from the
script is then computed by the very code the check used.
"""

import math


def position_kl(ref: dict[int, float], dev: dict[int, float]) -> float:
    """Bucketed KL(ref || dev) at one position from two ``token id -> logprob`` maps: each of
    dev's tokens that ref also lists is its own bucket, everything else one rest bucket (a
    lower bound of the true KL, by the data-processing inequality)."""
    shared = [t for t in dev if t in ref]
    kl = p_sum = q_sum = 0.0
    for t in shared:
        p, q = math.exp(ref[t]), math.exp(dev[t])
        p_sum += p
        q_sum += q
        if p > 0:
            kl += p * (ref[t] - dev[t])
    p_rest, q_rest = max(0.0, 1.0 - p_sum), max(0.0, 1.0 - q_sum)
    if p_rest > 1e-12:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-300)))
    return max(0.0, kl)  # rounding can leave a tiny negative; the true value is >= 0


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default), 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
