"""Intervals over seeds, shared by the benchmarks and the model card.

Most figures vary over one source, the environment seed (`interval`, `paired`). A
trained agent's figure varies over two, crossed: its training runs and the environment
seeds every run is measured on (`crossed_interval`, `crossed_paired_interval`). An
interval over the seeds alone, with the runs averaged on each, says whether these runs
beat others on this workload; counting the runs says whether training the agent again
would.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

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
    return interval_shown(*interval(values))


def interval_shown(mean: float, half: float) -> str:
    """An interval already computed, as `mean ± half-width`, or n/a."""
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
    return f"{interval_shown(mean, half)} (above on {above} of {len(first)})"


def paired_each(first: list[float], others: Mapping[str, list[float]]) -> str:
    """`first` minus each of `others` seed by seed (`paired`), named: `name: ...; ...`."""
    return "; ".join(f"{name}: {paired(first, other)}" for name, other in others.items())


def verdict(first: tuple[float, float], other: tuple[float, float]) -> str:
    """`wins` or `loses` when two 95% intervals (mean, half-width) do not overlap, else
    `tie`: the issue's test of an agent against a baseline."""
    (a, ha), (b, hb) = first, other
    if a - ha > b + hb:
        return "wins"
    if a + ha < b - hb:
        return "loses"
    return "tie"


# A source of spread in a mean: its variance's share and that share's degrees of freedom.
_Term = tuple[float, int]


def _term(means: Sequence[float]) -> list[_Term]:
    """The variance of the average of `means` as a term of a sum (none for one mean)."""
    if len(means) < 2:
        return []
    return [(statistics.variance(means) / len(means), len(means) - 1)]


def _half_width(terms: list[_Term]) -> float:
    """The 95% half-width of a mean whose variance is the sum of `terms`, with
    Student's t on the Welch-Satterthwaite degrees of freedom (rounded down)."""
    total = sum(v for v, _ in terms)
    if total == 0:
        return 0.0
    dof = total**2 / sum(v**2 / d for v, d in terms)
    return t95(max(1, math.floor(dof))) * math.sqrt(total)


def _margins(per_run: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Each training run's mean over the seeds, and each seed's mean over the runs."""
    if not per_run or len({len(r) for r in per_run}) != 1 or not per_run[0]:
        raise ValueError("every training run needs a figure on the same seeds")
    runs = [statistics.fmean(r) for r in per_run]
    seeds = [statistics.fmean(column) for column in zip(*per_run, strict=True)]
    return runs, seeds


def crossed_interval(per_run: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Mean and 95% half-width of an agent's figure, `per_run[r][k]` on training run r
    and environment seed k, counting both sources: the variance of the grand mean is
    taken as s²(run means)/R + s²(seed means)/K. Each margin's spread also holds the
    runs' interaction with the seeds, so the sum counts it twice and errs wide. For one
    run it is `interval` over the seeds; for one seed, `interval` over the runs."""
    runs, seeds = _margins(per_run)
    return statistics.fmean(seeds), _half_width(_term(runs) + _term(seeds))


def crossed_paired_interval(
    first: Sequence[Sequence[float]], other: Sequence[Sequence[float]]
) -> tuple[float, float]:
    """`first` minus `other`, two agents' `per_run` figures on the same seeds (their
    runs are independent, their seeds shared): the mean difference and its 95%
    half-width, from each agent's run means and the seed-by-seed difference of the
    seed means."""
    runs_a, seeds_a = _margins(first)
    runs_b, seeds_b = _margins(other)
    if len(seeds_a) != len(seeds_b):
        raise ValueError("the two agents were measured on different seeds")
    diffs = [a - b for a, b in zip(seeds_a, seeds_b, strict=True)]
    return statistics.fmean(diffs), _half_width(_term(runs_a) + _term(runs_b) + _term(diffs))


def crossed_paired_shown(first: Sequence[Sequence[float]], other: Sequence[Sequence[float]]) -> str:
    """`crossed_paired_interval` as `mean ± half-width`."""
    return interval_shown(*crossed_paired_interval(first, other))
