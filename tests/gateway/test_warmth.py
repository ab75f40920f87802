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
        asyncio.run(keep_warm(0.001, 60.0, Plan(faulty), recently, metrics.warmups))  # type: ignore[arg-type]
    assert faulty.calls == 1
    assert "keeping the decision warm failed" in caplog.text


def recently() -> float:
    """A decision ended 10 ms ago: the loop is idle, within its window."""
    return time.perf_counter() - 0.010


async def run(policy: Any, decided_at: Any, until: Any, metrics: GatewayMetrics) -> None:
    task = asyncio.create_task(keep_warm(0.001, 60.0, Plan(policy), decided_at, metrics.warmups))  # type: ignore[arg-type]
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


def test_no_warm_ups_once_the_last_decision_is_older_than_the_window() -> None:
    """A gateway without traffic goes quiet: the last decision ended 61 s ago, past the
    60-s window, and the loop looks 20 times without warming."""
    quiet = Counting()
    loops = [0]

    def long_ago() -> float:
        loops[0] += 1
        return time.perf_counter() - 61.0

    asyncio.run(run(quiet, long_ago, lambda: loops[0] >= 20, GatewayMetrics()))
    assert quiet.calls == 0
