"""How long a ladder is expected to take, for the header ``adaptcheck run`` prints first.

Two kinds of time are added up. What the ladder states: a soak's budget (``max_duration_s``,
else ``duration_s``; it stops sooner once decided), a timed serving scenario's
``duration_s`` × levels × ``min_runs``. And what it does not: every other
check gets a typical time for its kind (measured on a 2-core CPU running the quick ladder;
a big model or a slow device takes longer), a serving scenario counted in requests gets a
typical time per measured run, an op check a share of its ``budget_s``. Whenever a typical
time is used the estimate is "about", and the header says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adaptcheck.base.schemas.ladder import CheckSpec

TYPICAL_S: dict[str, float] = {
    "matrix.capture": 3.0,
    "perf.gemm": 20.0,
    "perf.collectives": 10.0,
    "perf.attention": 3.0,
    "perf.memory_bandwidth": 3.0,
}
"""Typical seconds of the kinds that declare none (``Check.typical_s``; quick ladder, 2-core
CPU); kinds not listed take :data:`TYPICAL_BY_PREFIX` of their family, else :data:`TYPICAL_DEFAULT_S`."""
TYPICAL_BY_PREFIX: dict[str, float] = {"matrix.": 0.5, "smoke.": 0.5, "ops.": 1.0, "framework.": 2.0, "perf.": 2.0}
TYPICAL_DEFAULT_S = 5.0
SERVING_RUN_S = 10.0
"""A serving run counted in requests (not timed): warm-up plus its requests, typically."""
OP_BUDGET_SHARE = 0.2
"""Op checks shrink their cases to fit ``budget_s``, and most finish well inside it."""
SOAK_DRAIN_S = 15.0
"""After its last look a soak waits for the requests still in flight."""


@dataclass(frozen=True)
class Estimate:
    """Expected wall time of some checks."""

    seconds: float
    stated_s: float
    """The part the ladder states (soak and timed serving durations)."""
    exact: bool
    """True when every check's time is stated by the ladder; else the total is "about"."""

    def text(self) -> str:
        """E.g. 'about 21 min (5 min of it stated by the ladder: soak, timed serving runs)'."""
        total = format_minutes(self.seconds)
        if self.exact:
            return total
        stated = f" ({format_minutes(self.stated_s)} of it stated by the ladder: soak, timed serving runs)" \
            if self.stated_s >= 60 else ""
        return f"about {total}{stated}"


def format_minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _number(params: Mapping[str, object], key: str, default: float) -> float:
    """A number the ladder states (still unvalidated YAML); ``default`` when absent or null.
    Anything else that ``float`` refuses raises, and the check is then estimated as typical."""
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"{key}: not a number")


def _count(params: Mapping[str, object], key: str) -> int:
    """How many items a list the ladder states has (1 when absent); raises like ``len`` on a non-list."""
    value = params.get(key)
    if value is None:
        return 1
    if isinstance(value, (list, str, dict)):
        return len(value)
    raise TypeError(f"{key}: not a list")


def _declared(kind: str) -> float | None:
    """The kind class's own typical time (``Check.typical_s``); None when it declares none or
    the kind is unknown (the ladder loader reports that, not the estimate)."""
    from adaptcheck.base.errors import UnknownNameError
    from adaptcheck.ladder.registry import get_check_class

    try:
        return get_check_class(kind).typical_s
    except (UnknownNameError, ImportError, AttributeError):
        return None


def _typical(kind: str) -> float:
    declared = _declared(kind)
    if declared is not None:
        return declared
    if kind in TYPICAL_S:
        return TYPICAL_S[kind]
    return next((s for prefix, s in TYPICAL_BY_PREFIX.items() if kind.startswith(prefix)), TYPICAL_DEFAULT_S)


def check_estimate(spec: CheckSpec) -> tuple[float, bool]:
    """(seconds, stated): a check's expected time, and whether the ladder states it."""
    p = spec.params or {}
    try:
        if spec.kind == "perf.soak":
            # The budget: a soak stops sooner once its memory trends are decided.
            shortest = _number(p, "duration_s", 300.0)
            return max(shortest, _number(p, "max_duration_s", shortest)) + SOAK_DRAIN_S, True
        if spec.kind == "perf.serving":
            # min_runs are always measured; more only while undecided and within budget_s.
            runs = _count(p, "levels") * int(_number(p, "min_runs", 3))
            duration = p.get("duration_s")
            if duration:
                return _number(p, "duration_s", 0.0) * runs, True
            return SERVING_RUN_S * runs, False
        if spec.kind == "ops.op" and "budget_s" in p:
            return max(_typical(spec.kind), OP_BUDGET_SHARE * _number(p, "budget_s", 0.0)), False
    except (TypeError, ValueError):
        pass  # a malformed parameter is the check's own error to report; estimate it as typical
    return _typical(spec.kind), False


def estimate(checks: list[CheckSpec], runs_here: Callable[[CheckSpec], bool] | None = None) -> Estimate:
    """The expected wall time of running ``checks`` one after the other.

    ``runs_here`` says whether a check will really run on this machine; one that will not (its
    framework or op provider is not installed, no ``--endpoint`` was given) is a skip of a few
    milliseconds and adds nothing. Without vLLM the standard ladder's 42 vLLM op checks and 19
    framework checks are such skips: counted at their typical times they made a 13-minute run's
    header say "about 18 min"."""
    total = stated = 0.0
    exact = True
    for spec in checks:
        if runs_here is not None and not runs_here(spec):
            continue
        seconds, known = check_estimate(spec)
        total += seconds
        if known:
            stated += seconds
        else:
            exact = False
    return Estimate(seconds=total, stated_s=stated, exact=exact)
