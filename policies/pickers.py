"""Pickers: choose one candidate from the scored list (`pick`), or rank them all
(`rank`: the order in which a request tries them when one fails before answering).
`rank(...)[0]` is always the candidate `pick` chooses."""

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
        return candidates[self._best(req, len(candidates), scores)]

    def rank(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> list[int]:
        return _then_best(self._best(req, len(candidates), scores), len(candidates), scores)

    def _best(self, req: RequestInfo, n: int, scores: Sequence[float]) -> int:
        # A plain loop, not max() and min(): this runs on every request, where their
        # C code is cold and costs more than the loop does (see docs/performance.md).
        if len(scores) <= 1:  # no scores (no scorers): every candidate is equal
            return req.entropy % n
        top = low = scores[0]
        for s in scores:
            if s > top:
                top = s
            elif s < low:
                low = s
        floor = top - self.tie_epsilon
        if low >= floor:  # all tied, as in an idle or evenly loaded pool
            return req.entropy % n
        near = []
        for i, s in enumerate(scores):
            if s >= floor:
                near.append(i)
        return near[req.entropy % len(near)]


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

    def rank(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> list[int]:
        first = _index_of(candidates, self.pick(req, candidates, scores))
        return _then_best(first, len(candidates), scores)


@dataclass(frozen=True)
class RoundRobin:
    name: str = "round_robin"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        return candidates[req.seq % len(candidates)]

    def rank(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> list[int]:
        return _rotation(req.seq, len(candidates))


@dataclass(frozen=True)
class Random:
    name: str = "random"

    def pick(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> BackendView:
        return candidates[req.entropy % len(candidates)]

    def rank(
        self, req: RequestInfo, candidates: Sequence[BackendView], scores: Sequence[float]
    ) -> list[int]:
        return _rotation(req.entropy, len(candidates))


def _index_of(candidates: Sequence[BackendView], chosen: BackendView) -> int:
    for i, b in enumerate(candidates):
        if b is chosen:
            return i
    raise ValueError("the picker chose a backend that is not a candidate")


def _then_best(first: int, n: int, scores: Sequence[float]) -> list[int]:
    """`first`, then the others by score, best first (in order when unscored)."""
    rest = [i for i in range(n) if i != first]
    if scores:
        rest.sort(key=scores.__getitem__, reverse=True)
    return [first, *rest]


def _rotation(start: int, n: int) -> list[int]:
    k = start % n
    return [*range(k, n), *range(k)]
