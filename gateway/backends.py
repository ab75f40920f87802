"""The backend pool: runtime state per backend, and the immutable view policies read.

The view is copy-on-write. Background tasks (scrapes, health, shared-store sync)
rebuild it; a dispatch or completion replaces just one backend's entry, so the
next request sees its own replica's in-flight counts at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gateway.circuit import Circuit, State
from gateway.settings import BackendConfig, CircuitConfig
from gateway.upstream import Attempt
from oracle.topology import Topology
from policies.prefix_cache import PrefixCache
from policies.qos_state import progress_share, token_latency_mix
from policies.text import stable_hash
from policies.types import BackendView, ClusterView, InflightRequest


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_capacity_tokens: int = 0
    scraped_at: float = float("-inf")
    generated_total: float | None = None  # the engine's generation-token counter
    generated_moved_at: float = float("-inf")  # when that counter last grew


@dataclass(eq=False)
class InflightEntry:
    """One in-flight request's progress, for policies that read it (QoS-DRL)."""

    prompt_tokens: int
    started_at: float
    generated: int = 0
    pred_score: float = 0.0
    pred_length: float = 0.0
    token_target: float | None = None  # set when a QoS policy routed the request
    streamed: bool = False  # counted from its events; else estimated, see `credit`
    _estimate: float = 0.0

    def credit(self, tokens: float) -> None:
        """A whole-answer request's progress: its share of the tokens its engine has
        generated since the last scrape (nothing reaches us before its answer)."""
        self._estimate += tokens
        self.generated = int(self._estimate)

    def snapshot(self) -> InflightRequest:
        return InflightRequest(
            self.prompt_tokens, self.started_at, self.generated, self.pred_score, self.pred_length
        )


@dataclass(eq=False)
class Backend:
    config: BackendConfig
    circuit: Circuit
    prefix: PrefixCache  # the prompt blocks this replica sent there: its guess at the engine's
    models: frozenset[str] = frozenset()
    stats: EngineStats = field(default_factory=EngineStats)
    inflight: int = 0  # this replica's requests on it
    token_latency: float = 0.0  # see `finished_tokens`
    remote_inflight: int = 0  # other replicas' requests, from the shared store
    requests: dict[int, InflightEntry] = field(default_factory=dict)
    index: int = -1  # position in the current view
    # Requests sent there that have had no byte back yet, and when a byte last came.
    pending: set[Attempt] = field(default_factory=set)
    progress_at: float = float("-inf")
    # Fixed for the backend's life: the pool keys backends by it, and a new config
    # for the same backend has the same id. Read on every request, so worked out once.
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.config.backend_id

    @property
    def draining(self) -> bool:
        return self.config.draining

    def serves(self) -> frozenset[str]:
        return frozenset(self.config.models) or self.models


class BackendPool:
    def __init__(
        self,
        circuit: CircuitConfig,
        stale_after: float,
        prefix_entries: int,
        block_tokens: int = 64,
    ) -> None:
        self._circuit = circuit
        self._stale_after = stale_after
        self._prefix_entries = prefix_entries
        self._block_tokens = block_tokens
        self.oracle: Topology | None = None  # the operator's, whether or not policies read it
        # What the policies declared (policies.plugins.Need): the pool provides just that.
        self.track_requests = False  # BackendView.requests
        self.provide_network = False  # ClusterView.oracle and self_contention
        self._contention: Mapping[tuple[str, str], int] = MappingProxyType({})
        self._backends: dict[str, Backend] = {}
        self._views: list[BackendView] = []
        self._view = ClusterView((), stale_after=stale_after)
        self._dirty: set[Backend] = set()  # in-flight changes not yet in the view
        self.known_models: frozenset[str] = frozenset()
        self.pd_models: frozenset[str] = frozenset()
        self._hosted: dict[str, frozenset[tuple[int, int]]] = {}
        self._expert_stats: Mapping[str, Any] = MappingProxyType({})

    # -- membership -----------------------------------------------------------

    def __iter__(self) -> Iterator[Backend]:
        return iter(list(self._backends.values()))

    def __len__(self) -> int:
        return len(self._backends)

    def get(self, backend_id: str) -> Backend | None:
        return self._backends.get(backend_id)

    def set_configs(self, configs: Iterable[BackendConfig]) -> None:
        """Make the pool match `configs`, keeping the runtime state of backends that stay."""
        wanted = {c.backend_id: c for c in configs}
        for bid in list(self._backends):
            if bid not in wanted:
                del self._backends[bid]
        for bid, cfg in wanted.items():
            current = self._backends.get(bid)
            if current is None:
                self._backends[bid] = Backend(
                    cfg,
                    Circuit(self._circuit.failures, self._circuit.open_seconds),
                    PrefixCache(self._prefix_entries),
                )
            else:
                current.config = cfg
        self.rebuild()

    def configs(self) -> list[BackendConfig]:
        return [b.config for b in self._backends.values()]

    def models(self, healthy_only: bool = False) -> set[str]:
        now = time.monotonic()
        out: set[str] = set()
        for b in self._backends.values():
            if not healthy_only or (
                not b.draining and (b.circuit.available(now) or b.circuit.trial)
            ):
                out |= b.serves()
        return out

    # -- the view -------------------------------------------------------------

    @property
    def view(self) -> ClusterView:
        """The snapshot policies decide on. Dispatches and completions only mark their
        backend; the next read folds them in, so a request pays for one update."""
        if self._dirty:
            views = self._views
            for b in self._dirty:
                i = b.index
                if 0 <= i < len(views) and views[i].id == b.id:
                    views[i] = views[i].with_load(
                        b.inflight + b.remote_inflight, self._requests_of(b)
                    )
            self._dirty.clear()
            self._view = self._view.with_load(tuple(views))
        return self._view

    def _view_of(self, b: Backend, now: float) -> BackendView:
        return BackendView(
            id=b.id,
            url=b.config.url,
            role=b.config.role,
            models=b.serves(),
            expert=b.config.predicted_as,
            healthy=not b.draining and b.circuit.available(now),
            running=b.stats.running,
            waiting=b.stats.waiting,
            kv_usage=b.stats.kv_usage,
            stats_age=now - b.stats.scraped_at,
            inflight=b.inflight + b.remote_inflight,
            cached_blocks=b.prefix.blocks(),  # a live view: policies decide synchronously
            id_hash=stable_hash(b.id),
            kv_capacity_tokens=b.stats.kv_capacity_tokens,
            max_batch=b.config.profile.max_batch,
            iter_base=b.config.iter_base,
            iter_per_seq=b.config.profile.iter_per_seq,
            kv_bytes_per_token=b.config.profile.kv_bytes_per_token,
            requests=self._requests_of(b),
            hosted_experts=self._hosted.get(b.id, frozenset()),
            token_latency=b.token_latency,
        )

    def _requests_of(self, b: Backend) -> tuple[InflightRequest, ...]:
        if not self.track_requests:
            return ()
        return tuple(e.snapshot() for e in b.requests.values())

    def rebuild(self) -> None:
        """A fresh view of every backend; off the request path."""
        now = time.monotonic()
        views = []
        for i, b in enumerate(self._backends.values()):
            b.index = i
            views.append(self._view_of(b, now))
        self._views = views
        self._dirty.clear()
        self._view = ClusterView(
            tuple(views),
            stale_after=self._stale_after,
            oracle=self.oracle if self.provide_network else None,
            self_contention=self._contention,
            block_tokens=self._block_tokens,
            expert_stats=self._expert_stats,
        )
        self.known_models = frozenset().union(*(v.models for v in views))
        # Models with both a prefill and a decode pool are served disaggregated.
        prefill = frozenset().union(*(v.models for v in views if v.role == "prefill"))
        decode = frozenset().union(*(v.models for v in views if v.role == "decode"))
        self.pd_models = prefill & decode

    def _refresh_one(self, b: Backend, **changes: object) -> None:
        i = b.index
        if 0 <= i < len(self._views) and self._views[i].id == b.id:
            self._views[i] = replace(self._views[i], **changes)  # type: ignore[arg-type]
            self._view = replace(self._view, backends=tuple(self._views))

    def set_experts(
        self, hosted: Mapping[str, frozenset[tuple[int, int]]], stats: Mapping[str, Any]
    ) -> None:
        """Prism's expert map and per-class activation statistics, for the views."""
        self._hosted = dict(hosted)
        self._expert_stats = MappingProxyType(dict(stats))
        self.rebuild()

    def set_network(
        self,
        oracle: Topology | None,
        contention: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """The oracle snapshot and this replica's in-flight KV transfers, for NetKV."""
        self.oracle = oracle
        if contention is not None:
            self._contention = MappingProxyType(dict(contention))
        if self.provide_network:
            self._view = replace(self._view, oracle=oracle, self_contention=self._contention)

    # -- request path -----------------------------------------------------------

    def dispatched(
        self, b: Backend, blocks: tuple[int, ...], entry: InflightEntry | None = None
    ) -> None:
        b.inflight += 1
        if b.circuit.state is not State.CLOSED and b.circuit.begin():
            self._refresh_one(b, healthy=False)  # the trial: nothing else until it ends
        if entry is not None and self.track_requests:
            b.requests[id(entry)] = entry
        if blocks:
            b.prefix.remember(blocks)
        self._dirty.add(b)

    def finished_tokens(self, b: Backend, seconds: float, tokens: int) -> None:
        """A request answered `tokens` tokens in `seconds`, end to end: the backend's
        seconds per token, a moving average over its recent requests."""
        if tokens <= 0 or seconds < 0:
            return
        b.token_latency = token_latency_mix(b.token_latency, seconds / tokens)
        self._dirty.add(b)

    def engine_generated(self, b: Backend, tokens: float) -> None:
        """`tokens` more from `b`'s engine: shared among its running requests, of which
        those this replica sent whole (not streamed) take their part as progress."""
        share = progress_share(tokens, b.stats.running, len(b.requests))
        for entry in b.requests.values():
            if not entry.streamed:
                entry.credit(share)
        self._dirty.add(b)

    def finished(self, b: Backend, entry: InflightEntry | None = None) -> None:
        b.inflight -= 1
        if entry is not None:
            b.requests.pop(id(entry), None)
        if b.circuit.state is not State.CLOSED and b.circuit.abandon():
            self._refresh_one(b, healthy=not b.draining)
        self._dirty.add(b)

    def failed(self, b: Backend) -> bool:
        """Record a failure; True when it opened the circuit."""
        opened = b.circuit.failure(time.monotonic())
        if opened:
            self._refresh_one(b, healthy=False)
        return opened

    def stalled(self, b: Backend) -> bool:
        """The backend holds requests but makes no progress: open its circuit now."""
        opened = b.circuit.trip(time.monotonic())
        self._refresh_one(b, healthy=False)
        return opened

    def succeeded(self, b: Backend) -> None:
        if b.circuit.state is not State.CLOSED or b.circuit.failures:
            b.circuit.success()
            self._refresh_one(b, healthy=not b.draining)

    def total_inflight(self) -> int:
        return sum(b.inflight for b in self._backends.values())
