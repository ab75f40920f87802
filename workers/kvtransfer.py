"""Emulated KV-cache transfers into a decode instance.

Flows that cross the same tier into this instance share that tier's effective
bandwidth equally (processor sharing): a lone flow gets all of it, N flows get
1/N each, and the survivors speed up when one finishes. The tier, its
bandwidth, latency and congestion come from the worker's `Topology`; a link keeps
the emulated seconds it was busy, as a switch port's counters would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Flow:
    remaining: float
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class SharedLink:
    """One tier's capacity into this instance, shared by its concurrent flows."""

    def __init__(self, capacity: Callable[[], float], speedup: float = 1.0) -> None:
        self._capacity = capacity  # bytes per emulated second, read at every change
        self._speedup = speedup
        self._flows: list[_Flow] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.busy_seconds = 0.0  # emulated seconds with at least one flow

    def refresh(self) -> None:
        """The capacity changed: re-read it now, not at the next flow event."""
        self._changed.set()

    @property
    def active(self) -> int:
        return len(self._flows)

    async def send(self, nbytes: float) -> None:
        flow = _Flow(max(0.0, nbytes))
        self._flows.append(flow)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await asyncio.shield(flow.done)
        except asyncio.CancelledError:
            if flow in self._flows:
                self._flows.remove(flow)
                self._changed.set()
            raise

    async def _run(self) -> None:
        last = time.monotonic()
        rate = 0.0
        while self._flows:
            now = time.monotonic()
            elapsed = (now - last) * self._speedup
            last = now
            self.busy_seconds += elapsed
            for flow in self._flows:
                flow.remaining -= rate * elapsed
            for flow in [f for f in self._flows if f.remaining <= 1e-6]:
                self._flows.remove(flow)
                if not flow.done.done():
                    flow.done.set_result(None)
            if not self._flows:
                break
            rate = self._capacity() / len(self._flows)
            next_done = min(f.remaining for f in self._flows) / rate
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), next_done / self._speedup)
