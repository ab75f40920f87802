"""Filters, then weighted scorers, then a picker: the shape of every routing policy.

Every stage is a pure, synchronous function of the request and the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from policies.types import BackendView, ClusterView, Decision, RequestInfo


class Filter(Protocol):
    """Keeps a backend or not. A filter whose verdict depends only on the request's model
    and the backend's health and configuration sets `per_model = True`; a pipeline then
    works out its verdicts once per model and snapshot (`ClusterView.memo`)."""

    @property
    def name(self) -> str: ...

    @property
    def per_model(self) -> bool: ...

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool: ...


class Scorer(Protocol):
    """Rates candidates in [0, 1]; higher is better."""

    @property
    def name(self) -> str: ...

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]: ...


class Picker(Protocol):
    @property
    def name(self) -> str: ...

    def pick(
        self,
        req: RequestInfo,
        candidates: Sequence[BackendView],
        scores: Sequence[float],
    ) -> BackendView: ...


class Policy(Protocol):
    """What the gateway and the simulators call: a Pipeline, or a learned policy."""

    @property
    def name(self) -> str: ...

    @property
    def uses_prefix(self) -> bool: ...

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision: ...


@dataclass(frozen=True)
class Pipeline:
    """A configured policy: which backends may serve, how they rank, how one is chosen."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[tuple[Scorer, float], ...]
    picker: Picker

    @property
    def uses_prefix(self) -> bool:
        """Whether requests need their prompt's block hashes computed."""
        return any(s.name == "prefix_cache" for s, _ in self.scorers)

    @cached_property
    def _stages(self) -> tuple[tuple[Filter, ...], tuple[Filter, ...]]:
        """The leading per-model filters, whose verdicts can be remembered, and the rest."""
        n = 0
        while n < len(self.filters) and getattr(self.filters[n], "per_model", False):
            n += 1
        return self.filters[:n], self.filters[n:]

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        per_model, rest = self._stages
        candidates: Sequence[BackendView] = view.backends
        if per_model:
            key = (per_model, req.model)
            kept = view.memo.get(key)
            if kept is None:
                kept = view.memo[key] = tuple(
                    i
                    for i, b in enumerate(candidates)
                    if all(f.keep(req, view, b) for f in per_model)
                )
            candidates = [candidates[i] for i in kept]
            if not candidates:
                return self._rejected(req, view)
        for f in rest:
            candidates = [b for b in candidates if f.keep(req, view, b)]
            if not candidates:
                return self._rejected(req, view)
        if len(self.scorers) == 1 and self.scorers[0][1] == 1.0:
            total = self.scorers[0][0].score(req, view, candidates)
        else:
            total = [0.0] * len(candidates)
            for scorer, weight in self.scorers:
                for i, s in enumerate(scorer.score(req, view, candidates)):
                    total[i] += weight * s
        return Decision(self.picker.pick(req, candidates, total))

    def _rejected(self, req: RequestInfo, view: ClusterView) -> Decision:
        """Which filter left no backend, for the client's error message."""
        candidates: Sequence[BackendView] = view.backends
        for f in self.filters:
            candidates = [b for b in candidates if f.keep(req, view, b)]
            if not candidates:
                return Decision(None, reason=f"no backend passed the '{f.name}' filter")
        raise AssertionError("a remembered verdict disagreed with the filters")
