"""Intervals over seeds, shared by the benchmarks."""

from __future__ import annotations

import math
import statistics

# Two-sided 95% Student t quantiles for n-1 degrees of freedom.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (0 for one value; NaNs left out)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = _T95.get(len(values) - 1, 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def shown(values: list[float]) -> str:
    """`mean ± half-width`, or n/a."""
    mean, half = interval(values)
    return "n/a" if math.isnan(mean) else f"{mean:.3g} ± {half:.2g}"
