"""Intervals over seeds: Student's t at every sample size, not the normal's beyond ten;
differences paired by seed; and, for agents of several training runs, intervals that
count the runs as well as the seeds."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from edgeroute.stats import (
    crossed_interval,
    crossed_paired_interval,
    interval,
    interval_shown,
    paired,
    paired_each,
    paired_interval,
    shown,
    t95,
)

# Two-sided 95% quantiles of Student's t (published tables, six decimals).
EXACT = {
    1: 12.706205,
    4: 2.776445,
    9: 2.262157,
    10: 2.228139,
    19: 2.093024,
    29: 2.045230,
    39: 2.022691,
    89: 1.986979,
}


@pytest.mark.parametrize("dof", sorted(EXACT))
def test_the_quantile_is_students_at_every_size(dof: int) -> None:
    assert t95(dof) == pytest.approx(EXACT[dof], abs=2e-4)


def test_the_quantile_falls_towards_the_normals_and_never_below_it() -> None:
    values = [t95(d) for d in range(1, 500)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert values[-1] > 1.959964


def test_twenty_seeds_get_a_wider_interval_than_the_normal_gives() -> None:
    """With 20 seeds the normal's 1.96 would make the interval 6% too narrow."""
    values = [0.1 * (i % 7) + 0.01 * i for i in range(20)]
    mean, half = interval(values)
    assert mean == pytest.approx(statistics.fmean(values))
    sd = statistics.stdev(values)
    assert half == pytest.approx(EXACT[19] * sd / math.sqrt(20), rel=1e-5)


def test_one_value_has_no_width_and_nans_are_left_out() -> None:
    assert interval([0.3]) == (0.3, 0.0)
    assert interval([0.2, math.nan, 0.4])[0] == pytest.approx(0.3)
    assert shown([]) == "n/a"
    with pytest.raises(ValueError, match="two values"):
        t95(0)


def test_a_paired_difference_counts_the_seeds_it_is_above_on() -> None:
    assert paired([0.3, 0.5, 0.4], [0.2, 0.5, 0.1]) == "0.133 ± 0.38 (above on 2 of 3)"
    assert paired([0.2, 0.2], [0.2, 0.2]) == "0 ± 0 (above on 0 of 2)"
    with pytest.raises(ValueError):
        paired([0.1], [0.1, 0.2])
    assert paired_each([0.5, 0.5], {"a": [0.5, 0.5], "b": [0.25, 0.75]}) == (
        "a: 0 ± 0 (above on 0 of 2); b: 0 ± 3.2 (above on 1 of 2)"
    )


def test_counting_one_run_or_one_seed_is_the_interval_over_the_other() -> None:
    seeds = [0.41, 0.43, 0.38, 0.45, 0.40]
    assert crossed_interval([seeds]) == pytest.approx(interval(seeds))
    runs = [0.41, 0.43, 0.38]
    assert crossed_interval([[r] for r in runs]) == pytest.approx(interval(runs))
    assert interval_shown(*crossed_interval([[0.5, 0.5], [0.5, 0.5]])) == "0.5 ± 0"


def test_runs_measured_on_different_seeds_are_refused() -> None:
    with pytest.raises(ValueError, match="same seeds"):
        crossed_interval([[0.1, 0.2], [0.1]])
    with pytest.raises(ValueError, match="same seeds"):
        crossed_interval([])
    with pytest.raises(ValueError, match="different seeds"):
        crossed_paired_interval([[0.1, 0.2]], [[0.1, 0.2, 0.3]])


def worlds(n: int, runs: int, seeds: int, agents: int = 1) -> list[list[np.ndarray]]:
    """`n` draws of a crossed world with mean 0, each measuring `agents` agents of equal
    worth on the same seeds: a shift per training run (sd 0.01), one per environment
    seed shared by the agents (0.02) and one per run and seed (0.01), the spreads of the
    engines' sweep ((104) in docs/research.md)."""
    rng = np.random.default_rng(7)
    draws = []
    for _ in range(n):
        seed_shift = rng.normal(0, 0.02, (1, seeds))
        draws.append(
            [
                rng.normal(0, 0.01, (runs, 1)) + seed_shift + rng.normal(0, 0.01, (runs, seeds))
                for _ in range(agents)
            ]
        )
    return draws


def test_counting_the_runs_covers_the_mean_where_the_seeds_alone_do_not() -> None:
    """Five runs on sixty seeds: the seeds' interval, runs averaged on each, holds the
    true mean in about two draws of three; the crossed one in about 95 of 100."""
    draws = [x for (x,) in worlds(2000, runs=5, seeds=60)]
    crossed = [crossed_interval(x.tolist()) for x in draws]
    by_seed = [interval(x.mean(0).tolist()) for x in draws]
    assert sum(abs(m) <= h for m, h in crossed) / len(draws) >= 0.93
    assert sum(abs(m) <= h for m, h in by_seed) / len(draws) <= 0.75


def test_a_paired_difference_counting_runs_covers_where_the_seeds_alone_do_not() -> None:
    """Two agents of equal worth, five runs each, on the same sixty seeds: the seeds'
    shared part cancels seed by seed, the runs' does not."""
    pairs = worlds(2000, runs=5, seeds=60, agents=2)
    crossed = [crossed_paired_interval(a.tolist(), b.tolist()) for a, b in pairs]
    by_seed = [paired_interval(a.mean(0).tolist(), b.mean(0).tolist()) for a, b in pairs]
    assert sum(abs(m) <= h for m, h in crossed) / len(pairs) >= 0.93
    assert sum(abs(m) <= h for m, h, _ in by_seed) / len(pairs) <= 0.5


def test_a_paired_difference_counting_runs_is_the_difference_of_the_means() -> None:
    a = [[0.40, 0.42, 0.44], [0.41, 0.45, 0.43]]
    b = [[0.30, 0.33, 0.35]]
    mean, half = crossed_paired_interval(a, b)
    assert mean == pytest.approx(np.mean(a) - np.mean(b))
    assert half > 0
    # Against itself every seed's difference is 0 and only the runs' two equal terms
    # are left, on one degree of freedom each: Welch-Satterthwaite gives two.
    run_means = np.mean(a, axis=1)
    term = np.var(run_means, ddof=1) / len(run_means)
    assert crossed_paired_interval(a, a) == pytest.approx((0.0, t95(2) * np.sqrt(2 * term)))
