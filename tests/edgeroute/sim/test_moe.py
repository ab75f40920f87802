"""The MoE serving simulator: latency follows the remote share; migration obeys eq. 4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeroute.sim.moe import simulate
from policies.prism import Server, prism, uniform
from tests.support import DATA_DIR, needs_data
from workers.moe import DEEPSEEK_V2_LITE, CostModel, task_distribution

pytestmark = needs_data("the MoE routing data")
SHAPE, SIZE, MEM = DEEPSEEK_V2_LITE, 0.0173, 8.0
COST = CostModel(local_expert_s=0.0005, hidden_bytes=4096)


def setup() -> tuple[list[Server], list[list[np.ndarray]]]:
    servers = [
        Server("a", (MEM,), (2.0,)),
        Server("b", (MEM,), (2.0,)),
        Server("c", (MEM, MEM), (2.0, 2.0)),
    ]
    tasks = [[task_distribution(SHAPE, t, Path(DATA_DIR))] for t in ("x", "y", "z")]
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
        [t[0], task_distribution(SHAPE, f"new-{i}", Path(DATA_DIR))] for i, t in enumerate(tasks)
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
