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
        if len(scores) <= 1:  # no scores (no scorers): every candidate is equal
            return candidates[req.entropy % len(candidates)]
        floor = max(scores) - self.tie_epsilon
        near = []
        for i, s in enumerate(scores):
            if s >= floor:
                near.append(i)
        return candidates[near[req.entropy % len(near)]]


@dataclass(frozen=True)
class PowerOfTwo:
    """Two candidates at random, the better of the two."""

    name: str = "power_of_two"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        n = len(candidates)
        a = req.entropy % n
        if n == 1 or not scores:  # no scores (no scorers): every candidate is equal
            return candidates[a]
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
