"""`bench prism --live`'s traffic: Poisson, the same for every arm, its mix shifting."""

from __future__ import annotations

from edgeroute.bench.prism_live import ARMS, LiveSettings, arrivals, body


def test_the_class_mix_shifts_halfway_and_a_seed_fixes_the_traffic() -> None:
    s = LiveSettings(seeds=(1,), seconds=2000.0, rate=1.0)
    plan = arrivals(s, 1)
    assert plan == arrivals(s, 1) and plan != arrivals(s, 2)
    times = [t for t, _ in plan]
    assert times == sorted(times) and times[-1] < s.seconds
    assert 1800 < len(plan) < 2200  # about rate x seconds
    first = [c for t, c in plan if t < 1000]
    second = [c for t, c in plan if t >= 1000]
    assert 0.75 < first.count("gsm8k") / len(first) < 0.85
    assert 0.15 < second.count("gsm8k") / len(second) < 0.25


def test_every_request_names_its_class_and_the_arms_cover_the_2x2() -> None:
    b = body("humaneval", 16)
    assert b["metadata"] == {"task": "humaneval"} and b["max_tokens"] == 16
    assert set(ARMS.values()) == {
        ("prism", True),
        ("prism", False),
        ("least_load", True),
        ("least_load", False),
    }
