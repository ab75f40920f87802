"""A replica's count of arrivals per model, and the rates it hears from the others."""

from __future__ import annotations

import math

import pytest

from gateway.arrivals import QUIET, ArrivalCounts
from policies.qos_state import ARRIVALS_TAU


def test_the_rate_given_is_this_replicas_and_the_others_added() -> None:
    counts = ArrivalCounts()
    for i in range(41):
        own = counts.arrived("m", i * 0.25)  # 4/s
    counts.heard({"m": 6.0, "n": 1.5})
    both = counts.arrived("m", 10.25)
    assert both == pytest.approx(own + 6.0, rel=0.05)
    assert counts.arrived("n", 10.25) == 1.5  # none of its own yet: only what it heard


def test_what_it_publishes_fades_and_a_quiet_model_leaves() -> None:
    counts = ArrivalCounts()
    for i in range(41):
        counts.arrived("m", i * 0.25)
    now = counts.local_rates(10.0)["m"]
    assert counts.local_rates(10.0 + ARRIVALS_TAU)["m"] == pytest.approx(now / math.e)
    assert counts.local_rates(10.0 + 20 * ARRIVALS_TAU) == {}
    assert now * math.exp(-20) < QUIET
    counts.heard({"m": 2.0})
    assert "m" not in counts.local_rates(10.0 + 20 * ARRIVALS_TAU)  # the others' not echoed


def test_a_peers_rate_that_is_not_a_finite_positive_number_counts_as_none() -> None:
    counts = ArrivalCounts()
    counts.heard({"a": math.inf, "b": math.nan, "c": -3.0, "d": 0.0, "e": 2.0})
    assert counts.remote == {"e": 2.0}


def test_past_the_cap_of_models_the_counts_start_over() -> None:
    counts = ArrivalCounts(cap=2)
    for t in (0.0, 1.0, 2.0):
        counts.arrived("a", t)
    counts.arrived("b", 2.0)
    assert set(counts.local_rates(2.0)) == {"a"}
    counts.arrived("c", 2.0)  # a third model: the counts start over, with it alone
    assert counts.local_rates(2.0) == {}
    for t in (3.0, 4.0):
        counts.arrived("c", t)
    assert set(counts.local_rates(4.0)) == {"c"}


def test_operators_see_each_models_rate_here_and_at_the_others() -> None:
    counts = ArrivalCounts()
    for i in range(41):
        counts.arrived("m", i * 0.25)
    counts.heard({"n": 1.5})
    seen = counts.describe(10.0)
    assert set(seen) == {"m", "n"}
    assert seen["m"]["here"] == pytest.approx(4.0, rel=0.05) and seen["m"]["others"] == 0.0
    assert seen["n"] == {"here": 0.0, "others": 1.5}
