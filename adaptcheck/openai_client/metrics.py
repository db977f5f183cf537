"""``/metrics`` scraping: Prometheus text exposition parsed into ``{series: value}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PROM_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$")
_PROM_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition, keyed ``name`` or ``name{k="v",…}``.

    Labels are kept in the key, sorted by label name (so the key does not depend on the
    order the server wrote them), values unescaped-then-re-quoted as written. Histogram and
    summary series appear as their ``_bucket``/``_sum``/``_count`` samples. ``# HELP`` /
    ``# TYPE`` lines and timestamps are dropped; ``NaN`` and ``±Inf`` are kept as floats.
    Use :func:`metric_total` to sum a metric over its label sets.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _PROM_SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        key = m.group("name")
        if m.group("labels"):
            labels = sorted(_PROM_LABEL.findall(m.group("labels")))
            if labels:
                key += "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
        out[key] = value
    return out


def metric_total(samples: Mapping[str, float], name: str) -> float | None:
    """Sum of every sample of ``name`` (all label sets); None when there is none."""
    values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else None
