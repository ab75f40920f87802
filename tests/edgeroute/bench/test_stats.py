"""Intervals over seeds: Student's t at every sample size, not the normal's beyond ten;
and differences paired by seed."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from edgeroute.bench.stats import interval, paired, paired_each, shown, t95

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
