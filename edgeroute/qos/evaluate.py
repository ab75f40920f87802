"""Evaluation on the edge-expert simulator: average QoS (eq. 1, drops count as 0),
average latency per token of completed requests, and the drop rate.

`served` drives a gateway policy object (the `qos_drl` the gateway serves, or any
registered policy) through the same `ClusterView` the gateway builds
(`edgeroute.sim.edge.cluster_view`), so the policy under test is exactly the one that
serves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from edgeroute.sim.edge import EdgeEnv, Req, cluster_view
from edgeroute.sim.timeline import alone_latency
from policies.types import ClusterView, Decision, RequestInfo

Policy = Callable[[EdgeEnv, int], int]  # (env, decision index) -> action


class Routing(Protocol):
    def decide(self, req: RequestInfo, view: ClusterView) -> Decision: ...


def served(policy: Routing) -> Policy:
    """A gateway policy as a simulator policy: its choice, or drop when it sheds. A
    policy with a latency target (`latency`, seconds: `qos_drl` normalises its features
    by it) must have the environment's, or it would judge the experts by another L."""

    def act(env: EdgeEnv, i: int) -> int:
        target = getattr(policy, "latency", None)
        if target is not None and not math.isclose(target, env.L):
            raise ValueError(
                f"the policy targets L={target * 1e3:g} ms, the setting {env.L * 1e3:g}"
            )
        decision = policy.decide(*cluster_view(env, i))
        return 0 if decision.backend_id is None else 1 + int(decision.backend_id[1:])

    return act


def round_robin(env: EdgeEnv, i: int) -> int:
    return 1 + i % env.n


def queue_length(env: EdgeEnv, n: int) -> int:
    e = env.experts[n]
    return len(e.running) + len(e.fresh) + len(e.waiting)


def shortest_queue(env: EdgeEnv, i: int) -> int:
    return 1 + min(range(env.n), key=lambda n: queue_length(env, n))


def shortest_queue_by(score: Callable[[EdgeEnv, int], float]) -> Policy:
    """SQF whose ties among the shortest queues go to the expert with the best
    `score` of the arrived request."""

    def act(env: EdgeEnv, i: int) -> int:
        lengths = [queue_length(env, n) for n in range(env.n)]
        low = min(lengths)
        return 1 + max((n for n in range(env.n) if lengths[n] == low), key=lambda n: score(env, n))

    return act


# BR, the papers' BERT-router, is the gateway's `best_predicted` preset with the world's
# predictor (`edgeroute.qos.config.best_predicted`), driven through `served`.
BASELINES: dict[str, Policy] = {
    "RR": round_robin,
    "SQF": shortest_queue,
    # ties broken by the served predictor's score: quality-aware, as cheap as SQF
    "SQF+predicted": shortest_queue_by(lambda env, n: env.preds[n][0]),
}


def protective(cap: int) -> Policy:
    """Keep the experts that can meet L from overload: of those where the request, at
    its predicted length, would meet L alone (`timeline.alone_latency`) and which hold
    fewer than `cap` requests, the one of the best predicted score; when there is none,
    the slowest expert, where the request scores 0 as a dropped one would but takes no
    room from the others. It reads the experts' time constants, which no router has."""

    def act(env: EdgeEnv, i: int) -> int:
        room = [
            n
            for n, spec in enumerate(env.specs)
            if queue_length(env, n) < cap
            and alone_latency(spec, env.task.prompt_tokens, max(1, round(env.preds[n][1])), False)
            <= env.L
        ]
        if not room:
            return 1 + max(range(env.n), key=lambda n: env.specs[n].base)
        return 1 + max(room, key=lambda n: env.preds[n][0])

    return act


# Not contenders. SQF+truth reads each model's true score on the request, which no
# router has: what better predictions would be worth to the same rule. The protective
# rule reads the experts' time constants: what keeping the experts that can meet L
# from overload is worth (its cap of 2 picked on the Azure trace's first five windows
# of the engines' fleet, docs/research.md (207)).
REFERENCES: dict[str, Policy] = {
    "SQF+truth (reads the truth)": shortest_queue_by(
        lambda env, n: env.task.scores[env.specs[n].model]
    ),
    "protective, cap 2 (reads the profiles)": protective(2),
}


@dataclass(frozen=True)
class Score:
    qos: float
    latency_ms: float
    drop_rate: float


class Routed(NamedTuple):
    decision: int  # the decision's index in its episode
    expert: int
    req: Req


def episode(env: EdgeEnv, policy: Policy, seed: int) -> list[Routed]:
    """Run one episode of `env` from `seed` under `policy` to its end, every routed
    request finished; returns each routed request with its decision and its expert's
    index (drops and refusals are in `env.finished` and `env.dropped`, not here)."""
    env.reset(seed)
    routed = []
    done, i = False, 0
    while not done:
        action = policy(env, i)
        _, done = env.step(action)
        if env.last_request is not None:
            routed.append(Routed(i, action - 1, env.last_request))
        i += 1
    env.drain()
    return routed


def episode_qos(env: EdgeEnv) -> float:
    """The mean QoS of an episode run to its end (`episode`), per request that arrived:
    a dropped or refused request counts 0."""
    return sum(env.qos(r) for r in env.finished) / len(env.finished)


def evaluate(env: EdgeEnv, policy: Policy, seeds: list[int]) -> Score:
    qos, lat, drops = [], [], []
    for seed in seeds:
        episode(env, policy, seed)
        served = [r for r in env.finished if math.isfinite(r.done_at)]
        qos.append(episode_qos(env))
        lat.append(
            statistics.fmean(r.latency_per_token(r.done_at) for r in served) if served else math.nan
        )
        drops.append(env.dropped / len(env.finished))
    return Score(statistics.fmean(qos), statistics.fmean(lat) * 1e3, statistics.fmean(drops))
