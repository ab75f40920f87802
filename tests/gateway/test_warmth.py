"""`keep_warm`, the loop that repeats decisions while the gateway idles, against
policies that break its rules (a plugin whose `warm` raises). The real policy kept
warm by a real gateway: tests/gateway/test_qos_drl.py."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from gateway.metrics import GatewayMetrics
from gateway.warmth import keep_warm


class Faulty:
    """A third-party policy whose warm-up raises."""

    name = "faulty"

    def __init__(self) -> None:
        self.calls = 0

    def warm(self) -> bool:
        self.calls += 1
        raise RuntimeError("broken plugin")


class Counting:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def warm(self) -> bool:
        self.calls += 1
        return self.calls > 1  # nothing to repeat the first time


class Plan:
    def __init__(self, *policies: Any) -> None:
        self.warmable = policies


def test_a_policy_whose_warm_up_raises_stops_the_loop_with_a_log_not_the_gateway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty = Faulty()
    metrics = GatewayMetrics()
    with caplog.at_level(logging.ERROR, logger="edgeroute.gateway"):
        # returns by itself: the loop ends instead of raising into the event loop
        asyncio.run(
            keep_warm(0.001, 60.0, Plan(faulty), recently, asyncio.Event(), metrics.warmups)  # type: ignore[arg-type]
        )
    assert faulty.calls == 1
    assert "keeping the decision warm failed" in caplog.text


def recently() -> float:
    """A decision ended 10 ms ago: the loop is idle, within its window."""
    return time.perf_counter() - 0.010


async def run(policy: Any, decided_at: Any, until: Any, metrics: GatewayMetrics) -> None:
    task = asyncio.create_task(
        keep_warm(0.001, 60.0, Plan(policy), decided_at, asyncio.Event(), metrics.warmups)  # type: ignore[arg-type]
    )
    while not until():
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_only_warm_ups_that_repeated_a_decision_are_counted_and_none_while_busy() -> None:
    metrics = GatewayMetrics()
    idle = Counting()
    asyncio.run(run(idle, recently, lambda: idle.calls >= 4, metrics))
    counted = metrics.warmups.labels("counting")._value.get()
    assert counted == idle.calls - 1

    busy = Counting()  # a decision has always just ended
    loops = [0]

    def now() -> float:
        loops[0] += 1
        return time.perf_counter()

    asyncio.run(run(busy, now, lambda: loops[0] >= 20, metrics))
    assert busy.calls == 0


def test_past_the_window_the_loop_sleeps_until_a_decision_wakes_it() -> None:
    """A gateway without traffic goes quiet: the last decision ended 61 s ago, past the
    60-s window, so the loop looks once and then waits, warming nothing, while 1-ms
    periods go by; a decision wakes it and the warm-ups resume."""
    quiet = Counting()
    looks = [0]
    last = [time.perf_counter() - 61.0]

    def decided_at() -> float:
        looks[0] += 1
        return last[0]

    async def scenario() -> None:
        decided = asyncio.Event()
        metrics = GatewayMetrics()
        task = asyncio.create_task(
            keep_warm(0.001, 60.0, Plan(quiet), decided_at, decided, metrics.warmups)  # type: ignore[arg-type]
        )
        while looks[0] == 0:
            await asyncio.sleep(0.001)
        for _ in range(20):  # 20 sleeps of at least a period each: 20 looks if it polled
            await asyncio.sleep(0.002)
        assert looks[0] == 1
        assert quiet.calls == 0
        last[0] = time.perf_counter()  # a request is decided, as the forwarder does it
        decided.set()
        while quiet.calls < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
