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
        # A plain loop, not max() and min(): this runs on every request, where their
        # C code is cold and costs more than the loop does (see the README).
        if len(scores) <= 1:  # no scores (no scorers): every candidate is equal
            return candidates[req.entropy % len(candidates)]
        top = low = scores[0]
        for s in scores:
            if s > top:
                top = s
            elif s < low:
                low = s
        floor = top - self.tie_epsilon
        if low >= floor:  # all tied, as in an idle or evenly loaded pool
            return candidates[req.entropy % len(candidates)]
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
