"""Prism's placement, tested for its properties on random heterogeneous instances."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from policies.prism import (
    Placement,
    Server,
    allocate_counts,
    entropy,
    eplb,
    greedy,
    local_utility,
    migration_seconds,
    prism,
    redundance,
    remote_cost,
    should_adopt,
    smartmoe,
    uniform,
)


def instance(
    rng: np.random.Generator, layers: int, experts: int
) -> tuple[list[Server], float, list[np.ndarray]]:
    size = 1.0
    need = layers * experts
    servers = []
    for i in range(int(rng.integers(2, 5))):
        gpus = tuple(float(rng.integers(2, 2 + need)) for _ in range(int(rng.integers(1, 3))))
        servers.append(Server(f"s{i}", gpus, tuple(float(rng.uniform(1, 5)) for _ in gpus)))
    if sum(s.capacity(size) for s in servers) < need:  # make it feasible
        servers.append(Server("big", (float(need),), (1.0,)))
    freq = [
        rng.dirichlet(np.full(experts, float(rng.uniform(0.2, 2.0))), size=layers) for _ in servers
    ]
    return servers, size, freq


def all_placements(
    rng: np.random.Generator, layers: int, experts: int
) -> list[tuple[str, list[Server], float, list[np.ndarray], Placement]]:
    out = []
    servers, size, freq = instance(rng, layers, experts)
    out.append(("prism", servers, size, freq, prism(servers, experts, size, freq)))
    out.append(
        ("prism-floor", servers, size, freq, prism(servers, experts, size, freq, rounding="floor"))
    )
    out.append(("uniform", servers, size, freq, uniform(servers, experts, layers, size)))
    out.append(("redundance", servers, size, freq, redundance(servers, experts, layers, size)))
    out.append(("smartmoe", servers, size, freq, smartmoe(servers, experts, size, freq)))
    out.append(("eplb", servers, size, freq, eplb(servers, experts, size, freq)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_every_expert_placed_and_no_gpu_over_its_memory(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, experts = int(rng.integers(1, 6)), int(rng.integers(2, 9))
    for name, servers, size, _, p in all_placements(rng, layers, experts):
        placed = set().union(*(p.on_server(n) for n in range(len(servers))))
        assert placed == {(la, e) for la in range(layers) for e in range(experts)}, name
        for n, s in enumerate(servers):
            for g, mem in enumerate(s.gpu_memory):
                assert len(p.gpus[n][g]) * size <= mem, (name, n, g)


@pytest.mark.parametrize("seed", range(60))
def test_greedy_local_utility_is_within_1_minus_1_over_e_of_the_optimum(seed: int) -> None:
    """Theorem 1 on the greedy stage of Algorithm 2, against the enumerated optimum.

    The coverage repair that follows can take a server below the bound when memory
    barely covers the model: seed 36 drops server 0 from the optimum 1.231 to 0.666
    (bound 0.778), because 9 slots must hold 8 distinct experts. The theorem's proof
    covers the cardinality-constrained greedy, not the repair.
    """
    rng = np.random.default_rng(1000 + seed)
    layers, experts = 2, 4  # 8 experts: every subset can be enumerated
    servers, size, freq = instance(rng, layers, experts)
    counts = allocate_counts(servers, experts, size, freq)
    sets = greedy(counts, freq)
    pool = [(la, e) for la in range(layers) for e in range(experts)]
    for n in range(len(servers)):
        budget = int(counts[n].sum())
        best = max(
            sum(freq[n][la, e] for la, e in combo)
            for combo in itertools.combinations(pool, min(budget, len(pool)))
        )
        assert local_utility(sets[n], freq[n]) >= (1 - 1 / math.e) * best - 1e-9


def test_entropy_is_zero_for_one_expert_and_one_for_uniform() -> None:
    assert entropy(np.array([[1.0, 0, 0, 0], [1, 1, 1, 1]])) == pytest.approx([0.0, 1.0])


def test_more_diverse_layers_get_more_experts() -> None:
    server = Server("s", (12.0,))
    peaked = np.array([[0.97, 0.01, 0.01, 0.01]] * 2)
    flat = np.full((2, 4), 0.25)
    counts = allocate_counts(
        [server, Server("t", (12.0,))], 4, 1.0, [np.vstack([peaked[:1], flat[:1]])] * 2
    )
    assert counts[0, 1] > counts[0, 0]


def test_prism_beats_the_baselines_on_skewed_activations() -> None:
    rng = np.random.default_rng(7)
    servers = [Server("a", (24.0,)), Server("b", (24.0,)), Server("c", (24.0, 24.0))]
    layers, experts, size = 32, 8, 0.3  # Mixtral-shaped; a third of the model per GPU
    costs: dict[str, list[float]] = {}
    for _ in range(5):
        freq = [rng.dirichlet(np.full(experts, 0.3), size=layers) for _ in servers]
        for name, p in (
            ("prism", prism(servers, experts, size, freq)),
            ("uniform", uniform(servers, experts, layers, size)),
            ("redundance", redundance(servers, experts, layers, size)),
            ("smartmoe", smartmoe(servers, experts, size, freq)),
            ("eplb", eplb(servers, experts, size, freq)),
        ):
            costs.setdefault(name, []).append(remote_cost(p, freq))
    mean = {k: float(np.mean(v)) for k, v in costs.items()}
    assert mean["prism"] < min(v for k, v in mean.items() if k != "prism")


def test_migration_cost_and_the_adoption_rule() -> None:
    servers = [Server("a", (4.0, 4.0), (2.0, 0.5))]
    old = Placement(((frozenset({(0, 0), (0, 1)}), frozenset({(0, 2)})),))
    new = Placement(((frozenset({(0, 0), (0, 3)}), frozenset({(0, 2), (0, 1)})),))
    # GPU 0 loses (0,1) and gains (0,3): 2 changes at speed 2; GPU 1 gains (0,1) at 0.5.
    assert migration_seconds(old, new, servers, 1.0) == pytest.approx(2 / 2.0 + 1 / 0.5)
    assert migration_seconds(old, old, servers, 1.0) == 0.0
    assert should_adopt(cost_new=5.0, migration=3.0, cost_old=9.0)
    assert not should_adopt(cost_new=5.0, migration=4.0, cost_old=9.0)


def test_the_expert_map_scorer_prefers_the_server_holding_the_class_experts() -> None:
    from types import MappingProxyType

    from policies import BackendView, ClusterView, PipelineSpec, RequestInfo, build_pipeline

    freq = np.zeros((2, 4))
    freq[0, 1] = freq[1, 3] = 10.0  # class "code" uses expert 1 of layer 0, 3 of layer 1
    freq[0, 0] = freq[1, 0] = 1.0
    holds_them = BackendView(
        id="a",
        models=frozenset({"m"}),
        stats_age=0.0,
        inflight=2,
        hosted_experts=frozenset({(0, 1), (1, 3)}),
    )
    holds_other = BackendView(
        id="b",
        models=frozenset({"m"}),
        stats_age=0.0,
        inflight=0,
        hosted_experts=frozenset({(0, 0), (1, 0)}),
    )
    view = ClusterView((holds_them, holds_other), expert_stats=MappingProxyType({"code": freq}))
    pipeline = build_pipeline(PipelineSpec(policy="prism"))
    pick = pipeline.decide(RequestInfo(model="m", prompt_tokens=10, task="code"), view)
    assert pick.backend_id == "a"  # 20/22 local beats load
    # Unknown class: the map says nothing, the queue decides.
    other = pipeline.decide(RequestInfo(model="m", prompt_tokens=10, task="chat"), view)
    assert other.backend_id == "b"


def test_eplb_replicates_the_hottest_experts_and_balances_the_gpus() -> None:
    """DeepSeek's EPLB: spare slots replicate the experts with the most load per
    replica, and replicas are packed so that the GPUs' loads come out even."""
    layers, experts, size = 2, 8, 1.0
    servers = [Server(f"s{i}", (3.0, 3.0)) for i in range(4)]  # 24 slots: 12 per layer
    skew = np.array([40.0, 20.0, 10.0, 5.0, 2.0, 1.0, 1.0, 1.0])
    freq = [np.stack([skew, skew[::-1]]) / 4 for _ in servers]
    p = eplb(servers, experts, size, freq)
    copies = np.zeros((layers, experts), int)
    for n in range(len(servers)):
        for layer, e in p.on_server(n):
            copies[layer, e] += 1
    assert (copies >= 1).all()  # every expert somewhere
    assert copies[0].sum() == copies[1].sum() == 12
    assert copies[0, 0] == max(copies[0]) > copies[0, 7] == 1  # the hottest, most copies
    assert copies[1, 7] == max(copies[1]) > copies[1, 0] == 1  # per layer
    assert list(copies[0]) == sorted(copies[0], reverse=True)  # copies follow load
    # Each copy carries its expert's load over its copies; in every layer the GPUs come
    # out even: none above the mean by more than one copy's load (greedy packing's bound).
    load = np.sum(freq, axis=0)
    for layer in range(layers):
        items = {e: load[layer, e] / copies[layer, e] for e in range(experts)}
        per_gpu = [
            sum(items[e] for la, e in gpu if la == layer) for server in p.gpus for gpu in server
        ]
        assert max(per_gpu) <= sum(per_gpu) / len(per_gpu) + max(items.values()) + 1e-9
    # The old fill (every expert once in layer order, copies wherever memory was left)
    # would not pass the first checks: its copies did not follow the load.


def test_uniform_and_redundance_are_random_as_in_prisms_evaluation() -> None:
    layers, experts, size = 4, 8, 1.0
    servers = [Server(f"s{i}", (10.0,)) for i in range(4)]  # 40 slots for 32 experts
    a, b = (
        uniform(servers, experts, layers, size, seed=1),
        uniform(servers, experts, layers, size, seed=2),
    )
    assert a != b
    for p in (a, b):
        held = [p.on_server(n) for n in range(len(servers))]
        assert sum(len(h) for h in held) == layers * experts  # each expert once
        for layer in range(layers):  # two random experts per GPU per layer
            assert [sum(la == layer for la, _ in h) for h in held] == [2, 2, 2, 2]
    r = redundance(servers, experts, layers, size, seed=1)
    held = [r.on_server(n) for n in range(len(servers))]
    assert all(len(h) == 10 for h in held)  # spare memory filled with copies
    assert set().union(*held) == {(la, e) for la in range(layers) for e in range(experts)}
    assert r != redundance(servers, experts, layers, size, seed=2)


def test_smartmoe_balances_each_layer_over_the_gpus_without_copies() -> None:
    """SmartMoE's placement: every expert exactly once, the same count on every GPU per
    layer, and each layer's load spread evenly (hottest first onto the least loaded)."""
    layers, experts, size = 3, 8, 1.0
    servers = [Server("a", (8.0,)), Server("b", (8.0,)), Server("c", (8.0, 8.0))]
    rng = np.random.default_rng(3)
    freq = [rng.dirichlet(np.full(experts, 0.3), size=layers) for _ in servers]
    p = smartmoe(servers, experts, size, freq)
    gpus = [gpu for server in p.gpus for gpu in server]
    load = np.sum(freq, axis=0)
    spread = []
    for layer in range(layers):
        held = [[e for la, e in gpu if la == layer] for gpu in gpus]
        assert sorted(e for h in held for e in h) == list(range(experts))  # once each
        assert [len(h) for h in held] == [2, 2, 2, 2]  # even counts
        per_gpu = [sum(load[layer, e] for e in h) for h in held]
        spread.append(max(per_gpu) - min(per_gpu))
        # Greedy balancing: no GPU above another by more than the hottest expert's load.
        assert max(per_gpu) - min(per_gpu) <= load[layer].max() + 1e-9
    # A random even split (Uniform) spreads the load wider on these skewed layers.
    uni = uniform(servers, experts, layers, size, seed=0)
    uni_gpus = [gpu for server in uni.gpus for gpu in server]
    uni_spread = [
        max(sum(load[la, e] for x, e in g if x == la) for g in uni_gpus)
        - min(sum(load[la, e] for x, e in g if x == la) for g in uni_gpus)
        for la in range(layers)
    ]
    assert sum(spread) < sum(uni_spread)
