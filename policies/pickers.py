"""Pickers: choose one candidate from the scored list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scorers import mix64
from policies.types import BackendView, RequestInfo


@dataclass(frozen=True)
class Argmax:
    """The best score; near-equal scores are broken at random so replicas do not herd."""

    tie_epsilon: float = 0.01
    name: str = "argmax"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        best = max(scores)
        floor = best - self.tie_epsilon
        near = [i for i, s in enumerate(scores) if s >= floor]
        return candidates[near[req.entropy % len(near)]]


@dataclass(frozen=True)
class PowerOfTwo:
    """Two candidates at random, the better of the two."""

    name: str = "power_of_two"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        a = req.entropy % n
        b = (a + 1 + mix64(req.entropy) % (n - 1)) % n
        return candidates[a] if scores[a] >= scores[b] else candidates[b]


@dataclass(frozen=True)
class RoundRobin:
    name: str = "round_robin"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        return candidates[req.seq % len(candidates)]


@dataclass(frozen=True)
class Random:
    name: str = "random"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        return candidates[req.entropy % len(candidates)]
