"""A flow-level network: per-link max-min fair sharing, re-evaluated at every change.

Rates come from progressive filling: every unfrozen flow grows at the same pace
until some link saturates, its flows freeze at their share, and the rest go on.
`advance(t)` moves all flows forward at their current rates; flows that finish
are returned, and the rates are recomputed whenever a flow arrives or leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

EPS = 1e-9


@dataclass(eq=False)
class Flow:
    path: tuple[int, ...]  # link ids
    remaining: float  # bytes
    tag: object = None
    rate: float = 0.0  # bytes/s


@dataclass
class Network:
    capacity: list[float] = field(default_factory=list)  # bytes/s per link, after background
    flows: list[Flow] = field(default_factory=list)
    now: float = 0.0

    def add_link(self, bytes_per_s: float) -> int:
        self.capacity.append(bytes_per_s)
        return len(self.capacity) - 1

    def add_flow(self, path: Sequence[int], nbytes: float, tag: object = None) -> Flow:
        flow = Flow(tuple(path), max(nbytes, 0.0), tag)
        self.flows.append(flow)
        self._allocate()
        return flow

    def next_completion(self) -> float:
        """Absolute time of the next flow completion at current rates (inf if none)."""
        best = float("inf")
        for f in self.flows:
            if f.rate > 0:
                best = min(best, self.now + f.remaining / f.rate)
            elif f.remaining <= EPS:
                best = min(best, self.now)
        return best

    def advance(self, t: float) -> list[Flow]:
        """Move to time t; returns the flows that completed (rates are then recomputed)."""
        dt = t - self.now
        if dt > 0:
            for f in self.flows:
                f.remaining -= f.rate * dt
        self.now = max(self.now, t)
        done = [f for f in self.flows if f.remaining <= max(EPS, f.rate * 1e-12)]
        if done:
            self.flows = [f for f in self.flows if f not in done]
            self._allocate()
        return done

    def remove(self, flow: Flow) -> None:
        """Take a flow out before it completes (its sender stopped)."""
        self.flows.remove(flow)
        self._allocate()

    def reallocate(self) -> None:
        """Recompute the rates after link capacities changed."""
        self._allocate()

    def link_rates(self) -> dict[int, float]:
        """Bytes/s carried per link at the current rates."""
        out: dict[int, float] = {}
        for f in self.flows:
            for link in f.path:
                out[link] = out.get(link, 0.0) + f.rate
        return out

    def utilisation(self, link: int) -> float:
        used = sum(f.rate for f in self.flows if link in f.path)
        return used / self.capacity[link] if self.capacity[link] > 0 else 0.0

    def _allocate(self) -> None:
        """Progressive filling: max-min fair rates for all flows."""
        residual = list(self.capacity)
        active = [f for f in self.flows if f.path]
        for f in self.flows:
            f.rate = 0.0 if f.path else float("inf")
        users: dict[int, list[Flow]] = {}
        for f in active:
            for link in f.path:
                users.setdefault(link, []).append(f)
        frozen: set[int] = set()
        while len(frozen) < len(active):
            # The tightest link: least residual capacity per unfrozen flow.
            share, tight = float("inf"), -1
            for link, fs in users.items():
                n = sum(1 for f in fs if id(f) not in frozen)
                if n and residual[link] / n < share:
                    share, tight = residual[link] / n, link
            if tight < 0:
                break
            for f in users[tight]:
                if id(f) in frozen:
                    continue
                f.rate = share
                frozen.add(id(f))
                for link in f.path:
                    residual[link] -= share
