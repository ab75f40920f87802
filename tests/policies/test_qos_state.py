"""The arrival rate the QoS router reads, as the gateway and the simulator count it."""

from __future__ import annotations

import numpy as np
import pytest

from policies.qos_state import ARRIVALS_TAU, LOAD_CAP, Arrivals, load_feature


def counted(times: list[float]) -> Arrivals:
    arrivals = Arrivals()
    for t in times:
        arrivals = arrivals.arrived(t)
    return arrivals


def test_nothing_arrived_or_one_request_reads_no_rate() -> None:
    assert Arrivals().rate() == 0.0
    assert Arrivals().arrived(5.0).rate() == 0.0


@pytest.mark.parametrize("per_second", [2.0, 5.0, 80.0])
def test_a_steady_stream_reads_at_its_rate(per_second: float) -> None:
    times = [1000.0 + i / per_second for i in range(int(per_second * 6 * ARRIVALS_TAU))]
    assert counted(times).rate() == pytest.approx(per_second, rel=0.05)


@pytest.mark.parametrize("per_second", [2.0, 8.0])
def test_a_poisson_stream_reads_near_its_rate_from_its_first_seconds(per_second: float) -> None:
    """Counting from nothing reads low until the count has filled; the correction for
    it must neither undershoot early nor overshoot once full."""
    rng = np.random.default_rng(0)
    for seconds in (ARRIVALS_TAU / 2, 5 * ARRIVALS_TAU):
        reads = []
        for _ in range(200):
            gaps = rng.exponential(1 / per_second, int(per_second * seconds * 2) + 10)
            times = np.cumsum(gaps)
            reads.append(counted(times[times <= seconds].tolist()).rate())
        assert np.mean(reads) == pytest.approx(per_second, rel=0.1)


def test_the_rate_falls_when_the_requests_stop_and_rises_when_they_come_faster() -> None:
    steady = counted([i * 0.5 for i in range(200)])  # 2/s for 100 s
    later = steady.arrived(steady.last + 3 * ARRIVALS_TAU)  # a long silence, then one
    assert later.rate() < 0.2 * steady.rate()
    burst = counted([i * 0.5 for i in range(200)] + [100 + i * 0.05 for i in range(100)])
    assert burst.rate() > 3 * steady.rate()


def test_read_later_the_rate_fades_as_the_count_would() -> None:
    steady = counted([i * 0.5 for i in range(200)])
    assert steady.rate_at(steady.last) == steady.rate()
    assert steady.rate_at(steady.last - 5.0) == steady.rate()  # an earlier clock: no rise
    later = steady.rate_at(steady.last + ARRIVALS_TAU)
    assert later == pytest.approx(steady.rate() * np.exp(-1.0))
    assert Arrivals().rate_at(100.0) == 0.0


def test_a_clock_that_steps_back_does_not_raise_the_count_past_one_arrival() -> None:
    """Replicas' clocks differ: an arrival stamped before the last one is counted, not
    used to grow the count exponentially, and the clock does not step back with it."""
    steady = counted([i * 0.5 for i in range(200)])
    back = steady.arrived(steady.last - 50.0)
    assert back.level == pytest.approx(steady.level + 1 / ARRIVALS_TAU)
    assert back.last == steady.last


def test_the_load_is_per_candidate_and_capped() -> None:
    assert load_feature(6.0, 3) == 2.0
    assert load_feature(6.0, 0) == 6.0
    assert load_feature(1e6, 2) == LOAD_CAP
