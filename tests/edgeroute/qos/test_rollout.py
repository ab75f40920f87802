"""One rollout step of a policy on the simulator: it tries every expert in copies of the
episode, believes what the predictor says when told to, and leaves the episode alone."""

from __future__ import annotations

import random

import pytest

from edgeroute.qos.evaluate import Policy, Routed, episode
from edgeroute.qos.rollout import Lookahead, rollout
from edgeroute.sim.edge import EdgeEnv, EdgeExpert, Task

FAST = EdgeExpert("a", base=0.01, k1=0.0001, k2=0.00001, memory_tokens=10_000)
# its iteration alone takes longer than L = 30 ms per token: it never meets L
SLOW = EdgeExpert("b", base=0.05, k1=0.0001, k2=0.00001, memory_tokens=10_000)
EVEN = EdgeExpert("b", base=0.01, k1=0.0001, k2=0.00001, memory_tokens=10_000)
# b answers better than a, though the predictor says the opposite
TASK = Task("p", 100, {"a": 0.2, "b": 0.9}, {"a": 20, "b": 20})


class Misjudges:
    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]:
        return (0.9 if model == "a" else 0.2), 20.0


def _env(experts: list[EdgeExpert], seed: int = 1) -> EdgeEnv:
    return EdgeEnv(experts, [TASK], rate=4.0, seed=seed, episode_len=12, predictor=Misjudges())


def always(n: int) -> Policy:
    def act(env: EdgeEnv, i: int) -> int:
        return n

    return act


def _experts(routed: list[Routed]) -> set[int]:
    return {r.expert for r in routed}


def test_it_leaves_an_expert_that_cannot_meet_l_for_one_that_can() -> None:
    """A base that sends everything to the slow expert: rolled out, every request goes
    to the fast one, believed or not, scored by its own QoS or the copy's."""
    for look in (Lookahead(4, own=True), Lookahead(4), Lookahead(4, believed=False)):
        assert _experts(episode(_env([SLOW, FAST]), rollout(always(1), look), 1)) == {1}


def test_believed_it_follows_the_predictions_and_told_the_truth_it_follows_that() -> None:
    """Two experts as fast: the predictor says a answers better, the truth is b."""
    believed = episode(_env([FAST, EVEN]), rollout(always(1), Lookahead(2, own=True)), 1)
    assert _experts(believed) == {0}
    truth = Lookahead(2, own=True, believed=False)
    assert _experts(episode(_env([FAST, EVEN]), rollout(always(1), truth), 1)) == {1}


def test_where_nothing_is_better_it_keeps_the_bases_choice() -> None:
    """Both experts too slow for L = 1 ms: every copy scores 0, and the rollout goes
    where the base goes, not to the first expert."""
    env = EdgeEnv([SLOW, FAST], [TASK], rate=4.0, seed=1, episode_len=12, latency_req=0.001)
    assert _experts(episode(env, rollout(always(2), Lookahead(3, own=True)), 1)) == {1}


def test_looking_ahead_leaves_the_episode_as_it_was() -> None:
    """A policy that looks ahead at every decision but acts as its base ends where the
    base alone ends: the copies touch nothing of the episode, its generator included."""
    base = always(2)
    look = rollout(base, Lookahead(3))

    def peeks(env: EdgeEnv, i: int) -> int:
        look(env, i)
        return base(env, i)

    plain, peeked = _env([SLOW, FAST]), _env([SLOW, FAST])
    episode(plain, base, 1)
    episode(peeked, peeks, 1)
    assert [(r.arrival, r.done_at) for r in plain.finished] == [
        (r.arrival, r.done_at) for r in peeked.finished
    ]


def test_a_decision_is_the_same_however_often_it_is_run() -> None:
    look = rollout(always(1), Lookahead(3, futures=2))
    first = [r.expert for r in episode(_env([FAST, EVEN, SLOW]), look, 4)]
    assert first == [r.expert for r in episode(_env([FAST, EVEN, SLOW]), look, 4)]


def test_a_lookahead_runs_at_least_one_decision_in_one_copy() -> None:
    with pytest.raises(ValueError):
        Lookahead(0)
    with pytest.raises(ValueError):
        Lookahead(4, futures=0)
