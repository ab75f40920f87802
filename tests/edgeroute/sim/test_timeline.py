"""An expert's future with no arrivals, against the simulator running that future, and
the counterfactual impact against the two worlds it compares."""

from __future__ import annotations

import random

import pytest

from edgeroute.sim.edge import EdgeEnv, EdgeExpert, Req, Task
from edgeroute.sim.timeline import Job, finish_times
from tests.edgeroute.sim.test_edge import MODEL, env_with

FAR = 1e6  # an arrival this late lets every request finish first


def tasks(rng: random.Random, k: int) -> list[Task]:
    return [
        Task(f"p{i}", rng.randint(5, 400), {MODEL: rng.random()}, {MODEL: rng.randint(1, 120)})
        for i in range(k)
    ]


def jobs_of(env: EdgeEnv) -> tuple[list[Req], list[Job], list[Job], list[Job]]:
    e = env.experts[0]
    reqs = [*e.running, *e.fresh, *e.waiting]
    jobs = [Job(i, r.prompt_tokens, r.generated, r.length) for i, r in enumerate(reqs)]
    a, b = len(e.running), len(e.running) + len(e.fresh)
    return reqs, jobs[:a], jobs[a:b], jobs[b:]


@pytest.mark.parametrize("seed", range(12))
def test_finish_times_are_the_simulators_own(seed: int) -> None:
    """Random queues (tight memory, a small batch cap, prompts and lengths of all
    sizes): the jumps between batch changes land where the simulator's iterations do."""
    rng = random.Random(seed)
    expert = EdgeExpert(
        MODEL,
        base=rng.uniform(0.005, 0.03),
        k1=rng.uniform(1e-5, 3e-4),
        k2=rng.uniform(1e-6, 2e-5),
        memory_tokens=rng.choice((600, 1500, 10_000)),
        running_cap=rng.choice((1, 3, 5)),
        waiting_cap=1000,
    )
    times = sorted(rng.uniform(0, 2.0) for _ in range(rng.randint(1, 14)))
    env = env_with(expert, tasks(rng, 30), [*times, FAR])
    for _ in range(len(times) - 1):
        env.step(1)
    # The last arrival: predict the future with it, then let the simulator run it.
    reqs, running, fresh, waiting = jobs_of(env)
    e = env.experts[0]
    new = Job(len(reqs), env.task.prompt_tokens, 0, env.task.lengths[MODEL])
    want = finish_times(expert, running, fresh, [*waiting, new], e.clock, env.now)
    env.step(1)
    (last,) = [r for r in env.finished if r not in reqs and r.arrival == times[-1]]
    for i, r in enumerate([*reqs, last]):
        assert r.done_at == pytest.approx(want[i], rel=1e-9, abs=1e-12)
    assert len(want) == len(reqs) + 1


def test_an_idle_expert_starts_at_once() -> None:
    spec = EdgeExpert(MODEL, base=0.01, k1=0.001, k2=0.0, memory_tokens=1000)
    done = finish_times(spec, [], [], [Job(0, 10, 0, 3)], clock=0.0, now=2.0)
    # prefill 0.01 + 0.01 (1st token), then two decode iterations of 0.01
    assert done == {0: pytest.approx(2.0 + 0.02 + 0.02)}
    assert finish_times(spec, [], [], [], clock=0.0, now=2.0) == {}


def arrived(r: Req) -> float:
    return r.arrival


def test_counterfactual_impact_is_what_the_other_requests_lose() -> None:
    """Two worlds from the same state: the arrival routed, or dropped. The impact is the
    QoS the requests already there have in the second and not in the first."""
    rng = random.Random(7)
    expert = EdgeExpert(MODEL, base=0.01, k1=2e-4, k2=2e-5, memory_tokens=10_000)
    pool = tasks(rng, 40)
    times = [0.0, 0.02, 0.04, 0.06, FAR]
    seen = set()
    for latency in (0.012, 0.015, 0.02, 0.03, 0.05):
        routed = env_with(expert, pool, times, latency_req=latency, impact="counterfactual")
        dropped = env_with(expert, pool, times, latency_req=latency)
        for env in (routed, dropped):
            for _ in range(3):
                env.step(1)
        (before, *_) = jobs_of(routed)
        routed.step(1)
        dropped.step(0)
        others = sorted((r for r in routed.finished if r.arrival < times[3]), key=arrived)
        twins = sorted((r for r in dropped.finished if r.arrival < times[3]), key=arrived)
        assert len(others) == len(twins) == len(before) == 3
        lost = sum(dropped.qos(b) - routed.qos(a) for a, b in zip(others, twins, strict=True))
        assert routed.last_penalty == pytest.approx(lost)
        seen.add(round(lost, 6))
    assert len(seen) > 1 and max(seen) > 0  # some L makes the arrival cost the others QoS, some not
