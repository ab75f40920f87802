"""The MoE serving simulator: latency follows the remote share, GPUs queue, migration
obeys eq. 4."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from edgeroute.sim.moe import Drawn, simulate
from policies.prism import Placement, Server, prism, uniform
from tests.support import DATA_DIR, needs_data
from workers.moe import DEEPSEEK_V2_LITE, CostModel, task_distribution

pytestmark = needs_data("the MoE routing data")
SHAPE, SIZE, MEM = DEEPSEEK_V2_LITE, 0.0173, 8.0
COST = CostModel(local_expert_s=0.0005, hidden_bytes=4096)


def setup() -> tuple[list[Server], list[Drawn]]:
    servers = [
        Server("a", (MEM,), (2.0,)),
        Server("b", (MEM,), (2.0,)),
        Server("c", (MEM, MEM), (2.0, 2.0)),
    ]
    tasks = [
        Drawn((task_distribution(SHAPE, t, Path(DATA_DIR)),), SHAPE.top_k) for t in ("x", "y", "z")
    ]
    return servers, tasks


def test_a_remote_call_costs_more_than_a_local_one() -> None:
    c = CostModel()
    assert c.remote_expert_s > c.local_expert_s
    assert c.remote_expert_s == pytest.approx(0.001 + 2 * 8192 * 8 / 500e6 + 0.002 + 0.002)


def test_more_local_compute_means_lower_latency() -> None:
    servers, tasks = setup()
    runs = {
        name: simulate(servers, SHAPE, tasks, planner, duration=200, cost=COST, expert_size=SIZE)
        for name, planner in (
            ("uniform", lambda st: uniform(servers, SHAPE.experts, SHAPE.layers, SIZE)),
            ("prism", lambda st: prism(servers, SHAPE.experts, SIZE, st)),
        )
    }
    local = {k: np.mean([x for _, x in r.local]) for k, r in runs.items()}
    latency = {k: np.mean([v for lat in r.latency for v in lat]) for k, r in runs.items()}
    assert local["prism"] > local["uniform"] + 0.05
    assert latency["prism"] < latency["uniform"]


def test_migration_happens_only_when_it_pays() -> None:
    servers, tasks = setup()
    shifted = [
        Drawn((t.phases[0], task_distribution(SHAPE, f"new-{i}", Path(DATA_DIR))), SHAPE.top_k, 900)
        for i, t in enumerate(tasks)
    ]
    planner = lambda st: prism(servers, SHAPE.experts, SIZE, st)  # noqa: E731
    moved = simulate(
        servers, SHAPE, shifted, planner, duration=900, cost=COST, expert_size=SIZE, replan=150
    )
    assert moved.migrations  # the shift makes a new plan worth its migration
    # Migration so expensive that no plan can pay it back: eq. 4 always says no.
    slow = [Server(s.id, s.gpu_memory, tuple(1e-9 for _ in s.gpu_memory)) for s in servers]
    stay = simulate(
        slow,
        SHAPE,
        shifted,
        lambda st: prism(slow, SHAPE.experts, SIZE, st),
        duration=900,
        cost=COST,
        expert_size=SIZE,
        replan=150,
    )
    assert stay.migrations == []


def fixed(placement: Placement, stats: Sequence[np.ndarray]) -> Placement:
    """A planner that keeps `placement` whatever the statistics."""
    return placement


def test_a_gpu_serving_everyone_queues_and_a_copy_relieves_it() -> None:
    """Contention: when every server's calls go to one GPU, a second copy of every
    expert on another GPU (calls go to the copy that frees first) cuts latency."""
    shape = DEEPSEEK_V2_LITE
    everything = frozenset((la, e) for la in range(shape.layers) for e in range(shape.experts))
    servers = [Server(s, (1e9, 1e9)) for s in ("a", "b", "c", "d")]
    one_copy = Placement(((everything, frozenset()),) + ((frozenset(), frozenset()),) * 3)
    two_copies = Placement(((everything, everything),) + ((frozenset(), frozenset()),) * 3)
    flat = np.full((shape.layers, shape.experts), 1 / shape.experts)
    sources = [Drawn((flat,), shape.top_k)] * 4
    runs = {
        name: simulate(
            servers,
            shape,
            sources,
            functools.partial(fixed, p),
            duration=600,
            arrival_s=30.0,
            cost=CostModel(local_expert_s=0.002, remote_load_s=0.0),
            expert_size=1.0,
        )
        for name, p in (("one", one_copy), ("two", two_copies))
    }
    # Servers b, c and d hold nothing in either: all their calls are remote.
    latency = {k: np.mean([v for lat in r.latency[1:] for v in lat]) for k, r in runs.items()}
    assert latency["two"] < 0.85 * latency["one"]
    # The work was spread over both GPUs of the first server, not left on one.
    busy = runs["two"].gpu_busy
    assert min(busy[0, 0], busy[0, 1]) > 0.3 * max(busy[0, 0], busy[0, 1])
