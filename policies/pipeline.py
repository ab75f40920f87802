"""Filters, then weighted scorers, then a picker: the shape of every routing policy.

Every stage is a pure, synchronous function of the request and the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import BackendView, ClusterView, Decision, RequestInfo


class Filter(Protocol):
    @property
    def name(self) -> str: ...

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

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        candidates: Sequence[BackendView] = view.backends
        for f in self.filters:
            candidates = [b for b in candidates if f.keep(req, view, b)]
            if not candidates:
                return Decision(None, reason=f"no backend passed the '{f.name}' filter")
        if self.scorers:
            total = [0.0] * len(candidates)
            for scorer, weight in self.scorers:
                for i, s in enumerate(scorer.score(req, view, candidates)):
                    total[i] += weight * s
        else:
            total = [0.0] * len(candidates)
        return Decision(self.picker.pick(req, candidates, total))
