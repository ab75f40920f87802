"""NetKV decode selection and its ablations on hand-built views."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from oracle.topology import Topology
from policies import BackendView, ClusterView, PipelineSpec, RequestInfo, build_pipeline
from policies.netkv import NetKVCost, queue_seconds, step_seconds
from policies.text import block_hashes, stable_hash

TOPO = Topology(
    instances={
        "p0": {"node": "n0", "rack": "r0", "pod": "a"},
        "near": {"node": "n1", "rack": "r0", "pod": "a"},  # rack tier
        "far": {"node": "n9", "rack": "r9", "pod": "b"},
    },  # cluster tier
    tier_bandwidth={"node": 3200.0, "rack": 100.0, "pod": 50.0, "cluster": 25.0},
    tier_latency={"node": 1.0, "rack": 5.0, "pod": 10.0, "cluster": 20.0},
)
PROMPT = "q" * 4 * 16384  # 16K tokens
BLOCKS = block_hashes(PROMPT, 64)


def decode(i: str, **kw: object) -> BackendView:
    kw.setdefault("models", frozenset({"m"}))
    kw.setdefault("role", "decode")
    kw.setdefault("stats_age", 0.1)
    kw.setdefault("kv_bytes_per_token", 81_920.0)
    return BackendView(id=i, id_hash=stable_hash(i), **kw)  # type: ignore[arg-type]


def req(**kw: object) -> RequestInfo:
    base: dict[str, object] = {
        "model": "m",
        "prompt_tokens": 16384,
        "block_hashes": BLOCKS,
        "prefill_id": "p0",
    }
    base.update(kw)
    return RequestInfo(**base)  # type: ignore[arg-type]


def view(
    *backends: BackendView,
    oracle: Topology = TOPO,
    contention: dict[tuple[str, str], int] | None = None,
) -> ClusterView:
    return ClusterView(
        tuple(backends), oracle=oracle, self_contention=MappingProxyType(contention or {})
    )


def pick(policy: str, v: ClusterView, r: RequestInfo) -> str:
    d = build_pipeline(PipelineSpec(policy=policy)).decide(r, v)
    assert d.backend_id is not None, d.reason
    return d.backend_id


def test_netkv_avoids_a_warm_candidate_behind_a_congested_tier_that_cla_picks() -> None:
    # far holds 90% of the prompt; near holds nothing. The cluster tier is congested.
    warm_far = decode("far", cached_blocks=frozenset(BLOCKS[: int(len(BLOCKS) * 0.9)]))
    cold_near = decode("near")
    congested = TOPO.model_copy(update={"congestion": {"cluster": 0.97}})
    v = view(warm_far, cold_near, oracle=congested)
    assert pick("decode_cla", v, req()) == "far"
    assert pick("decode_ca", v, req()) == "far"
    assert pick("netkv_full", v, req()) == "near"
    # Without the live congestion signal the warm cache still looks best.
    assert pick("netkv_static", v, req()) == "far"


def test_topology_only_prefers_the_fast_tier_for_equal_caches() -> None:
    v = view(decode("far"), decode("near"))
    assert pick("netkv_topology", v, req()) == "near"


def test_self_contention_spreads_transfers_from_one_prefill_instance() -> None:
    v = view(decode("far"), decode("near"), contention={("p0", "rack"): 8})
    # Rack: 100 Gbps / 9 = 11.1 Gbps effective, below the idle cluster tier's 25.
    assert pick("netkv_static", v, req()) == "far"
    assert pick("netkv_topology", v, req()) == "near"
    assert pick("netkv_full", v, req()) == "far"


def test_cost_terms() -> None:
    b = decode("near", running=256, waiting=3, max_batch=256, iter_base=0.02, iter_per_seq=0.001)
    assert queue_seconds(b) == pytest.approx(4 * (0.02 + 0.256))
    assert step_seconds(b) == pytest.approx(0.02 + 0.256)
    idle = decode("near", running=10, max_batch=256, iter_base=0.02, iter_per_seq=0.001)
    assert queue_seconds(idle) == 0.0
    cost = NetKVCost().cost(req(), view(idle), idle)
    nbytes = 81_920 * 16384
    want = 5e-6 + nbytes / (100e9 / 8) + 0.02 + 0.011
    assert cost == pytest.approx(want)


def test_memory_infeasible_candidates_are_filtered_and_none_left_is_a_rejection() -> None:
    full = decode("near", kv_capacity_tokens=20000, kv_usage=0.5)  # 10K free < 16K + reserve
    roomy = decode("far", kv_capacity_tokens=200000, kv_usage=0.5)
    assert pick("netkv_full", view(full, roomy), req()) == "far"
    d = build_pipeline(PipelineSpec(policy="netkv_full")).decide(req(), view(full))
    assert d.rejected and "kv_feasible" in d.reason


def test_decode_presets_only_consider_decode_instances() -> None:
    v = view(decode("near", role="prefill"), decode("far"))
    for policy in ("decode_rr", "decode_la", "decode_ca", "decode_cla", "netkv_full"):
        assert pick(policy, v, req()) == "far"
