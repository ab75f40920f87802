from __future__ import annotations

from edgeroute.bench.idle import QS, idle, percentiles, reader


def test_an_idle_gap_calls_the_warm_up_only_when_asked_and_not_past_its_end() -> None:
    calls: list[int] = []
    idle(0.05, None, lambda: calls.append(1))
    assert calls == []
    idle(0.05, 0.001, lambda: calls.append(1))
    assert len(calls) >= 1  # the first millisecond of fifty is always followed by one
    calls.clear()
    idle(0.0, 0.001, lambda: calls.append(1))
    assert calls == []


def test_the_traffic_before_each_decision_runs_untimed_once_per_decision() -> None:
    """`percentiles` calls `before` ahead of each timed decision, on every run, and
    the reader touches a buffer of the size asked (the sum of ones is its length)."""
    order: list[str] = []
    got = percentiles(5, 2, lambda: order.append("before"), lambda k: order.append(f"d{k}"))
    assert order == [x for _ in range(2) for k in range(5) for x in ("before", f"d{k}")]
    assert set(got) == {q for q, _ in QS} and all(v >= 0 for v in got.values())
    assert reader(0.0)() is None
    assert reader(1.0)() == 2**20 // 8
