"""NetKV decode-instance selection (the NetKV paper's Algorithm 1) and its ablations.

For a request whose prefill ran on `req.prefill_id`, each decode candidate costs

    T_x + T_queue + T_step
    T_x     = lat_tier + s * (L_in - h) / (B_tier * (1 - rho) / (1 + c_self))
    T_queue = one iteration per blocked predecessor when the batch is full
    T_step  = the iteration time at batch size + 1

The three variants differ in what they know of the network: `topology` only the
static tier bandwidths, `static` adds this scheduler's own in-flight transfers
(self-contention), `full` adds the operator's live congestion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from oracle.cost import transfer_seconds
from policies.plugins import Need
from policies.types import BackendView, ClusterView, RequestInfo

SELF_CONTENTION_CAP = 16


def prefix_hit_tokens(req: RequestInfo, backend: BackendView, block_tokens: int) -> int:
    hit = 0
    cached = backend.cached_blocks
    for h in req.block_hashes:
        if h not in cached:
            break
        hit += 1
    return min(hit * block_tokens, req.prompt_tokens)


def queue_seconds(b: BackendView) -> float:
    free_slots = b.max_batch - b.running
    blocked = b.waiting + 1 - free_slots
    return blocked * b.iteration_time(b.running) if blocked > 0 else 0.0


def step_seconds(b: BackendView) -> float:
    return b.iteration_time(min(b.running + 1, b.max_batch))


@dataclass(frozen=True)
class NetKVCost:
    """Scores 1 / (1 + cost in seconds): the argmax is Algorithm 1's argmin."""

    use_self_contention: bool = True
    use_congestion: bool = True
    name: str = "netkv"
    needs: ClassVar[frozenset[Need]] = frozenset({Need.BLOCK_HASHES, Need.ORACLE})

    def cost(self, req: RequestInfo, view: ClusterView, b: BackendView) -> float:
        oracle = view.oracle
        transfer = 0.0
        if oracle is not None and req.prefill_id is not None and req.prefill_id != b.id:
            tier = oracle.tier(req.prefill_id, b.id)
            hit = prefix_hit_tokens(req, b, view.block_tokens)
            nbytes = b.kv_bytes_per_token * (req.prompt_tokens - hit)
            c_self = 0
            if self.use_self_contention:
                c_self = min(
                    view.self_contention.get((req.prefill_id, tier), 0), SELF_CONTENTION_CAP
                )
            rho = oracle.congestion.get(tier, 0.0) if self.use_congestion else 0.0
            transfer = transfer_seconds(
                nbytes, oracle.tier_bandwidth[tier], oracle.tier_latency.get(tier, 0.0), rho, c_self
            )
        return transfer + queue_seconds(b) + step_seconds(b)

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        return [1.0 / (1.0 + self.cost(req, view, b)) for b in candidates]


@dataclass(frozen=True)
class KVFeasible:
    """Free KV memory for the whole prompt plus a reserve (unknown capacity passes)."""

    reserve_tokens: int = 2048
    name: str = "kv_feasible"
    per_model: ClassVar[bool] = False  # depends on the prompt's length and KV use

    def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
        if backend.kv_capacity_tokens <= 0 or backend.stats_age > view.stale_after:
            return True
        return backend.free_kv_tokens() >= req.prompt_tokens + self.reserve_tokens
