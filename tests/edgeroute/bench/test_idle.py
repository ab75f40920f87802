from __future__ import annotations

from edgeroute.bench.idle import idle


def test_an_idle_gap_calls_the_warm_up_only_when_asked_and_not_past_its_end() -> None:
    calls: list[int] = []
    idle(0.05, None, lambda: calls.append(1))
    assert calls == []
    idle(0.05, 0.001, lambda: calls.append(1))
    assert len(calls) >= 1  # the first millisecond of fifty is always followed by one
    calls.clear()
    idle(0.0, 0.001, lambda: calls.append(1))
    assert calls == []
