"""Intervals over seeds, shared by the benchmarks."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

# Two-sided 95% Student t quantiles for 1-9 degrees of freedom.
_T95 = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    6: 2.4469,
    7: 2.3646,
    8: 2.3060,
    9: 2.2622,
}
_Z975 = 1.959964  # the normal's 97.5% quantile


def t95(dof: int) -> float:
    """The two-sided 95% Student t quantile for `dof` degrees of freedom: from the
    table up to 9, beyond it from the Cornish-Fisher expansion about the normal's
    quantile (within 2e-4 of the exact value from 10 on)."""
    if dof < 1:
        raise ValueError(f"{dof} degrees of freedom: an interval needs two values")
    if dof in _T95:
        return _T95[dof]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
    )


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (0 for one value; NaNs left out)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def shown(values: list[float]) -> str:
    """`mean ± half-width`, or n/a."""
    return _shown(*interval(values))


def _shown(mean: float, half: float) -> str:
    return "n/a" if math.isnan(mean) else f"{mean:.3g} ± {half:.2g}"


def paired_interval(first: list[float], other: list[float]) -> tuple[float, float, int]:
    """`first` minus `other`, seed by seed: the mean difference, the half-width of its
    95% interval, and on how many seeds `first` was above."""
    diffs = [a - b for a, b in zip(first, other, strict=True)]
    mean, half = interval(diffs)
    return mean, half, sum(d > 0 for d in diffs)


def paired(first: list[float], other: list[float]) -> str:
    """`paired_interval` as text: `mean ± half-width (above on k of n)`."""
    mean, half, above = paired_interval(first, other)
    return f"{_shown(mean, half)} (above on {above} of {len(first)})"


def paired_each(first: list[float], others: Mapping[str, list[float]]) -> str:
    """`first` minus each of `others` seed by seed (`paired`), named: `name: ...; ...`."""
    return "; ".join(f"{name}: {paired(first, other)}" for name, other in others.items())
