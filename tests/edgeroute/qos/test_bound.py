"""The contention-free bound: exact for a request alone, never passed by a policy in a
contended episode, and not reached there either."""

from __future__ import annotations

import math
import random

from edgeroute.qos.bound import best_alone, contention_free
from edgeroute.qos.evaluate import Policy, episode, episode_qos, round_robin, shortest_queue
from edgeroute.sim.edge import EdgeEnv, EdgeExpert, Task
from edgeroute.sim.timeline import alone_latency

FAST = EdgeExpert("a", base=0.012, k1=0.0001, k2=0.00002, memory_tokens=20_000, running_cap=8)
MID = EdgeExpert("b", base=0.018, k1=0.00005, k2=0.00001, memory_tokens=20_000, running_cap=8)
SLOW = EdgeExpert("c", base=0.026, k1=0.00002, k2=0.000005, memory_tokens=20_000, running_cap=8)


def _tasks(k: int = 12) -> list[Task]:
    """Prompts of several sizes (long enough for cached blocks) whose answers differ in
    score and length from model to model."""
    rng = random.Random(7)
    return [
        Task(
            f"task {i} " + "lorem ipsum " * (30 + 40 * i),
            rng.randint(20, 600),
            {m: round(rng.random(), 2) for m in "abc"},
            {m: rng.randint(1, 120) for m in "abc"},
        )
        for i in range(k)
    ]


def _env(experts: list[EdgeExpert], rate: float, cache: bool = False, seed: int = 3) -> EdgeEnv:
    return EdgeEnv(experts, _tasks(), rate=rate, seed=seed, episode_len=60, prefix_cache=cache)


def first_only(n: int) -> Policy:
    """Route the first arrival to expert n, drop every later one: it runs alone."""

    def act(env: EdgeEnv, i: int) -> int:
        return n if i == 0 else 0

    return act


def test_a_request_alone_takes_exactly_its_alone_latency() -> None:
    for seed in range(8):
        for n, spec in enumerate((FAST, MID, SLOW), start=1):
            env = _env([FAST, MID, SLOW], rate=5.0, seed=seed)
            (routed,) = episode(env, first_only(n), seed)
            req = routed.req
            simulated = req.latency_per_token(req.done_at)
            assert math.isclose(
                simulated,
                alone_latency(spec, req.prompt_tokens, req.length, cached=False),
                rel_tol=1e-12,
            )


def test_a_prompt_the_expert_has_cached_is_no_faster_than_the_bound_assumes() -> None:
    """The same prompt twice on one expert with a prefix cache, the second after the
    first has finished: it skips cached blocks, so it is faster than uncached, and no
    faster than a prefill of one token."""
    task = _tasks()[5]
    env = EdgeEnv([FAST], [task], rate=0.5, seed=1, episode_len=4, prefix_cache=True)
    routed = episode(env, lambda env, i: 1 if i in (0, 3) else 0, 1)
    first, second = (r.req for r in routed)
    assert first.done_at < second.arrival  # the second ran alone
    assert env.experts[0].skipped_total > 0
    latency = second.latency_per_token(second.done_at)
    assert latency < alone_latency(FAST, task.prompt_tokens, second.length, cached=False)
    assert latency >= alone_latency(FAST, task.prompt_tokens, second.length, cached=True)


def recording(policy: Policy, bounds: dict[int, float]) -> Policy:
    """`policy`, noting the arrival's bound at each decision."""

    def act(env: EdgeEnv, i: int) -> int:
        bounds[i] = best_alone(env)[0]
        return policy(env, i)

    return act


def test_no_policy_passes_the_bound_request_by_request_or_on_the_episode() -> None:
    """A contended world (lambda 4/s on three experts, where RR and SQF score 0.4-0.5),
    with and without a prefix cache: under every policy, each request's QoS is at most
    its bound, and the episode's mean QoS at most the bound's; contention keeps every
    policy below it."""
    rng = random.Random(11)
    policies: dict[str, Policy] = {
        "RR": round_robin,
        "SQF": shortest_queue,
        "fast": lambda env, i: 1,
        "random": lambda env, i: rng.randint(1, 3),
    }
    for cache in (False, True):
        bound = contention_free(_env([FAST, MID, SLOW], 4.0, cache), [3]).qos
        assert bound > 0
        for name, policy in policies.items():
            env = _env([FAST, MID, SLOW], 4.0, cache)
            bounds: dict[int, float] = {}
            routed = episode(env, recording(policy, bounds), 3)
            assert any(env.qos(r.req) > 0 for r in routed), name
            for r in routed:
                assert env.qos(r.req) <= bounds[r.decision], (name, cache, r.decision)
            assert episode_qos(env) < bound, (name, cache)


def test_the_bound_is_the_same_whatever_the_episode_is_routed_by() -> None:
    """The arrivals do not depend on the routing: the bounds noted while a policy
    routes are those `contention_free` averages."""
    bounds: dict[int, float] = {}
    episode(_env([FAST, MID, SLOW], 30.0), recording(shortest_queue, bounds), 3)
    figure = contention_free(_env([FAST, MID, SLOW], 30.0), [3])
    assert math.isclose(figure.qos, sum(bounds.values()) / len(bounds), rel_tol=1e-12)
    assert 0 <= figure.drop_rate < 1
