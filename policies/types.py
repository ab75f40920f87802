"""The data a policy sees: one request and an immutable snapshot of the cluster."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from oracle.topology import Topology

Role = Literal["both", "prefill", "decode"]

_EPOCHS = itertools.count(1)


class _Evolve:
    """`dataclasses.replace(obj, **changes)` for a frozen slots dataclass and a fixed
    set of changed fields, at about half the cost: the slots are copied through their
    descriptors instead of through the generated `__init__`, whose frozen-attribute
    stores dominate a per-request update. Fields outside `changed` are all carried
    over, non-init ones included.
    """

    def __init__(self, cls: type, changed: tuple[str, ...]) -> None:
        slots = [name for c in cls.__mro__ for name in getattr(c, "__slots__", ())]
        kept = [cls.__dict__[n] for n in slots if n not in changed]
        self._cls = cls
        self._kept = [(d.__get__, d.__set__) for d in kept]
        self._changed = [cls.__dict__[n].__set__ for n in changed]

    def __call__(self, obj: Any, *values: Any) -> Any:
        new: Any = object.__new__(self._cls)
        for get, put in self._kept:
            put(new, get(obj))
        for put, value in zip(self._changed, values, strict=True):
            put(new, value)
        return new


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
    prompt: str = ""  # its text (`policies.text.prompt_text`: token ids spelled as text)
    prefill_id: str | None = None  # for decode selection: where the KV cache comes from
    now: float = 0.0  # the arrival instant (monotonic seconds), drawn at the edge
    # requests of its model arriving per second, this one included (`qos_state.Arrivals`),
    # measured at the edge for a policy that needs it (Need.ARRIVAL_RATE)
    arrival_rate: float = 0.0


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
    token_latency: float = 0.0  # s per token of its recently finished requests; 0: none yet
    requests: tuple[InflightRequest, ...] = ()
    hosted_experts: frozenset[tuple[int, int]] = frozenset()  # (layer, expert) it holds

    def with_load(self, inflight: int, requests: tuple[InflightRequest, ...]) -> BackendView:
        """This backend with a new in-flight count and list (the per-request update)."""
        view: BackendView = _with_load(self, inflight, requests)
        return view

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
    # Which configuration and health this snapshot shows. `with_load` keeps it; any
    # other new snapshot (replace() included) draws a new one. A pipeline remembers its
    # per-model filter verdicts for one epoch (see policies.pipeline.Filter).
    epoch: int = field(default_factory=lambda: next(_EPOCHS), init=False, compare=False, repr=False)

    def with_load(self, backends: tuple[BackendView, ...]) -> ClusterView:
        """The same backends, in the same order, with the same health and configuration,
        and new load (in-flight counts): the epoch stays."""
        view: ClusterView = _with_backends(self, backends)
        return view


@dataclass(frozen=True, slots=True)
class Decision:
    """A chosen backend (by id), or a rejection with the reason a client will read.

    It names the backend rather than holding its view, so that the plain choice of a
    backend is one value, made once (by the pipeline), not built per request."""

    backend_id: str | None
    reason: str = ""
    retry_after: float = 1.0
    predicted: tuple[float, float] | None = None  # (score, length) on the chosen backend
    # The per-output-token latency a QoS policy routed (or shed) this request for.
    token_target: float | None = None
    rejected_by: str = ""  # the filter that left no backend, when that is why

    @property
    def rejected(self) -> bool:
        return self.backend_id is None


_with_load = _Evolve(BackendView, ("inflight", "requests"))
_with_backends = _Evolve(ClusterView, ("backends",))
