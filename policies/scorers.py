"""Scorers: each rates every candidate in [0, 1], higher is better."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.plugins import Need
from policies.types import BackendView, ClusterView, RequestInfo

_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Load:
    """Shortest queue first: 1 / (1 + requests ahead).

    Requests ahead: the engine's running+waiting counts everything, including other
    clients' traffic, but is only as fresh as the last scrape; the gateway's in-flight
    count (summed across replicas) is fresh but misses outside traffic. The larger of
    the two is the best lower bound; stale engine stats are ignored. One loop, no call
    per backend: this is the default policy's scorer, run on every request.
    """

    name: str = "load"

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        stale = view.stale_after
        out = []
        for b in candidates:
            engine = b.running + b.waiting if b.stats_age <= stale else 0
            out.append(1.0 / (1.0 + (engine if engine > b.inflight else b.inflight)))
        return out


@dataclass(frozen=True)
class Queue:
    """The shortest waiting queue, min-max scaled over the candidates: 1 for the
    shortest, 0 for the longest, 1 for all when they are level (the shape of the
    Gateway API inference extension's queue scorer). Stale engine stats count as
    the gateway's own in-flight requests."""

    name: str = "queue"

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        stale = view.stale_after
        queues = [b.waiting if b.stats_age <= stale else b.inflight for b in candidates]
        if not queues:
            return []
        low, high = min(queues), max(queues)
        if high == low:
            return [1.0] * len(queues)
        return [(high - q) / (high - low) for q in queues]


@dataclass(frozen=True)
class KVUtilization:
    """Free KV cache: 1 - the engine's KV usage (0 for stale stats, which say nothing)."""

    name: str = "kv_utilization"

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        stale = view.stale_after
        return [1.0 - b.kv_usage if b.stats_age <= stale else 0.0 for b in candidates]


@dataclass(frozen=True)
class PrefixCache:
    """Share of the prompt's leading blocks that the backend recently served."""

    name: str = "prefix_cache"
    needs: ClassVar[frozenset[Need]] = frozenset({Need.BLOCK_HASHES})

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        blocks = req.block_hashes
        if not blocks:
            return [0.0] * len(candidates)
        out = []
        for b in candidates:
            cached = b.cached_blocks
            hit = 0
            for h in blocks:
                if h not in cached:
                    break
                hit += 1
            out.append(hit / len(blocks))
        return out


@dataclass(frozen=True)
class SessionAffinity:
    """Rendezvous (highest-random-weight) hashing of the session over candidates.

    Removing a backend moves only the sessions it held. Without a session key
    every candidate scores 0.5, leaving the choice to the other scorers.
    """

    name: str = "session_affinity"

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        if req.session_hash is None:
            return [0.5] * len(candidates)
        key = req.session_hash
        weights = [mix64(key ^ b.id_hash) for b in candidates]
        best = max(range(len(candidates)), key=weights.__getitem__)
        return [1.0 if i == best else 0.0 for i in range(len(candidates))]


@dataclass(frozen=True)
class ExpertMap:
    """Prism's expert-map score: the share of the request class's expected expert
    activations that the backend holds locally (the rest are remote calls).

    The class is `RequestInfo.task` (the `x-edgeroute-task` header); backends score 0.5
    when the class or the map is unknown, leaving the choice to the other scorers.
    """

    name: str = "expert_map"

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        freq = view.expert_stats.get(req.task or "")
        if freq is None:
            return [0.5] * len(candidates)
        total = float(freq.sum()) or 1.0
        out = []
        for b in candidates:
            if not b.hosted_experts:
                out.append(0.5)
                continue
            local = sum(
                float(freq[layer, e])
                for layer, e in b.hosted_experts
                if layer < freq.shape[0] and e < freq.shape[1]
            )
            out.append(local / total)
        return out
