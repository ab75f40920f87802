"""The data a policy sees: one request and an immutable snapshot of the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from oracle.topology import Topology

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
    prefill_id: str | None = None  # for decode selection: where the KV cache comes from
    now: float = 0.0  # the arrival instant (monotonic seconds), drawn at the edge


@dataclass(frozen=True, slots=True)
class InflightRequest:
    """One of the gateway's requests on a backend, as of the last snapshot."""

    prompt_tokens: int
    started_at: float  # monotonic seconds
    generated: int = 0  # streamed chunks seen so far
    pred_score: float = 0.0
    pred_length: float = 0.0


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
    cached_blocks: AbstractSet[int] = frozenset()  # read-only; a set view will do
    id_hash: int = 0
    kv_capacity_tokens: int = 0  # 0: unknown
    max_batch: int = 256
    iter_base: float = 0.02  # s per iteration, plus iter_per_seq per sequence in the batch
    iter_per_seq: float = 0.0005
    kv_bytes_per_token: float = 327_680.0
    expert: str | None = None  # the model it serves, for quality predictors
    requests: tuple[InflightRequest, ...] = ()
    hosted_experts: frozenset[tuple[int, int]] = frozenset()  # (layer, expert) it holds

    def free_kv_tokens(self) -> float:
        return (1.0 - self.kv_usage) * self.kv_capacity_tokens

    def iteration_time(self, batch: int) -> float:
        return self.iter_base + self.iter_per_seq * batch


@dataclass(frozen=True, slots=True)
class ClusterView:
    """An immutable snapshot of every backend, built off the request path."""

    backends: tuple[BackendView, ...]
    stale_after: float = 5.0
    oracle: Topology | None = None
    # KV transfers this scheduler has in flight, by (prefill instance, tier).
    self_contention: Mapping[tuple[str, str], int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    block_tokens: int = 64  # the granularity of RequestInfo.block_hashes
    # Prism: each request class's expert-activation frequencies, [layers, experts].
    expert_stats: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # Per-model filter verdicts, by pipeline and then model, worked out on first use
    # (see policies.pipeline.Filter).
    # Not an init field, so `replace()` starts an empty one; a snapshot that differs
    # from its predecessor only in load may take the predecessor's over (`carry_memo`).
    memo: dict[object, dict[str, tuple[int, ...]]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    # A plain choice of each backend, by id, made once: building a `Decision` on every
    # request costs more than looking one up (see policies.pipeline.Pipeline.decide).
    choices: dict[str, Decision] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def carry_memo(self, previous: ClusterView) -> ClusterView:
        """Take `previous`'s memo (and its choices, which always hold): only for the
        same backends, in the same order, with the same health and configuration."""
        object.__setattr__(self, "memo", previous.memo)
        object.__setattr__(self, "choices", previous.choices)
        return self


@dataclass(frozen=True, slots=True)
class Decision:
    """A chosen backend (by id), or a rejection with the reason a client will read.

    It names the backend rather than holding its view, so that the plain choice of a
    backend is one value, made once (`ClusterView.choices`), not built per request."""

    backend_id: str | None
    reason: str = ""
    retry_after: float = 1.0
    predicted: tuple[float, float] | None = None  # (score, length) on the chosen backend
    # The per-output-token latency a QoS policy routed (or shed) this request for.
    token_target: float | None = None

    @property
    def rejected(self) -> bool:
        return self.backend_id is None
