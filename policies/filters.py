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
