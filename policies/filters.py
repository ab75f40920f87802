"""Filters: which backends may serve a request at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.types import BackendView, ClusterView, RequestInfo


@dataclass(frozen=True)
class Healthy:
    """Circuit closed (or probing) and not draining."""

    name: str = "healthy"
    per_model: ClassVar[bool] = True

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        return backend.healthy


@dataclass(frozen=True)
class ServesModel:
    name: str = "serves_model"
    per_model: ClassVar[bool] = True

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        return req.model in backend.models


@dataclass(frozen=True)
class Role:
    """Backends of one role: whole requests go to `both`; disaggregated ones split."""

    role: str = "both"
    name: str = "role"
    per_model: ClassVar[bool] = True

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        return backend.role == self.role


@dataclass(frozen=True)
class MemoryFeasible:
    """Skip backends whose fresh KV usage is above a ceiling."""

    max_kv_usage: float = 0.98
    name: str = "memory_feasible"
    per_model: ClassVar[bool] = False  # reads KV use, which each scrape changes

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        return backend.stats_age > view.stale_after or backend.kv_usage <= self.max_kv_usage


@dataclass(frozen=True)
class QueueCap:
    """Skip backends that already hold `max_requests` requests: admission control.

    A backend's depth is the gateway's count of requests in flight there: this
    replica's, exact at this instant, plus the other replicas' from the shared store.
    Not the engine's scraped running and waiting counts, which lag by up to a scrape
    and would keep a backend shut after its requests have finished. When every backend
    is that deep the request is shed, 503 with Retry-After, rather than queued behind
    work that would make it and the requests ahead of it late."""

    max_requests: int = 64
    name: str = "queue_cap"
    per_model: ClassVar[bool] = False  # reads load, which every request changes

    def __post_init__(self) -> None:
        if isinstance(self.max_requests, bool) or not isinstance(self.max_requests, int):
            raise ValueError(f"max_requests must be a whole number, not {self.max_requests!r}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, not {self.max_requests}")

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        return backend.inflight < self.max_requests


# What a policy keeps when its route names no filters: whole-request backends that are
# healthy and serve the model (presets' and the QoS policy's alike).
DEFAULT: tuple[Healthy | ServesModel | Role, ...] = (Healthy(), ServesModel(), Role())
