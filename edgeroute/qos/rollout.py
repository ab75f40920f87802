"""A reference, not a contender: one rollout step of a policy on the simulator itself.

Rollout (Bertsekas' policy improvement by simulation) tries every expert for the
waiting arrival, follows the base policy for the next decisions in a copy of the
episode, and takes the expert whose copies fared best. It looks ahead with the
simulator's exact physics and the experts' exact state, which no router has; it never
reads the episode's own future (each copy draws its arrivals afresh, `EdgeEnv.fork`)
and, unless told the truth (`Lookahead(believed=False)`, `--truth`), not the requests'
real lengths and scores either, as a router with a perfect model of its engines could. It improves on
its base only as far as its copies value what matters: greedy or over a window that
ends, it can do worse (docs/research.md, (150)-(154)).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from edgeroute.qos.evaluate import Policy
from edgeroute.sim.edge import EdgeEnv, Req


@dataclass(frozen=True)
class Lookahead:
    """How a rollout looks ahead: how far, in how many copies, knowing what, and what
    it scores. Scored by the tried request alone (`own`) it is greedy; scored by every
    request a copy routes it needs several copies to see one decision's effect through
    the copies' noise (docs/research.md, (150)-(154))."""

    horizon: int = 64  # decisions each copy runs, the tried one first, then drained
    futures: int = 1  # copies per expert, each with its own arrivals (shared by the experts)
    # True: the copies know the requests' predicted lengths and scores only
    # (`EdgeEnv.fork`); False: their real ones, the truth, as a bound
    believed: bool = True
    # True: a copy is scored by the tried request's QoS alone (the others it routes only
    # make its contention); False: by that of every request it routes
    own: bool = False

    def __post_init__(self) -> None:
        if self.horizon < 1 or self.futures < 1:
            raise ValueError(f"a lookahead runs at least one decision in one copy, not {self}")


def copy_qos(env: EdgeEnv, base: Policy, first: int, start: int, lookahead: Lookahead) -> float:
    """The QoS (eq. 1, by the copy's scores) of the requests a copy routes from decision
    `start`: the first to expert `first - 1`, the rest as `base` does, `horizon` in all;
    the copy is then drained. Per request routed (a refused one counts 0), or the
    first one's alone (`own`)."""
    routed: list[Req | None] = []
    action = first
    for j in range(lookahead.horizon):
        env.step(action)
        routed.append(env.last_request)
        if j + 1 < lookahead.horizon:
            action = base(env, start + j + 1)
    env.drain()
    if lookahead.own:
        routed = routed[:1]
    return sum(env.qos(r) for r in routed if r is not None) / len(routed)


def rollout(base: Policy, lookahead: Lookahead = Lookahead()) -> Policy:
    """`base` improved by one rollout step: every expert tried in `lookahead.futures`
    copies of the episode, the best on the mean taken; the base's own choice unless
    another is strictly better (ties are common: a request that meets L nowhere scores
    0 everywhere). The copies' arrivals are seeded by the decision's instant, so each
    decision of an episode is the same however often it is run, and every expert meets
    the same futures (common random numbers)."""

    def act(env: EdgeEnv, i: int) -> int:
        seeds = [
            random.Random(f"{env.now!r}/{f}").getrandbits(64) for f in range(lookahead.futures)
        ]

        def value(action: int) -> float:
            return sum(
                copy_qos(env.fork(s, lookahead.believed), base, action, i, lookahead) for s in seeds
            )

        best = base(env, i)
        best_value = value(best)
        for action in range(1, env.n + 1):
            if action != best and (v := value(action)) > best_value:
                best, best_value = action, v
        return best

    return act
