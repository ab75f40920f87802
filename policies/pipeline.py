"""Filters, then weighted scorers, then a picker: the shape of every routing policy.

Every stage is a pure, synchronous function of the request and the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from policies.plugins import Need, needs_of
from policies.types import BackendView, ClusterView, Decision, RequestInfo


class Filter(Protocol):
    """Keeps a backend or not. A filter whose verdict depends only on the request's model
    and the backend's health and configuration sets `per_model = True`; a pipeline then
    works out its verdicts once per model and snapshot epoch (`ClusterView.epoch`)."""

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

    def rank(
        self,
        req: RequestInfo,
        candidates: Sequence[BackendView],
        scores: Sequence[float],
    ) -> list[int]:
        """Every candidate's index, in the order to try them; the first is `pick`'s."""
        ...


class Policy(Protocol):
    """What the gateway and the simulators call: a Pipeline, or a learned policy."""

    @property
    def name(self) -> str: ...

    @property
    def needs(self) -> frozenset[Need]:
        """What the gateway must provide (see `policies.plugins.Need`)."""
        ...

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        """The backend to send the request to, or a rejection (the simulators' call)."""
        ...

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        """The backends in the order to try them, `decide`'s first; a rejection alone
        when none can serve (the gateway's call: retries walk it)."""
        ...


@runtime_checkable
class Refilterable(Protocol):
    """A whole policy (not a pipeline) that can choose among the backends a route's
    filters keep, in place of its own defaults (`build_policy`)."""

    def with_filters(self, filters: tuple[Filter, ...]) -> Policy:
        """This policy behind `filters`, sharing what it loaded."""
        ...


@runtime_checkable
class Warmable(Protocol):
    """A policy whose decision is several times slower once the CPU has idled for a
    millisecond or two (its graph and code out of the caches, the core asleep), and
    that can repeat its last decision, discarding it, to keep them warm. The gateway
    calls `warm` when it has decided nothing for a while (`Settings.keep_warm_ms`)."""

    @property
    def name(self) -> str: ...

    def warm(self) -> bool:
        """Whether there was a decision to repeat."""
        ...


_NO_SCORES: tuple[float, ...] = ()  # a pipeline without scorers: every candidate equal


class _Plan(NamedTuple):
    """How a pipeline runs, worked out once. `decide` unpacks it in one step: reading
    a NamedTuple's fields by name would look each up on the class, cold, per request.
    """

    cache: _Cache  # what this pipeline remembers between requests
    per_model: tuple[Filter, ...]  # the leading filters with per-model verdicts
    rest: tuple[Filter, ...]  # the other filters, run on every request
    lone: Scorer | None  # the only scorer, when it weighs 1: called directly
    weighted: tuple[tuple[Scorer, float], ...]  # otherwise, the scorers and weights
    pick: Callable[[RequestInfo, Sequence[BackendView], Sequence[float]], BackendView]


class _Cache:
    """A pipeline's memory: its per-model verdicts for one snapshot epoch, and the
    plain choice of each backend, made once (building a `Decision` on every request
    costs more than looking one up)."""

    __slots__ = ("choices", "epoch", "verdicts")

    def __init__(self) -> None:
        self.epoch = 0
        self.verdicts: dict[str, tuple[int, ...]] = {}
        self.choices: dict[str, Decision] = {}


@dataclass(frozen=True)
class Pipeline:
    """A configured policy: which backends may serve, how they rank, how one is chosen.

    `decide` runs on every request, where the caches are cold and each Python call or
    attribute looked up on a class costs a fraction of a microsecond; it is written to
    make few of either (and on Python 3.11 each comprehension is a call of its own).
    """

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[tuple[Scorer, float], ...]
    picker: Picker
    _plan: _Plan = field(init=False, repr=False, compare=False)
    _needs: frozenset[Need] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = 0
        while n < len(self.filters) and getattr(self.filters[n], "per_model", False):
            n += 1
        lone = self.scorers[0][0] if len(self.scorers) == 1 and self.scorers[0][1] == 1.0 else None
        weighted = () if lone is not None else self.scorers
        plan = _Plan(_Cache(), self.filters[:n], self.filters[n:], lone, weighted, self.picker.pick)
        object.__setattr__(self, "_plan", plan)
        stages: list[object] = [*self.filters, *(s for s, _ in self.scorers), self.picker]
        object.__setattr__(self, "_needs", frozenset().union(*map(needs_of, stages)))

    @property
    def needs(self) -> frozenset[Need]:
        return self._needs

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return scored  # a rejection
        candidates, total = scored
        return self._choice(self._plan.pick(req, candidates, total).id)

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return (scored,)  # a rejection
        candidates, total = scored
        choices = self._plan.cache.choices
        out = []
        for i in self.picker.rank(req, candidates, total):
            backend_id = candidates[i].id
            decision = choices.get(backend_id)
            if decision is None:
                decision = choices[backend_id] = Decision(backend_id)
            out.append(decision)
        return tuple(out)

    def _choice(self, backend_id: str) -> Decision:
        choices = self._plan.cache.choices
        decision = choices.get(backend_id)
        if decision is None:
            decision = choices[backend_id] = Decision(backend_id)
        return decision

    def _scored(
        self, req: RequestInfo, view: ClusterView
    ) -> Decision | tuple[Sequence[BackendView], Sequence[float]]:
        """The candidates that pass the filters and their weighted scores, or the
        rejection naming the filter that left none."""
        candidates = self.candidates(req, view)
        if isinstance(candidates, Decision):
            return candidates
        _, _, _, lone, weighted, _ = self._plan
        total: Sequence[float] = _NO_SCORES
        if lone is not None:
            total = lone.score(req, view, candidates)
        elif weighted:
            total = [0.0] * len(candidates)
            for scorer, weight in weighted:
                for i, s in enumerate(scorer.score(req, view, candidates)):
                    total[i] += weight * s
        return candidates, total

    def candidates(self, req: RequestInfo, view: ClusterView) -> Decision | Sequence[BackendView]:
        """The backends that pass the filters, or the rejection naming the filter that
        left none (a learned policy filters with a pipeline of filters alone)."""
        cache, per_model, rest, _, _, _ = self._plan
        candidates: Sequence[BackendView] = view.backends
        if per_model:
            if cache.epoch != view.epoch:
                cache.epoch = view.epoch
                cache.verdicts = {}
            verdicts = cache.verdicts
            kept = verdicts.get(req.model)
            if kept is None:
                kept = verdicts[req.model] = self._verdicts(per_model, req, view)
            if len(kept) != len(candidates):
                if not kept:
                    return self._rejected(req, view)
                candidates = [candidates[i] for i in kept]
        for f in rest:
            candidates = [b for b in candidates if f.keep(req, view, b)]
            if not candidates:
                return self._rejected(req, view)
        return candidates

    @staticmethod
    def _verdicts(
        filters: tuple[Filter, ...], req: RequestInfo, view: ClusterView
    ) -> tuple[int, ...]:
        """Which backends (by index) every per-model filter keeps."""
        return tuple(
            i for i, b in enumerate(view.backends) if all(f.keep(req, view, b) for f in filters)
        )

    def _rejected(self, req: RequestInfo, view: ClusterView) -> Decision:
        """Which filter left no backend, for the client's error message."""
        candidates: Sequence[BackendView] = view.backends
        for f in self.filters:
            candidates = [b for b in candidates if f.keep(req, view, b)]
            if not candidates:
                return Decision(
                    None, reason=f"no backend passed the '{f.name}' filter", rejected_by=f.name
                )
        raise AssertionError("a remembered verdict disagreed with the filters")
