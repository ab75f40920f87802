"""The data a policy sees: one request and an immutable snapshot of the cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["both", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the gateway knows about a request before it is routed.

    `seq` and `entropy` are drawn at the edge, so policies stay pure: round-robin
    uses `seq`, and every random choice (tie-breaks, power-of-two, random) is
    derived from `entropy`.
    """

    model: str
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    max_tokens: int | None = None
    session_hash: int | None = None
    seq: int = 0
    entropy: int = 0
    stream: bool = False
    task: str | None = None
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend as the policies see it at one instant."""

    id: str
    url: str = ""
    role: Role = "both"
    models: frozenset[str] = frozenset()
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    stats_age: float = float("inf")
    inflight: int = 0
    cached_blocks: frozenset[int] = frozenset()
    id_hash: int = 0


@dataclass(frozen=True, slots=True)
class ClusterView:
    """An immutable snapshot of every backend, built off the request path."""

    backends: tuple[BackendView, ...]
    stale_after: float = 5.0


@dataclass(frozen=True, slots=True)
class Decision:
    """A chosen backend, or a rejection with the reason a client will read."""

    backend: BackendView | None
    reason: str = ""
    retry_after: float = 1.0

    @property
    def rejected(self) -> bool:
        return self.backend is None


def queue_depth(backend: BackendView, stale_after: float) -> int:
    """Requests ahead of a new one on `backend`.

    The engine's running+waiting counts everything, including other clients'
    traffic, but is only as fresh as the last scrape; the gateway's in-flight
    count (summed across replicas) is fresh but misses outside traffic. The
    larger of the two is the best lower bound; stale engine stats are ignored.
    """
    engine = backend.running + backend.waiting if backend.stats_age <= stale_after else 0
    return max(engine, backend.inflight)
