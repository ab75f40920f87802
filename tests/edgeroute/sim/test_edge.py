"""The edge-expert environment against hand-computed timelines and the paper's equations."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeroute.sim.edge import (
    Arrival,
    EdgeEnv,
    EdgeExpert,
    Fleet,
    NoisyOracle,
    Task,
    bucket,
    cluster_view,
    engine_experts,
    engine_fleet,
    poisson_arrivals,
    trace_arrivals,
)
from edgeroute.sim.workload import read_azure
from tests.support import write_trace
from workers.profiles import EXPERTS, PROFILES
from workers.quality import ROUTERDC_MODELS

MODEL = "m"


def task(prompt: int = 100, length: int = 10, score: float = 1.0) -> Task:
    return Task("p", prompt, {MODEL: score}, {MODEL: length})


def env_with(expert: EdgeExpert, tasks: list[Task], times: list[float], **kw: Any) -> EdgeEnv:
    return EdgeEnv(
        [expert],
        tasks,
        arrivals=iter(Arrival(t) for t in times),
        predictor=NoisyOracle(1.0, 1.0),
        **kw,
    )


EXPERT = EdgeExpert(MODEL, base=0.01, k1=0.0001, k2=0.00001, memory_tokens=10_000)


def test_a_lone_request_follows_the_iteration_model() -> None:
    env = env_with(EXPERT, [task(100, 10)], [1.0, 100.0])
    env.step(1)  # routed at t=1, then the clock runs to the next arrival at t=100
    (r,) = env.finished
    # Prefill iteration: base + k1*100 = 0.02; then 9 decode iterations at base + k2*ctx.
    want = 0.02 + sum(0.01 + 0.00001 * (100 + g) for g in range(1, 10))
    assert r.done_at - r.arrival == pytest.approx(want)
    assert r.latency_per_token(r.done_at) == pytest.approx(want / 10)
    # The expert's measured seconds per token, as the gateway keeps it, and as the
    # policy sees it (in multiples of L).
    assert env.experts[0].token_latency == pytest.approx(want / 10)
    assert env.observe()["experts"][0, 5] == pytest.approx(want / 10 / env.L)


def test_qos_is_the_score_when_latency_meets_L_else_zero() -> None:
    fast = env_with(EXPERT, [task(100, 10, score=0.7)], [0.0, 50.0], latency_req=0.030)
    fast.step(1)
    assert fast.qos(fast.finished[0]) == 0.7
    slow = env_with(EXPERT, [task(100, 10, score=0.7)], [0.0, 50.0], latency_req=0.010)
    slow.step(1)
    assert slow.qos(slow.finished[0]) == 0.0


SPACED = [0.05 * i for i in range(12)]  # each arrival after the previous one's prefill


def test_queues_hold_five_running_and_five_waiting_then_refuse() -> None:
    env = env_with(EXPERT, [task(10, 200)], [*SPACED, 1e6])
    for _ in range(11):
        env.step(1)
    e = env.experts[0]
    assert len(e.running) + len(e.fresh) == 5 and len(e.waiting) == 5
    assert env.dropped == 1


def test_memory_blocks_admission_until_a_request_finishes() -> None:
    small = EdgeExpert(MODEL, base=0.01, k1=0.0, k2=0.0, memory_tokens=150)
    env = env_with(small, [task(100, 20)], [0.0, 0.0, 1e6])
    env.step(1)
    env.step(1)
    first, second = sorted(env.finished, key=lambda r: r.done_at)
    # The second (100 + 1 tokens) does not fit beside the first (up to 120): it waits.
    assert second.done_at >= first.done_at + 20 * 0.01 - 1e-9


def test_drop_scores_zero_and_counts() -> None:
    env = env_with(EXPERT, [task()], [0.0, 1.0])
    reward, _ = env.step(0)
    assert reward == 0.0 and env.dropped == 1 and env.finished[0].score == 0.0


def test_impact_penalty_is_eq_15() -> None:
    env = env_with(EXPERT, [task(100, 50, score=0.9)], [0.0, 0.05, 0.051, 1e6], latency_req=0.030)
    env.step(1)  # one running request
    env.step(1)
    (r,) = [r for r in env.experts[0].running]
    p_j, d_j = env.task.prompt_tokens, env.preds[0][1]
    d_i = max(r.generated + 1, r.pred_length)
    m = min(d_i - r.generated, d_j)
    extra = (EXPERT.k1 * p_j + EXPERT.k2 * (m * p_j + m * (m + 1) / 2)) / d_i
    step = EXPERT.base + EXPERT.k2 * r.tokens
    projected = ((env.now - r.arrival) + (d_i - r.generated) * step) / d_i
    crosses = projected + extra >= env.L
    assert env.estimated_impact(0) == (r.pred_score if crosses else 0.0)
    # A tighter L makes the same action costly.
    env.L = 1e-4
    assert env.estimated_impact(0) == pytest.approx(r.pred_score)
    # Read as "pushed over": a request already past L without the new one is not
    # counted; one the new request tips over still is.
    assert env.estimated_impact(0, pushed=True) == 0.0  # projected alone is far above 1e-4
    env.L = projected + extra / 2
    assert env.estimated_impact(0, pushed=True) == pytest.approx(r.pred_score)


def test_completion_reward_counts_only_completions() -> None:
    times = [0.0, 0.01, 0.02, 30.0, 60.0]
    q = env_with(EXPERT, [task(100, 30)], times, latency_req=1e-4, reward="qos")
    c = env_with(EXPERT, [task(100, 30)], times, latency_req=1e-4, reward="completion")
    for env in (q, c):
        env.step(1)
    assert q.step(1)[0] < 0  # penalised: the running request will miss L
    assert c.step(1)[0] == 0.0


def test_predictions_hit_the_configured_accuracy() -> None:
    rng = random.Random(0)
    t = task(100, 137, score=0.55)
    oracle = NoisyOracle(0.634, 0.73)
    hits = sum(
        bucket(oracle.predict(t, MODEL, rng)[0], 1.0) == bucket(0.55, 1.0) for _ in range(4000)
    )
    assert hits / 4000 == pytest.approx(0.634, abs=0.03)
    assert NoisyOracle(zero=True).predict(t, MODEL, rng) == (0.0, 0.0)


def test_poisson_arrivals_have_the_rate() -> None:
    gen = poisson_arrivals(5.0, random.Random(1))
    times = [next(gen).t for _ in range(5000)]
    assert 5000 / times[-1] == pytest.approx(5.0, rel=0.05)
    assert all(b > a for a, b in itertools.pairwise(times))


def test_observation_shapes_and_masks() -> None:
    env = env_with(EXPERT, [task(10, 200)], [*SPACED[:8], 1e6])
    for _ in range(7):
        env.step(1)
    obs = env.observe()
    assert obs["experts"].shape == (1, 6) and obs["queues"].shape == (1, 2, 5, 6)
    assert obs["queue_mask"][0, 0].sum() == 5 and obs["queue_mask"][0, 1].sum() == 2  # run, wait
    assert obs["experts"][0, 1] == pytest.approx(1.0)
    assert obs["experts"][0, 2] == pytest.approx(0.4)


def test_a_trace_arrival_brings_its_own_sizes() -> None:
    """The trace's context and generated tokens replace the prompt's, capped; the
    prompt's score and text stay."""
    arrivals = iter([Arrival(0.1, 900, 40), Arrival(0.2, 9000, 4000), Arrival(1e6)])
    env = EdgeEnv(
        [EXPERT], [task(100, 10, 0.7)], arrivals=arrivals, predictor=NoisyOracle(1.0, 1.0)
    )
    assert (env.task.prompt_tokens, env.task.lengths[MODEL]) == (900, 40)
    assert env.task.scores[MODEL] == 0.7 and env.task.prompt == "p"
    env.step(1)
    assert (env.task.prompt_tokens, env.task.lengths[MODEL]) == (1500, 300)  # capped
    env.step(1)
    assert (env.task.prompt_tokens, env.task.lengths[MODEL]) == (100, 10)  # no sizes: its own


def test_any_azure_format_file_gives_instants_and_sizes(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:48.6805900,396,109\n"
        "2023-11-16 18:15:50.6805900,12,3\n"
    )
    got = list(trace_arrivals(read_azure(trace)))
    assert [(a.prompt_tokens, a.output_tokens) for a in got] == [(374, 44), (396, 109), (12, 3)]
    assert [a.t for a in got] == pytest.approx([0.0, 2.0, 4.0])
    assert [a.t for a in trace_arrivals(read_azure(trace), rate=3.0)] == pytest.approx(
        [0.0, 0.5, 1.0]
    )


def test_a_trace_out_of_order_arrives_in_time_order(tmp_path: Path) -> None:
    """A file whose rows are not in time order (concatenated logs) still gives arrivals
    that never go back in time, each with its own sizes, and a window counts from the
    earliest request in it."""
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.6805900,12,3\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:48.6805900,396,109\n"
    )
    got = list(trace_arrivals(read_azure(trace)))
    assert [a.t for a in got] == pytest.approx([0.0, 2.0, 4.0])
    assert [(a.prompt_tokens, a.output_tokens) for a in got] == [(374, 44), (396, 109), (12, 3)]
    assert [a.t for a in trace_arrivals(read_azure(trace), start=1)] == pytest.approx([0.0, 2.0])


def test_an_episode_past_its_traces_end_says_so(tmp_path: Path) -> None:
    """An episode of E decisions on a trace reads E + 1 arrivals (one at the start,
    then the one after each decision); with one fewer it stops with an error that says
    what ran out, and a trace read from past its end is refused as such."""
    episode = 4
    trace = read_azure(write_trace(tmp_path / "trace.csv", episode + 1))
    assert len(trace) == episode + 1

    def run(start: int) -> None:
        env = EdgeEnv(
            [EXPERT],
            [task()],
            episode_len=episode,
            arrivals=trace_arrivals(trace, start=start),
            predictor=NoisyOracle(1.0, 1.0),
        )
        done = False
        while not done:
            _, done = env.step(1)

    run(0)
    with pytest.raises(ValueError, match="ran out at decision 4 of the episode's 4"):
        run(1)
    with pytest.raises(ValueError, match="holds no request from the 6-th on"):
        run(episode + 1)


def _token_times(prompt: int, length: int, expert: EdgeExpert = EXPERT) -> list[float]:
    """When each token of a lone request arriving at 0 is out (the iteration model)."""
    t = expert.base + expert.k1 * prompt
    times = [t]
    for g in range(1, length):
        t += expert.base + expert.k2 * (prompt + g)
        times.append(t)
    return times


def test_a_scraping_view_shows_the_engine_as_of_its_last_scrape() -> None:
    exact = env_with(EXPERT, [task(100, 100)], [0.0, 0.5, 1e6])
    scraped = env_with(EXPERT, [task(100, 100)], [0.0, 0.5, 1e6], scrape=0.2)
    for env in (exact, scraped):
        env.step(1)  # routed at 0; the next decision is at 0.5
    out_by = sum(1 for t in _token_times(100, 100) if t <= 0.4)  # the last scrape: 0.4
    out_now = sum(1 for t in _token_times(100, 100) if t <= 0.5)
    assert out_by < out_now

    (seen,) = cluster_view(scraped, 1)[1].backends
    assert seen.stats_age == pytest.approx(0.1)
    assert seen.running == 1 and seen.waiting == 0
    assert seen.kv_usage == pytest.approx((100 + out_by) / EXPERT.memory_tokens)
    assert [r.generated for r in seen.requests] == [out_by]

    (truth,) = cluster_view(exact, 1)[1].backends
    assert truth.stats_age == 0.0
    assert truth.kv_usage == pytest.approx((100 + out_now) / EXPERT.memory_tokens)
    assert [r.generated for r in truth.requests] == [out_now]


def test_a_scraping_view_credits_waiting_requests_as_the_gateway_does() -> None:
    # One request runs at a time: the gateway cannot tell which of its two in-flight
    # requests made the tokens, so each is credited half (`progress_share`).
    one_at_a_time = EdgeExpert(
        MODEL, base=0.01, k1=0.0001, k2=0.00001, memory_tokens=10_000, running_cap=1
    )
    env = env_with(one_at_a_time, [task(100, 100)], [0.0, 0.0, 0.5, 1e6], scrape=0.2)
    env.step(1)
    env.step(1)
    times = _token_times(100, 100, one_at_a_time)
    out_by = sum(1 for t in times if t <= 0.4)
    (seen,) = cluster_view(env, 2)[1].backends
    assert seen.running == 1 and seen.waiting == 1
    assert [r.generated for r in seen.requests] == [out_by // 2, out_by // 2]
    # The truth at 0.5: the first has all of its tokens, the second none.
    assert [r.generated for r in env.experts[0].running] == [sum(1 for t in times if t <= 0.5)]
    assert [r.generated for r in env.experts[0].waiting] == [0]


def test_the_view_reads_the_arrival_rate_the_gateway_would_count() -> None:
    """The simulator counts the arrivals as the gateway does (`Arrivals`) and observes
    the load from it, per expert: the policy under test never reads the episode's
    lambda, only what arrived."""
    times = [0.25 * i for i in range(400)]  # 4 per second for 100 s
    two = EdgeEnv(
        [EXPERT, EXPERT],
        [task()],
        arrivals=iter(Arrival(t) for t in times),
        predictor=NoisyOracle(1.0, 1.0),
        rate=1.0,  # not what arrives: the view must not read it
    )
    for _ in range(300):
        two.step(1)
    req, _ = cluster_view(two, two.decisions)
    assert req.now == times[300]
    assert req.arrival_rate == pytest.approx(4.0, rel=0.05)
    assert two.observe()["load"].tolist() == pytest.approx([req.arrival_rate / 2])


def test_a_scrape_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="scrape"):
        env_with(EXPERT, [task()], [0.0], scrape=0.0)


def test_the_live_engines_are_the_six_profiles_answering_as_their_own_models() -> None:
    assert engine_fleet() == [(p, PROFILES[p].data_model) for p in EXPERTS]


def test_more_live_engines_cycle_the_profiles_and_the_models() -> None:
    """Twelve engines answering as RouterDC's seven models: profile i mod 6, model i
    mod 7, so no two engines are alike; the simulator's experts are those engines."""
    fleet = engine_fleet(ROUTERDC_MODELS, 12)
    assert [p for p, _ in fleet] == list(EXPERTS) * 2
    assert [m for _, m in fleet] == [*ROUTERDC_MODELS, *ROUTERDC_MODELS[:5]]
    assert len(set(fleet)) == 12
    experts = engine_experts(ROUTERDC_MODELS, 12)
    for (profile, model), e in zip(fleet, experts, strict=True):
        assert (e.model, e.base, e.running_cap) == (
            model,
            PROFILES[profile].base,
            PROFILES[profile].max_batch,
        )


def test_a_fleet_built_in_code_is_held_to_the_range_rule() -> None:
    # the command line refuses such a range (`positive_range`), and so does the fleet
    with pytest.raises(ValueError, match="expected the experts' base ms per iteration low"):
        Fleet(hardware_ms=(40.0, 10.0))
    with pytest.raises(ValueError, match="above 0"):
        Fleet(hardware_ms=(0.0, 10.0))
    assert Fleet(hardware_ms=(25.0, 25.0)).hardware_ms == (25.0, 25.0)


def test_an_agent_trained_with_the_prior_reads_unmeasured_experts_at_the_mean() -> None:
    """`speed_prior`: an expert that has finished no request is observed at the mean
    seconds per token of those that have, and nothing else of the state changes."""
    fast = EdgeExpert(MODEL, base=0.01, k1=0.0001, k2=0.00001, memory_tokens=10_000)
    slow = EdgeExpert(MODEL, base=0.03, k1=0.0001, k2=0.00001, memory_tokens=10_000)
    times = [0.1 * i for i in range(1, 40)]

    def env(prior: bool) -> EdgeEnv:
        return EdgeEnv(
            [fast, slow, fast],
            [task(50, 5)],
            arrivals=[Arrival(t) for t in times],
            predictor=NoisyOracle(1.0, 1.0),
            speed_prior=prior,
        )

    plain, prior = env(False), env(True)
    for action in (1, 2, 1, 2, 1, 2):  # expert 3 is never sent anything
        plain.step(action)
        prior.step(action)
    seen, read = plain.observe(), prior.observe()
    column = 5  # seconds per token / L (`policies.qos_state.expert_columns`)
    measured = seen["experts"][:2, column]
    assert measured.min() > 0 and seen["experts"][2, column] == 0
    assert read["experts"][2, column] == pytest.approx(measured.mean())
    read["experts"][2, column] = 0.0
    for name, array in seen.items():
        np.testing.assert_array_equal(read[name], array)


class _Believes:
    """A predictor that says every model scores 0.3 with 50 tokens, whatever the truth."""

    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]:
        return 0.3, 50.0


def _poisson_env(seed: int = 3, **kw: Any) -> EdgeEnv:
    slow = EdgeExpert(MODEL, base=0.02, k1=0.0001, k2=0.00001, memory_tokens=10_000)
    tasks = [task(100, 20, score=0.8), task(60, 120, score=0.6)]
    return EdgeEnv([EXPERT, slow], tasks, rate=20.0, seed=seed, **kw)


def _in_flight(env: EdgeEnv) -> list[list[tuple[float, int, int]]]:
    return [
        [(r.arrival, r.prompt_tokens, r.generated) for r in (*e.running, *e.fresh, *e.waiting)]
        for e in env.experts
    ]


def test_a_fork_starts_where_the_episode_stands_with_copies_of_its_requests() -> None:
    env = _poisson_env()
    for i in range(12):
        env.step(1 + i % 2)
    twin = env.fork(7)
    assert twin.now == env.now and twin.task is env.task and twin.preds == env.preds
    assert _in_flight(twin) == _in_flight(env) and any(_in_flight(env))
    mine = {id(r) for e in env.experts for r in (*e.running, *e.fresh, *e.waiting)}
    assert not mine & {id(r) for e in twin.experts for r in (*e.running, *e.fresh, *e.waiting)}
    assert twin.finished == [] and twin.reward_kind == "completion"


def test_running_a_fork_leaves_the_episode_as_it_would_have_been() -> None:
    """Two episodes alike; one is forked and the fork run on and drained: both then go
    on to the same end, request for request."""
    a, b = _poisson_env(), _poisson_env()
    for i in range(10):
        a.step(1 + i % 2)
        b.step(1 + i % 2)
    twin = a.fork(5)
    for _ in range(30):
        twin.step(1)
    twin.drain()
    for i in range(20):
        a.step(2 - i % 2)
        b.step(2 - i % 2)
    a.drain()
    b.drain()
    assert [(r.arrival, r.done_at, r.score) for r in a.finished] == [
        (r.arrival, r.done_at, r.score) for r in b.finished
    ]


def test_a_forks_arrivals_are_drawn_from_its_seed_not_the_episodes_future() -> None:
    env = _poisson_env()
    env.step(1)

    def arrivals(twin: EdgeEnv) -> list[float]:
        times = []
        for _ in range(5):
            twin.step(1)
            times.append(twin.now)
        return times

    same, again, other = arrivals(env.fork(5)), arrivals(env.fork(5)), arrivals(env.fork(6))
    assert same == again and same != other
    assert all(t > env.now for t in same)
    own = []
    for _ in range(5):
        env.step(1)
        own.append(env.now)
    assert own != same


def test_a_believed_fork_knows_only_the_predicted_lengths_and_scores() -> None:
    env = _poisson_env(predictor=_Believes())
    for _ in range(4):
        env.step(1)
    plain, believed = env.fork(5), env.fork(5, believed=True)
    held = [r for e in believed.experts for r in (*e.running, *e.fresh, *e.waiting)]
    assert held and all(r.score == 0.3 and r.length == max(r.generated + 1, 50) for r in held)
    assert {r.length for e in plain.experts for r in e.running} <= {20, 120}
    believed.step(2)
    plain.step(2)
    assert believed.last_request is not None and plain.last_request is not None
    assert (believed.last_request.length, believed.last_request.score) == (50, 0.3)
    assert (plain.last_request.length, plain.last_request.score) in {(20, 0.8), (120, 0.6)}
    assert not env.believed  # the episode itself still holds the truth


def test_only_an_episode_of_poisson_arrivals_can_be_forked() -> None:
    env = env_with(EXPERT, [task()], [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="Poisson"):
        env.fork(1)
