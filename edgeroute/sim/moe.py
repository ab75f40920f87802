"""Collaborative MoE inference on heterogeneous edge servers (the Prism paper, section IV),
with the contention that makes load balancing matter.

Each server receives its own Poisson stream of requests and decodes them one at a time,
token by token and layer by layer. A token's experts at a layer come from the server's
`Source`: drawn from per-layer distributions (`Drawn`, synthetic) or replayed from real
per-token selections (`Replayed`, Mixtral's records in `moe_routing/`).

Every expert computation is a job on the GPU that holds it, and GPUs serve jobs first
come, first served, so a GPU that hosts popular experts for the whole cluster becomes a
queue. A layer's local experts run together as one job on each local GPU that holds
some of them. Each expert the server does not hold is a remote call, issued one after
another: the activations go out on the caller's link and back on the host's (each link
carries one transfer at a time), on the host, the call's activations are staged
onto the GPU (`remote_load_s`, latency that does not hold the GPU) and the expert
then waits for the GPU and computes. Of several copies, a call goes to the one whose GPU frees first (the
dispatch EPLB's replicas assume). Times are booked when a layer starts, so a call can
hold a GPU slot a few milliseconds ahead of a job booked after it; a named
simplification.

A placement is planned from the activations seen during a warm-up; with `replan` set,
the global scheduler re-plans every `replan` seconds from the activations seen since
its last plan and migrates only when eq. 4 holds, with eq. 2's costs scaled to the
calls observed per second over the horizon; while a
migration runs (eq. 3's time), the servers it changes start no request and their GPUs
take no job.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from policies.prism import Placement, Server, migration_seconds, remote_cost, should_adopt
from workers.moe import CostModel, MoEShape, sample_token

Planner = Callable[[Sequence[np.ndarray]], Placement]


class Source(Protocol):
    def tokens(self, t: float, count: int, rng: np.random.Generator) -> np.ndarray:
        """[count, layers, top_k] expert ids for `count` consecutive tokens at time t."""
        ...


@dataclass(frozen=True)
class Drawn:
    """Synthetic: per-layer distributions, each token drawn independently; phase i of
    `phases` applies from i * duration / len(phases) on."""

    phases: tuple[np.ndarray, ...]
    top_k: int
    duration: float = math.inf

    def tokens(self, t: float, count: int, rng: np.random.Generator) -> np.ndarray:
        i = 0 if math.isinf(self.duration) else int(t / (self.duration / len(self.phases)))
        dist = self.phases[min(len(self.phases) - 1, i)]
        return np.stack([sample_token(dist, self.top_k, rng) for _ in range(count)])


@dataclass(frozen=True)
class Replayed:
    """Real: consecutive tokens of a recorded sequence, from a random problem and
    offset (wrapping round at its end)."""

    sequences: tuple[np.ndarray, ...]

    def tokens(self, t: float, count: int, rng: np.random.Generator) -> np.ndarray:
        seq = self.sequences[int(rng.integers(len(self.sequences)))]
        start = int(rng.integers(len(seq)))
        return seq[(start + np.arange(count)) % len(seq)]


@dataclass
class Result:
    latency: list[list[float]] = field(default_factory=list)  # per server: request latencies
    arrivals: list[list[float]] = field(default_factory=list)  # per server: when each came
    local: list[tuple[float, float]] = field(default_factory=list)  # (time, local share)
    migrations: list[float] = field(default_factory=list)
    gpu_busy: dict[tuple[int, int], float] = field(default_factory=dict)  # seconds of work


@dataclass
class _Request:
    arrival: float
    selections: np.ndarray  # [tokens, layers, top_k]
    token: int = 0
    layer: int = 0


class _Cluster:
    """The GPUs and links, and where each expert lives."""

    def __init__(self, servers: Sequence[Server], cost: CostModel) -> None:
        self.cost = cost
        self.transfer = cost.hidden_bytes * 8 / cost.bandwidth_bps
        self.gpu_free = {
            (n, g): 0.0 for n, s in enumerate(servers) for g in range(len(s.gpu_memory))
        }
        self.gpu_busy = dict.fromkeys(self.gpu_free, 0.0)
        self.link_free = [0.0] * len(servers)
        self.holders: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def place(self, placement: Placement) -> None:
        self.holders = {}
        for n, gpus in enumerate(placement.gpus):
            for g, experts in enumerate(gpus):
                for ex in experts:
                    self.holders.setdefault(ex, []).append((n, g))

    def _job(self, gpu: tuple[int, int], ready: float, seconds: float) -> float:
        start = max(ready, self.gpu_free[gpu])
        self.gpu_free[gpu] = start + seconds
        self.gpu_busy[gpu] += seconds
        return start + seconds

    def layer(self, n: int, layer: int, experts: Sequence[int], t: float) -> tuple[float, int]:
        """Run one token's layer on server n from time t: (end time, remote calls)."""
        c = self.cost
        local: dict[int, int] = {}
        remote: list[list[tuple[int, int]]] = []
        for e in experts:
            where = self.holders.get((layer, int(e)))
            if not where:
                raise ValueError(f"expert {(layer, int(e))} is placed nowhere")
            mine = [h for h in where if h[0] == n]
            if mine:
                g = min(mine, key=self.gpu_free.__getitem__)[1]
                local[g] = local.get(g, 0) + 1
            else:
                remote.append(where)
        end = t
        for g in local:
            end = max(end, self._job((n, g), t, c.local_expert_s))
        call = t
        for where in remote:
            host = min(where, key=self.gpu_free.__getitem__)
            sent = max(call, self.link_free[n])
            self.link_free[n] = sent + self.transfer
            arrived = sent + self.transfer + c.rtt_s / 2
            computed = self._job(host, arrived + c.remote_load_s, c.local_expert_s)
            back = max(computed, self.link_free[host[0]])
            self.link_free[host[0]] = back + self.transfer
            call = back + self.transfer + c.rtt_s / 2
        return max(end, call), len(remote)

    def hold(self, n: int, until: float) -> None:
        for gpu in self.gpu_free:
            if gpu[0] == n:
                self.gpu_free[gpu] = max(self.gpu_free[gpu], until)


def simulate(
    servers: Sequence[Server],
    shape: MoEShape,
    sources: Sequence[Source],
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
    """Server n's tokens come from `sources[n]`."""
    rng = np.random.default_rng(seed)
    n_servers = len(servers)
    rows = np.arange(shape.layers)[:, None]
    stats = [np.zeros((shape.layers, shape.experts)) for _ in servers]
    for n in range(n_servers):  # the history the first plan is made from
        for sel in sources[n].tokens(0.0, warmup_tokens, rng):
            np.add.at(stats[n], (rows, sel), 1.0)
    cluster = _Cluster(servers, cost)
    placement = planner(stats)
    cluster.place(placement)
    recent = [np.zeros_like(f) for f in stats]  # the calls seen since the last plan
    window_start = 0.0
    result = Result(latency=[[] for _ in servers], arrivals=[[] for _ in servers])
    ARRIVE, STEP = 0, 1
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, server)
    order = 0

    def push(t: float, kind: int, n: int) -> None:
        nonlocal order
        heapq.heappush(events, (t, order, kind, n))
        order += 1

    for n in range(n_servers):
        push(rng.exponential(arrival_s), ARRIVE, n)
    queues: list[deque[_Request]] = [deque() for _ in servers]
    active: list[_Request | None] = [None] * n_servers
    blocked_until = [0.0] * n_servers
    next_plan = replan if replan else math.inf
    win_local, win_total, win_start = 0.0, 0.0, 0.0
    while events:
        t, _, kind, n = heapq.heappop(events)
        if t > duration:
            break
        while t >= next_plan:  # the global scheduler wakes up
            # Eq. 4 over the next `replan` seconds, from the calls seen since the last
            # plan (as the gateway's scheduler does): remote calls per second under each
            # placement x the horizon x what a remote call costs over a local one.
            candidate = planner(recent)
            per_call = (cost.remote_expert_s - cost.local_expert_s) * (replan or 1.0)
            per_call /= max(1e-9, next_plan - window_start)
            c_old = remote_cost(placement, recent) * per_call
            c_new = remote_cost(candidate, recent) * per_call
            mig = migration_seconds(placement, candidate, servers, expert_size)
            if should_adopt(c_new, mig, c_old):
                for m in range(n_servers):
                    if placement.gpus[m] != candidate.gpus[m]:
                        blocked_until[m] = max(blocked_until[m], next_plan) + mig / n_servers
                        cluster.hold(m, blocked_until[m])
                placement = candidate
                cluster.place(placement)
                result.migrations.append(next_plan)
            recent = [np.zeros_like(f) for f in recent]
            window_start = next_plan
            next_plan += replan or math.inf
        if kind == ARRIVE:
            push(t + rng.exponential(arrival_s), ARRIVE, n)
            queues[n].append(_Request(t, sources[n].tokens(t, tokens, rng)))
            if active[n] is None:
                active[n] = queues[n].popleft()
                push(max(t, blocked_until[n]), STEP, n)
            continue
        req = active[n]
        assert req is not None
        if req.layer == 0:
            np.add.at(recent[n], (rows, req.selections[req.token]), 1.0)
        end, remote = cluster.layer(n, req.layer, req.selections[req.token, req.layer], t)
        win_local += shape.top_k - remote
        win_total += shape.top_k
        req.layer += 1
        if req.layer == shape.layers:
            req.layer, req.token = 0, req.token + 1
        if req.token < len(req.selections):
            push(end, STEP, n)
        else:
            result.latency[n].append(end - req.arrival)
            result.arrivals[n].append(req.arrival)
            active[n] = queues[n].popleft() if queues[n] else None
            if active[n] is not None:
                push(max(end, blocked_until[n]), STEP, n)
        if t - win_start >= window:
            result.local.append((t, win_local / max(1.0, win_total)))
            win_local = win_total = 0.0
            win_start = t
    result.gpu_busy = dict(cluster.gpu_busy)
    return result
