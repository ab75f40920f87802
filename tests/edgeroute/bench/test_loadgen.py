"""The open-loop pacing of `edgeroute.bench.loadgen`, on a clock the test owns."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from edgeroute.bench.loadgen import paced, until


class LateLoop:
    """The hostile twin of an event loop: every sleep wakes `overshoot` seconds later
    than asked, as a busy loop does. Time is this object's, not the wall's."""

    def __init__(self, overshoot: float) -> None:
        self.now = 100.0
        self.overshoot = overshoot
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds + self.overshoot


def sends(loop: LateLoop, instants: list[float]) -> list[tuple[float, float]]:
    """(when each send happened, after the start; how late `paced` said it was)."""

    async def run() -> list[tuple[float, float]]:
        start = loop.now
        return [(loop.now - start, late) async for late in paced(instants, loop.clock, loop.sleep)]

    return asyncio.run(run())


def test_a_late_wake_up_delays_its_own_send_and_not_the_ones_after() -> None:
    """A loop that wakes 0.6 ms late on every sleep: 1,000 sends 20 ms apart each come
    0.6 ms late, as they should; sleeping each gap in turn would have sent the last
    0.6 s late, an arrival rate 3% below the one drawn."""
    loop = LateLoop(overshoot=0.0006)
    instants = [0.02 * k for k in range(1, 1001)]
    sent = sends(loop, instants)
    assert [late for _, late in sent] == pytest.approx([0.0006] * 1000)
    assert [t for t, _ in sent] == pytest.approx([t + 0.0006 for t in instants])


def test_sends_already_due_go_at_once_and_say_how_late() -> None:
    """A loop that wakes 50 ms late with sends 10 ms apart: the ones that fell due
    meanwhile go without sleeping, each late by what it waited; none is skipped."""
    loop = LateLoop(overshoot=0.05)
    sent = sends(loop, [0.01, 0.02, 0.03, 0.07])
    assert len(sent) == 4
    assert [late for _, late in sent] == pytest.approx([0.05, 0.04, 0.03, 0.05])
    assert loop.sleeps == 2  # for the first and for the last


def test_a_deadline_already_past_does_not_sleep() -> None:
    loop = LateLoop(overshoot=1.0)
    assert asyncio.run(until(loop.now - 0.25, loop.clock, loop.sleep)) == pytest.approx(0.25)
    assert asyncio.run(until(loop.now + 0.5, loop.clock, loop.sleep)) == pytest.approx(1.0)
    assert loop.sleeps == 1


def test_on_an_exact_loop_every_send_is_on_time() -> None:
    loop = LateLoop(overshoot=0.0)
    gaps = [0.3, 0.1, 0.25, 0.05]
    sent = sends(loop, list(itertools.accumulate(gaps)))
    assert [late for _, late in sent] == [0.0] * 4
    assert [t for t, _ in sent] == pytest.approx(list(itertools.accumulate(gaps)))
