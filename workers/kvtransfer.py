"""Emulated KV-cache transfers into a decode instance.

Flows that cross the same tier into this instance share that tier's effective
bandwidth equally (processor sharing): a lone flow gets all of it, N flows get
1/N each, and the survivors speed up when one finishes. The tier, its
bandwidth, latency and congestion come from the worker's `Topology`; a link keeps
the emulated seconds it was busy, as a switch port's counters would.

The link keeps its own emulated clock, read from the event loop's (`loop.time()`):
when the loop wakes it late, the flows are moved on event by event, each ending at
the time it would have ended on time, so a busy host delays when a transfer is
noticed but changes no share and no transfer's duration (as the engine's clock
does for its iterations).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

_DONE = 1e-6  # bytes: a flow with less than this left has arrived


@dataclass(eq=False)
class _Flow:
    remaining: float
    started: float  # the link's emulated seconds
    finished: float = math.nan
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class SharedLink:
    """One tier's capacity into this instance, shared by its concurrent flows."""

    def __init__(self, capacity: Callable[[], float], speedup: float = 1.0) -> None:
        self._capacity = capacity  # bytes per emulated second, re-read at every change
        self._speedup = speedup
        self._flows: list[_Flow] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop_at: float | None = None  # the loop's time the flows were moved to
        self._clock = 0.0  # emulated seconds since the link's first flow
        self._rate = 0.0  # the link's capacity since the last change
        self.busy_seconds = 0.0  # emulated seconds with at least one flow

    def refresh(self) -> None:
        """The capacity changed: re-read it now, not at the next flow event."""
        self._changed.set()

    @property
    def active(self) -> int:
        return len(self._flows)

    async def send(self, nbytes: float) -> float:
        """Carry `nbytes` across the link; the emulated seconds it took."""
        if nbytes <= _DONE:
            return 0.0
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        flow = _Flow(nbytes, started=self._clock)
        self._flows.append(flow)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        try:
            await asyncio.shield(flow.done)
        except asyncio.CancelledError:
            if flow in self._flows:
                self._advance(loop.time())  # it may have ended unseen: then it is gone
                if flow in self._flows:
                    self._flows.remove(flow)
                self._changed.set()
            raise
        return flow.finished - flow.started

    def _advance(self, loop_now: float) -> None:
        """Move the flows on to `loop_now`, one flow's end at a time, at the capacity
        read at the last change; then read the capacity again."""
        elapsed = 0.0 if self._loop_at is None else (loop_now - self._loop_at) * self._speedup
        self._loop_at = loop_now
        endless = math.isinf(self._rate)  # every flow arrives at once
        while self._flows and self._rate > 0.0 and (elapsed > 0.0 or endless):
            share = self._rate / len(self._flows)
            step = min(elapsed, self._first_end())
            for flow in self._flows:
                flow.remaining = 0.0 if endless else flow.remaining - share * step
            elapsed -= step
            self._clock += step
            self.busy_seconds += step
            for flow in [f for f in self._flows if f.remaining <= _DONE]:
                self._flows.remove(flow)
                flow.finished = self._clock
                if not flow.done.done():
                    flow.done.set_result(None)
        self._clock += elapsed
        self._rate = self._capacity()

    def _first_end(self) -> float:
        """Emulated seconds until the first flow ends at the current shares (inf: never,
        the tier carries nothing)."""
        share = self._rate / len(self._flows)
        return min(f.remaining for f in self._flows) / share if share > 0 else math.inf

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._flows:
            self._changed.clear()
            wait = self._first_end()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait(), wait / self._speedup if math.isfinite(wait) else None
                )
            self._advance(loop.time())
