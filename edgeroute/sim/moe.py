"""Collaborative MoE inference on heterogeneous edge servers (the Prism paper, section IV).

Each server receives its own Poisson stream of requests (one task per server in the
specialised set-up; any mix otherwise) and decodes them one at a time. Every token
activates `top_k` experts per layer (the calibrated model of `workers.moe`). Local
experts run in parallel on the server's GPU; each expert it does not hold adds a remote
call (round trip, the activations over the link both ways, the remote GPU's load and
compute), one after another on the shared link, so a layer's time rises with its
remote share, as the paper's Fig. 5 shows.

A placement is planned from the activation statistics seen so far; with `replan` set,
the global scheduler re-plans every `replan` seconds and migrates only when eq. 4 holds,
the migration itself taking eq. 3's time on the servers it changes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.prism import Placement, Server, migration_seconds, remote_cost, should_adopt
from workers.moe import CostModel, MoEShape, sample_token

Planner = Callable[[Sequence[np.ndarray]], Placement]


@dataclass
class Result:
    latency: list[list[float]] = field(default_factory=list)  # per server: request latencies
    arrivals: list[list[float]] = field(default_factory=list)  # per server: when each came
    local: list[tuple[float, float]] = field(default_factory=list)  # (time, local share)
    migrations: list[float] = field(default_factory=list)


def simulate(
    servers: Sequence[Server],
    shape: MoEShape,
    tasks: Sequence[Sequence[np.ndarray]],
    planner: Planner,
    *,
    warmup_tokens: int = 200,
    arrival_s: float = 10.0,
    tokens: int = 20,
    duration: float = 600.0,
    cost: CostModel = CostModel(),
    replan: float | None = None,
    expert_size: float = 1.0,
    seed: int = 0,
    window: float = 30.0,
) -> Result:
    """`tasks[n]` is a list of (time-ordered) phases of server n's activation distribution:
    phase i applies from i * duration / len(phases)."""
    rng = np.random.default_rng(seed)
    n_servers = len(servers)

    def dist(n: int, t: float) -> np.ndarray:
        phases = tasks[n]
        return phases[min(len(phases) - 1, int(t / (duration / len(phases))))]

    stats = [np.zeros((shape.layers, shape.experts)) for _ in servers]
    for n in range(n_servers):  # the history the first plan is made from
        for _ in range(warmup_tokens):
            sel = sample_token(dist(n, 0.0), shape.top_k, rng)
            np.add.at(stats[n], (np.arange(shape.layers)[:, None], sel), 1.0)
    placement = planner(stats)
    local_sets = [placement.layer_sets(n, shape.layers) for n in range(n_servers)]
    result = Result(latency=[[] for _ in servers], arrivals=[[] for _ in servers])
    events: list[tuple[float, int]] = []
    for n in range(n_servers):
        heapq.heappush(events, (rng.exponential(arrival_s), n))
    free_at = [0.0] * n_servers
    blocked_until = [0.0] * n_servers
    next_plan = replan if replan else math.inf
    win_local, win_total, win_start = 0.0, 0.0, 0.0
    while events:
        t, n = heapq.heappop(events)
        if t > duration:
            break
        while t >= next_plan:  # the global scheduler wakes up
            candidate = planner(stats)
            secs_per_remote = cost.remote_expert_s - cost.local_expert_s
            horizon_calls = sum(s.sum() for s in stats) / max(next_plan, 1e-9) * (replan or 1)
            scale = secs_per_remote * horizon_calls / max(1.0, sum(s.sum() for s in stats))
            c_old = remote_cost(placement, stats) * scale
            c_new = remote_cost(candidate, stats) * scale
            mig = migration_seconds(placement, candidate, servers, expert_size)
            if should_adopt(c_new, mig, c_old):
                for m in range(n_servers):
                    changed = any(
                        a != b for a, b in zip(placement.gpus[m], candidate.gpus[m], strict=True)
                    )
                    if changed:
                        blocked_until[m] = max(blocked_until[m], next_plan) + mig / n_servers
                placement = candidate
                local_sets = [placement.layer_sets(m, shape.layers) for m in range(n_servers)]
                result.migrations.append(next_plan)
            next_plan += replan or math.inf
        heapq.heappush(events, (t + rng.exponential(arrival_s), n))
        start = max(t, free_at[n], blocked_until[n])
        busy = 0.0
        d = dist(n, t)
        for _ in range(tokens):
            sel = sample_token(d, shape.top_k, rng)
            np.add.at(stats[n], (np.arange(shape.layers)[:, None], sel), 1.0)
            for layer in range(shape.layers):
                here = local_sets[n][layer]
                remote = sum(1 for e in sel[layer] if e not in here)
                win_local += shape.top_k - remote
                win_total += shape.top_k
                # Local experts run in parallel on the GPU; remote calls share the link
                # one after another, so a layer slows with its remote share (Fig. 5).
                busy += cost.local_expert_s + remote * (cost.remote_expert_s - cost.local_expert_s)
        free_at[n] = start + busy
        result.latency[n].append(free_at[n] - t)
        result.arrivals[n].append(t)
        if t - win_start >= window:
            result.local.append((t, win_local / max(1.0, win_total)))
            win_local = win_total = 0.0
            win_start = t
    return result
