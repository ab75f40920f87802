"""An expert's future with no arrivals, against the simulator running that future, and
the counterfactual impact against the two worlds it compares."""

from __future__ import annotations

import itertools
import math
import random
from collections import deque

import pytest

from edgeroute.sim.edge import (
    Arrival,
    EdgeEnv,
    EdgeExpert,
    NoisyOracle,
    Queued,
    Req,
    Task,
    engine_experts,
)
from edgeroute.sim.timeline import Job, finish_times
from tests.edgeroute.sim.test_edge import MODEL, env_with
from workers.engine import Engine, EngineStats, Sequence
from workers.profiles import EXPERTS, PROFILES

FAR = 1e6  # an arrival this late lets every request finish first


def tasks(rng: random.Random, k: int) -> list[Task]:
    return [
        Task(f"p{i}", rng.randint(5, 400), {MODEL: rng.random()}, {MODEL: rng.randint(1, 120)})
        for i in range(k)
    ]


def random_expert(rng: random.Random) -> EdgeExpert:
    """Tight memory or not, a small batch cap, iteration constants of all sizes."""
    return EdgeExpert(
        MODEL,
        base=rng.uniform(0.005, 0.03),
        k1=rng.uniform(1e-5, 3e-4),
        k2=rng.uniform(1e-6, 2e-5),
        memory_tokens=rng.choice((600, 1500, 10_000)),
        running_cap=rng.choice((1, 3, 5)),
        waiting_cap=1000,
    )


@pytest.mark.parametrize("seed", range(12))
def test_finish_times_are_the_simulators_own(seed: int) -> None:
    """Random queues (tight memory, a small batch cap, prompts and lengths of all
    sizes): the jumps between batch changes land where the simulator's iterations do."""
    rng = random.Random(seed)
    expert = random_expert(rng)
    times = sorted(rng.uniform(0, 2.0) for _ in range(rng.randint(1, 14)))
    env = env_with(expert, tasks(rng, 30), [*times, FAR])
    for _ in range(len(times) - 1):
        env.step(1)
    # The last arrival: predict the future with it, then let the simulator run it.
    found = Queued.of(env.experts[0], env.now)
    reqs = found.requests
    new = Job(len(reqs), env.task.prompt_tokens, 0, env.task.lengths[MODEL])
    want = finish_times(
        expert, found.running, found.fresh, [*found.waiting, new], found.clock, found.now
    )
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
        before = Queued.of(routed.experts[0], routed.now).requests
        routed.step(1)
        dropped.step(0)
        others = sorted((r for r in routed.finished if r.arrival < times[3]), key=arrived)
        twins = sorted((r for r in dropped.finished if r.arrival < times[3]), key=arrived)
        assert len(others) == len(twins) == len(before) == 3
        lost = sum(dropped.qos(b) - routed.qos(a) for a, b in zip(others, twins, strict=True))
        assert routed.last_penalty == pytest.approx(lost)
        seen.add(round(lost, 6))
    assert len(seen) > 1 and max(seen) > 0  # some L makes the arrival cost the others QoS, some not


def test_the_impact_room_is_what_weighing_the_others_loss_gains() -> None:
    """Two experts, one the faster: the room, read before the last arrival is routed,
    against the worlds where it goes to each (its own QoS less what the others there
    lose to it, as in the world where it is dropped), run to the end."""
    experts = [
        EdgeExpert(MODEL, base=0.008, k1=2e-4, k2=2e-5, memory_tokens=10_000),
        EdgeExpert(MODEL, base=0.012, k1=2e-4, k2=2e-5, memory_tokens=10_000),
    ]
    times = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, FAR]
    first = [1, 2, 1, 2, 1]  # the earlier arrivals, alternating
    rooms = set()
    for seed in (9, 10, 11):
        pool = tasks(random.Random(seed), 40)
        for latency in (0.012, 0.015, 0.02, 0.03, 0.05):
            rooms.add(_room_against_its_worlds(experts, pool, times, first, latency))
    # some L gives the impact room to change the choice, some none
    assert 0.0 in rooms and max(rooms) > 0


def _room_against_its_worlds(
    experts: list[EdgeExpert],
    pool: list[Task],
    times: list[float],
    first: list[int],
    latency: float,
) -> float:
    """`impact_room` before the last arrival, checked against the worlds where it is
    dropped (action 0) and routed to each expert, every one run to the end."""

    def world(last: int | None) -> EdgeEnv:
        env = EdgeEnv(
            experts,
            pool,
            arrivals=iter(Arrival(t) for t in times),
            predictor=NoisyOracle(1.0, 1.0),
            latency_req=latency,
        )
        for action in first:
            env.step(action)
        if last is not None:
            env.step(last)
        return env

    dropped = world(0)
    alone = {r.arrival: dropped.qos(r) for r in dropped.finished}
    at = world(None)
    room = at.impact_room(at.options())
    totals, owns = [], []
    for n in range(len(experts)):
        routed = world(n + 1)
        here = {r.arrival for r in Queued.of(at.experts[n], at.now).requests}
        (new,) = [r for r in routed.finished if r.arrival == times[len(first)]]
        others = [r for r in routed.finished if r.arrival in here]
        assert len(others) == len(here)
        owns.append(routed.qos(new))
        totals.append(routed.qos(new) - sum(alone[r.arrival] - routed.qos(r) for r in others))
    best = max(owns)
    want = max(totals) - max(t for t, o in zip(totals, owns, strict=True) if o == best)
    assert room == pytest.approx(want, abs=1e-9)
    return round(room, 6)


def test_the_hindsight_room_is_what_weighing_the_later_arrivals_loss_gains() -> None:
    """Two experts; an arrival, then later ones routed as the trajectory routed them:
    the hindsight room against the worlds where the arrival goes to each expert (and
    where it is dropped), with the requests routed there while it would run, every
    world run to the end."""
    # batches of 5, and one request at a time, where a backlog carries the arrival's
    # cost past its own finish (so which later arrivals count matters)
    fleets = [
        [
            EdgeExpert(MODEL, base=base, k1=2e-4, k2=2e-5, memory_tokens=10_000, running_cap=cap)
            for base in (0.008, 0.012)
        ]
        for cap in (5, 1)
    ]
    first = [1, 2, 1, 2]  # routed before the arrival
    after = [1, 1, 2, 1, 2, 1, 1]  # routed after it, whatever it did
    # the later ones close behind it, then spread out: some come after it would finish
    times = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.1, 0.3, 0.6, 1.2, 2.5, FAR]
    rooms, myopic = set(), set()
    for experts in fleets:
        for seed in (3, 4, 5, 6, 12):
            pool = tasks(random.Random(seed), 40)
            for latency in (0.012, 0.015, 0.02, 0.03):
                room, without_later = _hindsight_room_against_its_worlds(
                    experts, pool, times, first, after, latency
                )
                rooms.add(room)
                myopic.add(without_later)
    # some L gives the room, some none; the later arrivals change it somewhere
    assert 0.0 in rooms and max(rooms) > 0
    assert rooms != myopic


def _hindsight_room_against_its_worlds(
    experts: list[EdgeExpert],
    pool: list[Task],
    times: list[float],
    first: list[int],
    after: list[int],
    latency: float,
) -> tuple[float, float]:
    """`hindsight_room` of the arrival after `first`, checked against run worlds; and
    its `impact_room` (nothing more arriving), for comparison."""
    k = len(first)

    def fresh() -> EdgeEnv:
        return EdgeEnv(
            experts,
            pool,
            arrivals=iter(Arrival(t) for t in times),
            predictor=NoisyOracle(1.0, 1.0),
            latency_req=latency,
            impact="hindsight",
            reward="qos",
        )

    def world(last: int, later: list[int]) -> EdgeEnv:
        env = fresh()
        for action in [*first, last, *later]:
            env.step(action)
        env.drain()
        return env

    def qos(env: EdgeEnv) -> dict[float, float]:
        return {r.arrival: env.qos(r) for r in env.finished}

    # the trajectory: the arrival to expert 1, the later ones as `after` says
    env = fresh()
    for action in first:
        env.step(action)
    options = env.options()
    here = {
        n: {r.arrival for r in Queued.of(e, env.now).requests} for n, e in enumerate(env.experts)
    }
    myopic = env.impact_room(options)
    env.step(1)
    routed = env.last_request
    for action in after:
        env.step(action)
    env.drain()
    room = env.hindsight_room(options, routed)

    arrival = times[k]
    outcomes = []
    for n in range(len(experts)):
        # the later arrivals on n that come before the arrival would finish there
        window: list[int] = []
        while True:
            kept = [a if i in window else 0 for i, a in enumerate(after)]
            there = world(n + 1, kept)
            routed_there = qos(there)
            done = next(r.done_at for r in there.finished if r.arrival == arrival)
            wider = [i for i, a in enumerate(after) if a == n + 1 and times[k + 1 + i] < done]
            if len(wider) <= len(window):
                break
            window = wider
        alone = qos(world(0, kept))
        others = here[n] | {times[k + 1 + i] for i in window}
        lost = sum(alone[t] - routed_there[t] for t in others)
        outcomes.append((lost, routed_there[arrival]))
    best = max(own for _, own in outcomes)
    want = max(own - lost for lost, own in outcomes) - max(
        own - lost for lost, own in outcomes if own == best
    )
    assert room == pytest.approx(want, abs=1e-9)
    return round(room, 6), round(myopic, 6)


@pytest.mark.parametrize("seed", range(12))
def test_finish_times_with_arrivals_are_the_simulators_own(seed: int) -> None:
    """The expert as one arrival found it, and the arrivals after it at their times:
    every request finishes when the simulator's run of that future finishes it, through
    arrivals that wait for an iteration's end and arrivals that find the expert idle."""
    rng = random.Random(100 + seed)
    expert = random_expert(rng)
    times = sorted(rng.uniform(0, 3.0) for _ in range(rng.randint(4, 20)))
    env = env_with(expert, tasks(rng, 30), [*times, FAR])
    k = rng.randrange(len(times))
    for _ in range(k):
        env.step(1)
    found = Queued.of(env.experts[0], env.now)
    new = Job(len(found.requests), env.task.prompt_tokens, 0, env.task.lengths[MODEL])
    for _ in range(k, len(times)):
        env.step(1)
    env.drain()
    routed = sorted(env.finished, key=arrived)
    assert [r.arrival for r in routed] == times
    later = routed[k + 1 :]
    arrivals = [
        (r.arrival, Job(len(found.requests) + 1 + i, r.prompt_tokens, 0, r.length))
        for i, r in enumerate(later)
    ]
    want = finish_times(
        expert, found.running, found.fresh, [*found.waiting, new], found.clock, found.now, arrivals
    )
    for i, r in enumerate([*found.requests, routed[k], *later]):
        assert r.done_at == pytest.approx(want[i], rel=1e-9, abs=1e-12)
    assert len(want) == len(found.requests) + 1 + len(later)


def test_hindsight_impact_is_what_the_others_lose_arrivals_included() -> None:
    """Two worlds from the same state, with the same later arrivals routed to the same
    expert: the arrival routed, or dropped. Its hindsight impact is the QoS the others
    (there when it came, and those that came while it ran) have in the second and not
    in the first, and it sees what the counterfactual with no arrivals cannot."""
    rng = random.Random(11)
    expert = EdgeExpert(MODEL, base=0.01, k1=2e-4, k2=2e-5, memory_tokens=10_000)
    pool = [
        Task(f"p{i}", rng.randint(5, 400), {MODEL: rng.random()}, {MODEL: rng.randint(20, 80)})
        for i in range(40)
    ]
    # the decision at 0.06; the arrivals after it come while its request runs (>= 0.2 s)
    times = [0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, FAR]
    seen, beyond = set(), 0
    for latency in (0.012, 0.015, 0.02, 0.025, 0.03, 0.05):
        routed = env_with(expert, pool, times, latency_req=latency, impact="hindsight")
        dropped = env_with(expert, pool, times, latency_req=latency)
        for env in (routed, dropped):
            for _ in range(3):
                env.step(1)
        cost_now = routed.counterfactual_impact(0, routed.request_for(0))
        routed.step(1)
        dropped.step(0)
        assert routed.last_penalty == 0.0  # known once its request has finished
        (mine,) = [r for r in routed.given[0] if r.arrival == times[3]]
        for env in (routed, dropped):
            for _ in range(3):
                env.step(1)
            env.drain()
        others = sorted((r for r in routed.finished if r is not mine), key=arrived)
        twins = sorted((r for r in dropped.finished if r.arrival != times[3]), key=arrived)
        assert [r.arrival for r in others] == [r.arrival for r in twins] == times[:3] + times[4:7]
        assert all(r.arrival < mine.done_at for r in others)
        lost = sum(dropped.qos(b) - routed.qos(a) for a, b in zip(others, twins, strict=True))
        assert routed.hindsight_impact(mine) == pytest.approx(lost)
        seen.add(round(lost, 6))
        beyond += round(lost, 6) != round(cost_now, 6)
    assert len(seen) > 1 and max(seen) > 0
    assert beyond > 0  # the arrivals it delayed count too


def test_a_loss_that_several_requests_each_caused_is_shared_among_them() -> None:
    """One request at a time, three arriving together: the third meets L behind either
    of the others but not behind both, so the absence of each of the first two alone
    would have saved it. The hindsight impact charges its loss to both; shared, each
    pays half, and the charges add up to the QoS the three lost to one another."""
    expert = EdgeExpert(
        MODEL, base=0.01, k1=2e-4, k2=2e-5, memory_tokens=10_000, running_cap=1, waiting_cap=10
    )
    pool = [Task("p", 50, {MODEL: 0.8}, {MODEL: 10})]
    times = [0.0, 0.001, 0.002, FAR]

    def world(actions: list[int], latency: float) -> EdgeEnv:
        env = env_with(expert, pool, times, latency_req=latency, impact="shared")
        for action in actions:
            env.step(action)
        env.drain()
        return env

    def last_latency(env: EdgeEnv) -> float:
        last = max(env.finished, key=arrived)
        return last.latency_per_token(last.done_at)

    behind_one, behind_two = last_latency(world([0, 1, 1], 1.0)), last_latency(world([1] * 3, 1.0))
    assert behind_one < behind_two
    env = world([1] * 3, (behind_one + behind_two) / 2)
    first, second, third = sorted(env.given[0], key=arrived)
    assert [env.qos(r) for r in (first, second, third)] == [0.8, 0.8, 0.0]
    hindsight = [env.hindsight_impact(r) for r in (first, second, third)]
    assert hindsight == [pytest.approx(0.8), pytest.approx(0.8), 0.0]
    charges = env.hindsight_charges()
    assert [charges[r].hindsight for r in (first, second, third)] == hindsight
    shared = {r: c.shared for r, c in charges.items()}
    assert [shared[r] for r in (first, second, third)] == [
        pytest.approx(0.4),
        pytest.approx(0.4),
        0.0,
    ]
    assert sum(shared.values()) == pytest.approx(0.8)  # what the third lost, once


def test_a_hindsight_impact_waits_for_its_request_to_finish() -> None:
    expert = EdgeExpert(MODEL, base=0.01, k1=2e-4, k2=2e-5, memory_tokens=10_000)
    pool = [Task("p", 50, {MODEL: 1.0}, {MODEL: 30})]
    env = env_with(expert, pool, [0.0, 0.01, FAR], impact="hindsight")
    env.step(1)
    (first,) = env.given[0]
    assert not math.isfinite(first.done_at)
    with pytest.raises(ValueError, match="once it has finished"):
        env.hindsight_impact(first)


def engine_finish_times(
    profile_name: str, jobs: list[Job], arrivals: list[float] | None = None
) -> tuple[dict[int, float], EngineStats]:
    """The live workers' engine on `jobs`, stepped by hand on its own clock (each
    iteration lasts what its profile charges for it). Job k arrives at `arrivals[k]`
    (all at 0 without them): one that comes while an iteration runs waits for its end,
    one that finds the engine idle starts an iteration at once. With the engine's
    counters (its preemptions)."""
    profile = PROFILES[profile_name]
    engine = Engine(profile)
    seqs = [Sequence(str(j.key), j.prompt, j.length) for j in jobs]
    came = deque(zip(arrivals or [0.0] * len(seqs), seqs, strict=True))
    t, done = 0.0, {}
    while came or engine.running or engine.waiting:
        if not (engine.running or engine.waiting):
            t = max(t, came[0][0])
        while came and came[0][0] <= t:
            engine.submit(came.popleft()[1])
        plan = engine.schedule()
        t += profile.iteration_time(plan.prefill_tokens, plan.decode_context)
        engine.complete(plan, t)
        done.update({int(q.id): t for q in seqs if q.finished and int(q.id) not in done})
    return done, engine.stats


@pytest.mark.parametrize("seed", range(6))
def test_the_live_engines_finish_when_the_simulator_says(seed: int) -> None:
    """The same requests on one of `bench qos --live`'s engines and on that engine as the
    simulator's expert (`engine_experts`): each finishes at the same instant, while no
    iteration's prefill passes the engine's token budget and its KV cache is far from
    full. The simulator's physics are the live engine's, not a model of the policy."""
    rng = random.Random(seed)
    i = rng.randrange(len(EXPERTS))
    budget = PROFILES[EXPERTS[i]].max_batched_tokens
    jobs: list[Job] = []
    prompts = 0
    while True:
        prompt = rng.randint(20, 800)
        if prompts + prompt > budget:
            break
        jobs.append(Job(len(jobs), prompt, 0, rng.randint(1, 300)))
        prompts += prompt
    want = finish_times(engine_experts()[i], [], [], jobs, 0.0, 0.0)
    got, _ = engine_finish_times(EXPERTS[i], jobs)
    assert len(jobs) > 3 and got.keys() == want.keys()
    assert all(math.isclose(got[k], want[k], rel_tol=1e-9) for k in want)


@pytest.mark.parametrize("seed", range(6))
def test_the_live_engines_finish_when_the_simulator_says_as_requests_arrive(seed: int) -> None:
    """The same, with the requests arriving as a Poisson stream, from light load (ten
    running at once at most) to heavy (up to 37, about twice L per token), nearly every
    one arriving mid-iteration: each finishes at the same instant on the live engine and
    on the simulator's expert, while no iteration's prefill passes the budget nor the KV
    cache fills."""
    rng = random.Random(seed)
    i = rng.randrange(len(EXPERTS))
    rate = rng.choice([1.0, 2.0, 4.0])
    jobs = [Job(k, rng.randint(20, 400), 0, rng.randint(1, 200)) for k in range(120)]
    times = list(itertools.accumulate(rng.expovariate(rate) for _ in jobs))
    want = finish_times(
        engine_experts()[i], [], [], [], 0.0, 0.0, arrivals=list(zip(times, jobs, strict=True))
    )
    got, engine = engine_finish_times(EXPERTS[i], jobs, times)
    assert engine.preemptions == 0  # the KV cache never filled
    assert got.keys() == want.keys() == {j.key for j in jobs}
    assert all(math.isclose(got[k], want[k], rel_tol=1e-9) for k in want)


def test_a_burst_past_the_prefill_budget_is_where_they_part() -> None:
    """Twenty 1,000-token prompts at once: the engine admits them over three iterations
    (8,192 prefill tokens each at most), the simulator in one. Its departure from the
    live engine is there, and under bursts only."""
    jobs = [Job(k, 1000, 0, 50) for k in range(20)]
    want = finish_times(engine_experts()[0], [], [], jobs, 0.0, 0.0)
    got, _ = engine_finish_times(EXPERTS[0], jobs)
    assert len(set(want.values())) == 1  # one batch, admitted together
    assert len(set(got.values())) == 3  # admitted over three iterations
